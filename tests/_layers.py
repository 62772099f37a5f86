"""The suite's layers, as markers: `make test-fast` runs the in-process layer alone.

- in-process (no marker): the real libraries, stores and sandbox, in the test's own process;
- `process`: starts nanobot itself as a subprocess (`nanobot gateway`, `agent -m`, …), which
  costs its start-up each time;
- `postgres`: needs the PostgreSQL server (marked here, from the fixtures a test uses).

A test that starts nanobot without its `process` mark fails, saying so (`guard_processes`):
the fast layer stays what it says.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

PROCESS = "process"
POSTGRES = "postgres"


def mark(items: Sequence[pytest.Item], on_postgres: Callable[[pytest.Item], bool]) -> None:
    """Mark `postgres` every item `on_postgres(item)` says needs the server, and `process`
    every one that takes the `home` fixture (a nanobot installation for subprocesses)."""
    for item in items:
        if on_postgres(item):
            item.add_marker(POSTGRES)
        if "home" in getattr(item, "fixturenames", ()):
            item.add_marker(PROCESS)


def starts_nanobot(args: object) -> bool:
    """Whether a command line (as `subprocess.Popen` takes it) runs nanobot: its script,
    `python -m nanobot`, or `python -c` code that imports it."""
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)  # type: ignore[call-overload]
    words = [os.fsdecode(a) for a in argv]
    if not words:
        return False
    if Path(words[0]).name == "nanobot":
        return True
    if Path(words[0]).name.startswith("python") or words[0] == sys.executable:
        for flag, value in itertools.pairwise(words):
            if flag == "-m" and value.split(".")[0] == "nanobot":
                return True
            if flag == "-c" and "nanobot" in value:
                return True
    return False


@contextmanager
def guard_processes(test: str) -> Iterator[None]:
    """Within the block, starting nanobot as a process fails with a message naming `test`
    and the mark it lacks."""
    real = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **options: Any) -> None:
        if starts_nanobot(args):
            raise AssertionError(
                f"{test} starts nanobot as a process: mark it @pytest.mark.{PROCESS} "
                "(make test-fast leaves such tests out)"
            )
        real(self, args, *rest, **options)

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real  # type: ignore[method-assign]
