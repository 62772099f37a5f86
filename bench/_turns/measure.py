"""The run: every phase in order, in one event loop, on one temporary data dir."""

from __future__ import annotations

import pstats
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench._turns.empty_sessions import ShortRequests, short_phase
from bench._turns.fake import LocalFake, ProcessFake
from bench._turns.harness import Bench, DirectBench, Request
from bench._turns.long_session import (
    LongInfo,
    alone_phase,
    cold_starts,
    first_long_turn,
    long_round,
)
from bench._turns.micro import Micro, measure_micro
from bench._turns.profiling import profile_bare, profile_turns
from bench._turns.scenario import (
    COLD_STARTS,
    DIRECT_ROUNDS,
    DIRECT_WARMUPS,
    LOCAL_ROUNDS,
    LOCAL_WARMUP_ROUNDS,
    LONG_ENTRIES,
    LONG_ROUNDS,
    LONG_WARMUPS,
    PROFILE_LONG_CALLS,
    PROFILE_LONG_TURNS,
    PROFILE_TURNS,
    ROUNDS,
    ROUTE_MODEL,
    SEED,
    WARMUP_ROUNDS,
)
from bench._turns.stack import bench_config, open_stack
from bench._turns.timing import Samples
from bench._turns.transcript import prefill
from tests.fakes.llm import FakeLLM


def _progress(text: str) -> None:
    sys.stdout.flush()
    print(text, file=sys.stderr, flush=True)


@dataclass
class Measurements:
    short: Samples
    short_requests: ShortRequests
    local: Samples
    long: Samples
    direct_long: Samples
    cold: Samples
    info: LongInfo
    profile: pstats.Stats
    profile_instant: pstats.Stats
    profile_long: pstats.Stats
    profile_long_bare: pstats.Stats
    micro: list[Micro]
    long_request: Request


async def measure() -> Measurements:
    rng = random.Random(SEED)
    info = LongInfo()
    long_key = "bench:long"
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-turn-") as tmp:
        # First, while the process is fresh: with the fake in this process, every object the
        # later phases leave alive (profiles, samples, caches) would slow its garbage
        # collections (measured: 3.2 ms of overhead at the end of the run, 2.1-2.3 fresh).
        _progress(
            f"empty sessions, fake in this process: {LOCAL_WARMUP_ROUNDS} warm-up + "
            f"{LOCAL_ROUNDS} rounds ..."
        )
        async with FakeLLM() as server:
            local_fake = LocalFake(server)
            config = bench_config(Path(tmp) / "data-local", local_fake.base_url)
            async with open_stack(config) as s:
                local, _ = await short_phase(
                    Bench(s, local_fake, "local"), LOCAL_WARMUP_ROUNDS, LOCAL_ROUNDS, rng
                )
        data_dir = Path(tmp) / "data"
        _progress(f"pre-filling a session with {LONG_ENTRIES:,} entries ...")
        info.prefill_s = await prefill(data_dir / "state.db", long_key, LONG_ENTRIES)
        async with (
            ProcessFake.running() as fake,
            open_stack(bench_config(data_dir, fake.base_url)) as s,
            open_stack(bench_config(data_dir, fake.base_url), instant=True) as instant,
            open_stack(bench_config(data_dir, fake.base_url, ROUTE_MODEL)) as routed,
            open_stack(bench_config(data_dir, fake.base_url, transport="auto")) as direct,
        ):
            variants = {
                "route": Bench(routed, fake, "route"),
                "direct": DirectBench(direct, fake, "direct"),
            }
            b = Bench(s, fake, "process", instant, variants)
            _progress(
                f"empty sessions, fake in its own process: {WARMUP_ROUNDS} warm-up + "
                f"{ROUNDS} rounds ..."
            )
            short, requests = await short_phase(b, WARMUP_ROUNDS, ROUNDS, rng)
            info.messages_empty = len(requests.plain.messages)
            info.bytes_empty = requests.plain.size

            _progress(f"10,000-entry session: first turn, then {LONG_ROUNDS} rounds ...")
            await first_long_turn(b, long_key, info)
            long = Samples()
            for index in range(LONG_WARMUPS + LONG_ROUNDS):
                sink = long if index >= LONG_WARMUPS else None
                await long_round(b, long_key, requests.plain, rng, samples=sink, info=info)
            _progress(
                f"10,000-entry session, transport: auto (direct) alone, then nanobot alone: "
                f"{DIRECT_WARMUPS} warm-up + {DIRECT_ROUNDS} rounds each ..."
            )
            direct_long = await alone_phase(variants["direct"], instant, long_key, rng, info)
            _progress(f"first turn after start-up: {COLD_STARTS} x 2 fresh stacks ...")
            cold = await cold_starts(b, long_key, rng)

            _progress("profiling ...")
            profile = await profile_turns(b, PROFILE_TURNS)
            profile_instant = await profile_turns(b, PROFILE_TURNS, stack=instant)
            profile_long = await profile_turns(b, PROFILE_LONG_TURNS, long_key)
            _, calls = await b.turn(long_key)
            long_request = calls[0]
            profile_long_bare = await profile_bare(b, long_request, PROFILE_LONG_CALLS)
            micro = await measure_micro(b, profile, PROFILE_TURNS)

    return Measurements(
        short=short,
        short_requests=requests,
        local=local,
        long=long,
        direct_long=direct_long,
        cold=cold,
        info=info,
        profile=profile,
        profile_instant=profile_instant,
        profile_long=profile_long,
        profile_long_bare=profile_long_bare,
        micro=micro,
        long_request=long_request,
    )
