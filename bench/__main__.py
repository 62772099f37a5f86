"""``python -m bench [NAME...]``: run the named benchmarks (default: all) in sequence."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import cast

import bench


def available() -> list[str]:
    """The benchmark modules of this package: every module whose name has no leading ``_``."""
    return sorted(
        info.name
        for info in pkgutil.iter_modules(bench.__path__)
        if not info.name.startswith("_") and not info.ispkg
    )


def main(argv: Sequence[str] | None = None) -> int:
    names = available()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"one of: {', '.join(names)}")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(names))
        return 0
    selected: list[str] = args.names or names
    unknown = [n for n in selected if n not in names]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)} (available: {', '.join(names)})")
    for index, name in enumerate(selected):
        if index:
            print()
        print(f"=== {name} ===", flush=True)
        started = time.monotonic()
        module = importlib.import_module(f"bench.{name}")
        cast(Callable[[], None], module.main)()
        print(f"({name}: {time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
