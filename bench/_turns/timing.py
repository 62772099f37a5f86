"""Timing one measured call until the tasks it started have finished; samples by round."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from bench._turns.scenario import PAUSE_S, SETTLE_LIMIT_S

T = TypeVar("T")


@dataclass(frozen=True)
class Timing:
    wall: float  # seconds until the call returned and the tasks it started finished
    returned: float  # seconds until the call returned
    cpu: float  # CPU seconds of this process (all its threads) over `wall`


CLOCKS = ("wall", "returned", "cpu")


def _settles(task: asyncio.Task[Any]) -> bool:
    """Whether a task started during a measured call is part of its cost.

    The in-process fake's connection handlers (aiohttp's web server) live as long as their
    connections.
    """
    code = getattr(task.get_coro(), "cr_code", None)
    filename = code.co_filename if code is not None else ""
    server = f"aiohttp{os.sep}web" in filename or f"tests{os.sep}fakes" in filename
    return not task.done() and not server


async def timed(work: Awaitable[T]) -> tuple[Timing, T]:
    before = asyncio.all_tasks()
    cpu = time.process_time()
    start = time.perf_counter()
    result = await work
    returned = time.perf_counter()
    started = [t for t in asyncio.all_tasks() - before if _settles(t)]
    if started:
        await asyncio.wait(started, timeout=SETTLE_LIMIT_S)
    end = time.perf_counter()
    cpu = time.process_time() - cpu
    await asyncio.sleep(PAUSE_S)
    return Timing(end - start, returned - start, cpu), result


class Samples:
    """Measured times in ms by clock and item name, in rounds: the lists of one phase are
    aligned (the n-th value of every item comes from the same round)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, list[float]]] = {c: defaultdict(list) for c in CLOCKS}

    def add(self, name: str, timing: Timing) -> None:
        for clock in CLOCKS:
            self.values[clock][name].append(getattr(timing, clock) * 1000)

    def ms(self, name: str, clock: str = "wall") -> list[float]:
        return self.values[clock][name]

    def merge(self, other: Samples) -> None:
        """Append `other`'s values (one round's) to this phase's."""
        for clock in CLOCKS:
            for name, values in other.values[clock].items():
                self.values[clock][name].extend(values)

    def median(self, name: str, clock: str = "wall") -> float:
        return statistics.median(self.values[clock][name])

    def summed(self, *names: str, clock: str = "wall") -> list[float]:
        """Per round, the sum of the named items."""
        columns = (self.values[clock][n] for n in names)
        return [sum(values) for values in zip(*columns, strict=True)]

    def as_json(self) -> dict[str, Any]:
        return {
            name: {
                **{f"median_{clock}_ms": self.median(name, clock) for clock in CLOCKS},
                **{f"{clock}_ms": self.ms(name, clock) for clock in CLOCKS},
            }
            for name in self.values["wall"]
        }
