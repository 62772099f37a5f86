"""nanobot's per-turn operations priced one by one, without the profiler."""

from __future__ import annotations

import asyncio
import pstats
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from bench._turns.harness import Bench
from bench._turns.profiling import ncalls
from bench._turns.scenario import MESSAGE, MICRO_RUNS, MODEL
from nanobot import app
from nanobot.agent.context import ContextBuilder, time_envelope
from nanobot.providers.base import Completion, Usage
from nanobot.store import Database, NewEntry, SessionStore
from nanobot.tools.sandbox import Unconfined


def _median_us(fn: Callable[[], object], runs: int = MICRO_RUNS) -> float:
    values = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        values.append(time.perf_counter() - start)
    return statistics.median(values) * 1e6


async def _median_us_async(fn: Callable[[], Awaitable[object]], runs: int = MICRO_RUNS) -> float:
    values = []
    for _ in range(runs):
        start = time.perf_counter()
        await fn()
        values.append(time.perf_counter() - start)
    return statistics.median(values) * 1e6


@dataclass(frozen=True)
class Micro:
    operation: str
    us_per_call: float
    calls_per_turn: float

    @property
    def ms_per_turn(self) -> float:
        return self.us_per_call * self.calls_per_turn / 1000


async def measure_micro(b: Bench, profile: pstats.Stats, turns: int) -> list[Micro]:
    """nanobot's per-turn operations, priced one by one (no profiler); calls per plain turn
    from the profile."""
    config = b.stack.config
    # Only the tools' schemas are priced here: which sandbox exec would use does not matter.
    registry = app.build_tools(config, sandbox=Unconfined(config.workspace_path))
    context = ContextBuilder(config.workspace_path)
    context.system_prompt()
    provider = b.stack.provider.inner
    message = [{"role": "user", "content": f"[{time_envelope(datetime.now(UTC))}]\n{MESSAGE}"}]
    completion = Completion(f"echo: {MESSAGE}", (), "stop", Usage(900, 12), MODEL)

    def per_turn(path_end: str, name: str) -> float:
        return ncalls(profile, path_end, name) / turns

    round_trips = per_turn("nanobot/store/database.py", "submit")
    async with await Database.open(config.state_db_path) as db:
        select = await _median_us_async(lambda: db.fetchone("SELECT 1"))
        store = SessionStore(db)
        scratch = await store.live("bench:micro")
        entry = [NewEntry("message", {"role": "assistant", "content": f"echo: {MESSAGE}"})]
        append = await _median_us_async(lambda: store.append(scratch, entry))
    return [
        Micro(
            "ToolRegistry.schemas(): JSON schemas of the 8 tools (pydantic)",
            _median_us(registry.schemas),
            per_turn("nanobot/tools/registry.py", "schemas"),
        ),
        Micro(
            "SQLite statement via the store's thread (`SELECT 1` round trip)",
            select,
            round_trips,
        ),
        Micro(
            "SessionStore.append(1 entry): BEGIN IMMEDIATE, INSERT … RETURNING, COMMIT (one trip)",
            append,
            per_turn("nanobot/store/sessions.py", "_encode"),
        ),
        Micro(
            "Provider.count_tokens(1 message) (tiktoken)",
            _median_us(lambda: provider.count_tokens(message)),
            per_turn("nanobot/providers/provider.py", "count_tokens"),
        ),
        Micro(
            "Provider._priced: a call's cost from litellm's price list (unknown model: none)",
            _median_us(lambda: provider._priced(MODEL, completion)),
            per_turn("nanobot/providers/provider.py", "_priced"),
        ),
        Micro(
            "ContextBuilder.system_prompt(), files unchanged",
            _median_us(context.system_prompt),
            per_turn("nanobot/agent/context.py", "system_prompt"),
        ),
        Micro(
            "asyncio task created (create_task; ensure_future in Runner._race)",
            _median_us(lambda: asyncio.ensure_future(asyncio.sleep(0)).cancel()),
            per_turn("asyncio/base_events.py", "create_task"),
        ),
    ]
