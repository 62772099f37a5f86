"""The parts of `bench/turn_overhead.py`, one module each (see its docstring)."""
