"""nanobot's benchmarks: speed targets measured by scripts, never asserted by tests.

Each benchmark is a module of this package (not starting with ``_``) with a ``main()`` that
prints a table on stdout and writes ``bench/results/<name>.json``. Run them all with
``make bench`` (``python -m bench``) or some of them with ``python -m bench <name>...``.
Results are recorded in ``docs/benchmarks.md``.
"""
