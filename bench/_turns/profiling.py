"""cProfile of turns and bare calls, and where their time goes (by package, by function)."""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
from collections import defaultdict
from pathlib import Path
from typing import cast

import nanobot
from bench._common import REPO_ROOT
from bench._turns.harness import Bench, Request, check_reply
from bench._turns.scenario import ATTRIBUTION_ROUNDS, MESSAGE, PAUSE_S
from bench._turns.stack import Stack
from nanobot.agent.turn import TurnRequest

Func = tuple[str, int, str]  # a function in a profile: file, line, name
RawStats = dict[Func, tuple[int, int, float, float, dict[Func, tuple[int, int, float, float]]]]

_NANOBOT_DIR = str(Path(nanobot.__file__).resolve().parent) + os.sep
_BENCH_DIRS = (str(REPO_ROOT / "bench") + os.sep, str(REPO_ROOT / "tests") + os.sep)
HTTP = "HTTP client (httpx over aiohttp)"
_OWNERS = (
    ("litellm", "litellm"),
    ("openai", "openai SDK"),
    *(
        (package, HTTP)
        for package in ("httpx", "httpcore", "anyio", "h11", "aiohttp", "yarl", "multidict")
    ),
)
IDLE = "idle: event loop waiting (fake server, SQLite thread)"
LOOP = "asyncio event loop"


def _owner(func: Func) -> str | None:
    """Who a function's own time belongs to; None for shared code (pydantic, the standard
    library, builtins), whose time goes to its callers' owners."""
    path, _, name = func
    if name == "<method 'poll' of 'select.epoll' objects>":
        return IDLE
    if path.startswith(_NANOBOT_DIR):
        return "nanobot"
    if path.startswith(_BENCH_DIRS):
        return "benchmark harness"
    for package, owner in _OWNERS:
        if f"{os.sep}site-packages{os.sep}{package}{os.sep}" in path:
            return owner
    if path.endswith((f"asyncio{os.sep}base_events.py", f"asyncio{os.sep}events.py")):
        return LOOP
    return None


def _raw(stats: pstats.Stats) -> RawStats:
    return cast(RawStats, vars(stats)["stats"])


def attribute(stats: pstats.Stats) -> dict[str, float]:
    """Seconds of the profile by owner.

    Shared code's own time is split among its callers in proportion to the time it spent for
    each, up the call graph to the nearest owner: the share of each owner in a shared function
    solves shares(f) = sum of weight(f, caller) * shares(caller), by Gauss-Seidel iteration
    (call graphs have cycles: recursion). What reaches no owner is "other".
    """
    raw = _raw(stats)
    weights: dict[Func, list[tuple[Func, float]]] = {}
    for func, (*_, callers) in raw.items():
        if _owner(func) is not None:
            continue
        known = {c: v for c, v in callers.items() if c in raw}
        by_time = sum(v[2] for v in known.values()) > 0  # else by number of calls
        total = sum(v[2] if by_time else v[1] for v in known.values())
        weights[func] = [(c, (v[2] if by_time else v[1]) / total) for c, v in known.items()]
    shares: dict[Func, dict[str, float]] = {func: {} for func in weights}

    def of(func: Func) -> dict[str, float]:
        owner = _owner(func)
        return {owner: 1.0} if owner is not None else shares[func]

    for _ in range(ATTRIBUTION_ROUNDS):
        change = 0.0
        for func, edges in weights.items():
            mixed: dict[str, float] = defaultdict(float)
            for caller, weight in edges:
                for owner, share in of(caller).items():
                    mixed[owner] += weight * share
            change += abs(sum(mixed.values()) - sum(shares[func].values()))
            shares[func] = mixed
        if change < 1e-9:
            break
    totals: dict[str, float] = defaultdict(float)
    for func, (_, _, tottime, _, _) in raw.items():
        found = of(func)
        for owner, share in found.items():
            totals[owner] += tottime * share
        totals["other"] += tottime * max(0.0, 1.0 - sum(found.values()))
    return dict(totals)


def _label(func: Func) -> str:
    path, line, name = func
    if path.startswith(_NANOBOT_DIR):
        path = path[len(_NANOBOT_DIR) :]
    return f"{path}:{line} {name}"


def nanobot_top(stats: pstats.Stats, count: int) -> list[tuple[str, float]]:
    """nanobot's functions by cumulative time (seconds), without those around the model call
    (Provider.complete and what it awaits), whose time is mostly litellm's."""
    raw = _raw(stats)
    callees: dict[Func, set[Func]] = defaultdict(set)
    for func, (*_, callers) in raw.items():
        for caller in callers:
            callees[caller].add(func)
    litellm_entry = {f for f in raw if _owner(f) == "litellm" and f[2] == "acompletion"}

    def calls_model(func: Func) -> bool:
        seen, todo = {func}, [func]
        while todo:
            for callee in callees[todo.pop()]:
                if callee in litellm_entry:
                    return True
                if callee not in seen:
                    seen.add(callee)
                    todo.append(callee)
        return False

    rows = [
        (_label(func), values[3])
        for func, values in raw.items()
        if _owner(func) == "nanobot" and not calls_model(func)
    ]
    return sorted(rows, key=lambda row: -row[1])[:count]


def ncalls(stats: pstats.Stats, path_end: str, name: str) -> int:
    """Calls of a (synchronous) function; for coroutines cProfile counts every resumption."""
    return sum(
        values[1]
        for (path, _, func), values in _raw(stats).items()
        if func == name and path.endswith(path_end)
    )


def cumulative(stats: pstats.Stats, path_end: str, name: str) -> float:
    return sum(
        values[3]
        for (path, _, func), values in _raw(stats).items()
        if func == name and path.endswith(path_end)
    )


async def profile_turns(
    b: Bench, turns: int, key: str | None = None, stack: Stack | None = None
) -> pstats.Stats:
    """cProfile around `turns` turns (only the turns themselves are profiled)."""
    stack = stack or b.stack
    profile = cProfile.Profile()
    for _ in range(turns):
        request = TurnRequest(key or b.key(), MESSAGE)
        profile.enable()
        reply = await stack.loop.handle(request)
        profile.disable()
        check_reply(reply, MESSAGE, tool_call=False)
        del stack.provider.calls[:]
        await asyncio.sleep(PAUSE_S)
    return pstats.Stats(profile)


async def profile_bare(b: Bench, request: Request, calls: int) -> pstats.Stats:
    """cProfile around `calls` bare litellm calls (their background tasks run unprofiled)."""
    profile = cProfile.Profile()
    for _ in range(calls):
        profile.enable()
        await b.bare_call(request)
        profile.disable()
        await asyncio.sleep(0.01)
    return pstats.Stats(profile)
