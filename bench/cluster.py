"""Issue 17: a cluster of gateways on one PostgreSQL database.

``python -m bench cluster`` (all three phases, about 8 minutes on a quiet machine) or
``python -m bench.cluster [--phase burst|scale|failover ...] [--trials N] [--chats N]``
(one phase or more; failover trials; chats in a flood). Every gateway is a real
``nanobot gateway`` subprocess (tests/gateway_process.py) in an isolated environment; the
fakes run in processes of their own; PostgreSQL is the local server on 127.0.0.1:5432
(trust auth, user postgres), with a fresh database per cluster, dropped after it.

1. burst: `gateway_throughput`'s 1,000-chat burst (200 ms model, a tool call then the text,
   polling the fake Telegram of bench/_gateway.py), on one gateway with the state in SQLite
   and one with it on PostgreSQL, started together and used in turn (the order alternating
   per round): until the last of 1,000 chats is answered, and PostgreSQL ÷ SQLite per round.
2. scale: a CPU-bound flood, 5,000 chats writing at once to a model answering at 0 ms
   (transport auto, i.e. direct), taken in by 1, 2 and 3 members through the webhook, posted
   40 at a time and spread over the members in turn (bench/_cluster.py says why it is not
   the fake's one-at-a-time posting): messages answered per second (5,000 ÷ until the last
   reply), and the ratio to one member in the same round.
3. failover: three members; a chat's turn hangs at the model; after a random part of the
   lease renewal period, kill -9 of the member holding that session; time until the chat's
   answer arrives (another member takes the session once the lease lapses and resumes the
   turn; the model answers at once then). Target: at most the lease + 1 s.

What each phase records and the figures made of it are in bench/_cluster_figures.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import aiohttp
import asyncpg

from bench import gateway_throughput as g
from bench._cluster import (
    Member,
    database,
    postgres_cpu,
    start_members,
    stop_members,
    unreachable,
)
from bench._cluster_failover import Trial, failover_trial
from bench._cluster_figures import Flood, Measurements, metrics_of
from bench._common import (
    REPO_ROOT,
    BenchError,
    format_table,
    git_state,
    isolated_env,
    write_results,
)
from bench._gateway import Child, cpu_seconds
from bench._setup import (
    FINAL_TEXT,
    MODEL_DELAY_S,
    TOOL_CALL,
    WARMUP_CHATS,
    ZERO_MS_TEXT,
    Setup,
    gateway_config,
    run_burst,
    start_llm,
    start_telegram,
)
from tests.gateway_process import GatewayProcess

NAME = "cluster"
PHASES = ("burst", "scale", "failover")
PYTHON = sys.executable

BURST_ROUNDS = 3
BURST_TIMEOUT_S = 120.0
SETTLE_S = 2.0  # after a burst: the last confirmations and typing stops die down
FLOOD_CHATS, WARMUP_FLOOD = 5000, 100
SCALE_MEMBERS, SCALE_ROUNDS = (1, 2, 3), 2
FLOOD_TIMEOUT_S = 240.0
FAILOVER_TRIALS = 20


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _start_flood_telegram(tmp: Path, name: str) -> tuple[Child, str]:
    argv = [PYTHON, "-m", "bench._cluster", "telegram"]
    child = await Child.start(name, argv, isolated_env(tmp), REPO_ROOT, tmp / f"{name}.log")
    return child, str(json.loads(await child.line(60))["base_url"])


# ---- 1. the 1,000-chat burst, SQLite and PostgreSQL --------------------------------------


async def _polling_gateway(
    tmp: Path, name: str, llm: tuple[Child, str], store: str | None, children: list[Child]
) -> Setup:
    """As `gateway_throughput` starts its default gateway, the state on `store` if given."""
    root = tmp / f"gateway-{name}"
    root.mkdir()
    telegram, telegram_url = await start_telegram(tmp, f"telegram-{name}")
    children.append(telegram)
    config = gateway_config(root, llm[1], telegram_url, None, "auto")
    if store is not None:
        config["store"] = {"url": store}
    gateway = GatewayProcess(root, config, isolated_env(root))
    setup = Setup(name, gateway, telegram, llm[0])
    await gateway.start(ready="telegram connected")
    return setup


async def _burst_phase(m: Measurements, tmp: Path, children: list[Child]) -> None:
    _progress(f"burst: {g.BIG_CHATS} chats at once, SQLite and PostgreSQL, {BURST_ROUNDS} rounds")
    reply = {"type": "ToolThenText", "call": TOOL_CALL, "text": FINAL_TEXT}
    llm = await start_llm(tmp, "model-200ms", MODEL_DELAY_S, reply, keep_requests=100)
    children.append(llm[0])
    setups: list[Setup] = []
    try:
        async with database() as url:
            setups.append(await _polling_gateway(tmp, "sqlite", llm, None, children))
            setups.append(await _polling_gateway(tmp, "postgresql", llm, url, children))
            for setup in setups:
                await run_burst(setup, WARMUP_CHATS)
            await asyncio.sleep(SETTLE_S)
            for round_ in range(BURST_ROUNDS):
                for setup in setups if round_ % 2 == 0 else setups[::-1]:
                    before = postgres_cpu()
                    burst = await run_burst(setup, g.BIG_CHATS, seconds=BURST_TIMEOUT_S)
                    m.postgres_cpu_s.setdefault(setup.name, []).append(postgres_cpu() - before)
                    m.bursts.setdefault(setup.name, []).append(burst)
                    _progress(
                        f"  {setup.name}: all answered in {burst.wall:.2f} s, gateway CPU "
                        f"{burst.cpu_s['gateway']:.1f} s, PostgreSQL CPU "
                        f"{m.postgres_cpu_s[setup.name][-1]:.1f} s"
                    )
                    await asyncio.sleep(SETTLE_S)
            for setup in setups:
                await setup.gateway.stop()
    finally:
        for setup in setups:
            if setup.gateway.process is not None and setup.gateway.process.returncode is None:
                await setup.gateway.kill()


# ---- 2. scaling: a CPU-bound flood on 1, 2 and 3 members ---------------------------------


async def _flood(
    telegram: Child, members: Sequence[Member], llm: Child, first: int, chats: int
) -> Flood:
    pids = {f"member {i}": member.pid for i, member in enumerate(members)}
    pids |= {"telegram": telegram.pid, "model": llm.pid}
    before = {k: cpu_seconds(p) for k, p in pids.items()} | {"postgresql": postgres_cpu()}
    command = {
        "op": "flood",
        "chats": list(range(first, first + chats)),
        "text": "Hello?",
        "final": ZERO_MS_TEXT,
        "timeout": FLOOD_TIMEOUT_S,
    }
    answer = await telegram.ask(command, FLOOD_TIMEOUT_S + 30)
    after = {k: cpu_seconds(p) for k, p in pids.items()} | {"postgresql": postgres_cpu()}
    if not answer["complete"] or answer["verified"] != chats:
        raise BenchError(
            f"{len(members)} members: {len(answer['final'])} of {chats} chats answered in "
            f"{FLOOD_TIMEOUT_S:g} s ({answer['verified']} show it); calls {answer['api_calls']}"
        )
    start = float(answer["injected_at"])
    final = sorted(float(t) - start for t in answer["final"].values())
    cut = statistics.quantiles(final, n=10)
    acked = answer["acked_at"]
    return Flood(
        members=len(members),
        chats=chats,
        last_s=final[-1],
        p10_s=cut[0],
        p50_s=statistics.median(final),
        p90_s=cut[-1],
        acked_s=None if acked is None else float(acked) - start,
        refused_posts=int(answer["refused_posts"]),
        api_calls=dict(answer["api_calls"]),
        cpu_s={k: after[k] - before[k] for k in before},
    )


async def _held(url: str) -> list[int]:
    """How many sessions each member holds a lease on, most first."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT count(*) FROM leases WHERE name LIKE 'session:%'"
            " AND expires_at > '1970-01-02' GROUP BY holder"  # not released
        )
    finally:
        await conn.close()
    return sorted((int(r[0]) for r in rows), reverse=True)


async def _scale_phase(m: Measurements, tmp: Path, children: list[Child]) -> None:
    _progress(
        f"scale: {m.flood_chats} chats at once, 0 ms model, members {SCALE_MEMBERS}, "
        f"{SCALE_ROUNDS} rounds"
    )
    llm, llm_url = await start_llm(
        tmp, "model-0ms", 0.0, {"type": "Text", "content": ZERO_MS_TEXT}, keep_requests=100
    )
    children.append(llm)
    next_chat = 2_000_000
    for round_ in range(SCALE_ROUNDS):
        order = SCALE_MEMBERS if round_ % 2 == 0 else SCALE_MEMBERS[::-1]
        for n in order:
            name = f"scale-{round_}-{n}"
            telegram, telegram_url = await _start_flood_telegram(tmp, f"telegram-{name}")
            members: list[Member] = []
            try:
                async with database() as url:
                    members = [
                        Member(tmp / name / f"member{i}", llm_url, telegram_url, url)
                        for i in range(n)
                    ]
                    await start_members(members)
                    await telegram.ask({"op": "targets", "urls": [x.url for x in members]}, 10)
                    await _flood(telegram, members, llm, next_chat, WARMUP_FLOOD)
                    next_chat += WARMUP_FLOOD
                    await asyncio.sleep(SETTLE_S)
                    flood = await _flood(telegram, members, llm, next_chat, m.flood_chats)
                    flood = replace(flood, held=await _held(url))
                    next_chat += m.flood_chats
                    m.floods.setdefault(n, []).append(flood)
                    m.load.setdefault(f"scale {n}", []).append(os.getloadavg()[0])
                    _progress(
                        f"  {n} member(s): {flood.rate:.0f} answers/s (all in "
                        f"{flood.last_s:.1f} s, posts acked after {flood.acked_s:.1f} s; sessions "
                        f"held {flood.held}); CPU "
                        + ", ".join(f"{k} {v:.1f}" for k, v in flood.cpu_s.items())
                    )
                    await stop_members(members)
            finally:
                await stop_members(members)
                await telegram.stop()


# ---- 3. failover: kill -9 of the member holding a busy session ---------------------------


async def _failover_phase(m: Measurements, tmp: Path, children: list[Child]) -> None:
    _progress(f"failover: 3 members, {m.trials} kills of a busy session's holder")
    llm, llm_url = await start_llm(
        tmp, "model-failover", 0.0, {"type": "Text", "content": ZERO_MS_TEXT}, keep_requests=100
    )
    children.append(llm)
    telegram, telegram_url = await _start_flood_telegram(tmp, "telegram-failover")
    children.append(telegram)
    members: list[Member] = []
    try:
        async with database() as url, aiohttp.ClientSession() as http:
            members = [
                Member(tmp / "failover" / f"member{i}", llm_url, telegram_url, url)
                for i in range(3)
            ]
            await start_members(members)
            await telegram.ask({"op": "targets", "urls": [x.url for x in members]}, 10)
            await _flood(telegram, members, llm, 3_000_000, 30)  # warm-up
            for trial in range(m.trials):
                result = await failover_trial(
                    Trial(telegram, members, http, llm_url, url), 3_100_000 + trial
                )
                m.failovers.append(result)
                _progress(
                    f"  trial {trial + 1}: answered {result.killed_s:.2f} s after the kill "
                    f"(the lease ran out after {result.lapse_s:.2f} s)"
                )
            m.load["failover"] = [os.getloadavg()[0]]
    finally:
        await stop_members(members)


async def measure(phases: Sequence[str], trials: int, chats: int) -> Measurements:
    m = Measurements(flood_chats=chats, trials=trials)
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-cluster-") as name:
        tmp = Path(name)
        children: list[Child] = []
        try:
            for phase in phases:
                m.load[f"before {phase}"] = list(os.getloadavg())
                run = {"burst": _burst_phase, "scale": _scale_phase, "failover": _failover_phase}
                await run[phase](m, tmp, children)
        finally:
            for child in children:
                await child.stop()
    return m


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__)
    parser.add_argument("--phase", action="append", choices=PHASES, help="default: all")
    parser.add_argument("--trials", type=int, default=FAILOVER_TRIALS, help="failover trials")
    parser.add_argument("--chats", type=int, default=FLOOD_CHATS, help="chats in a flood")
    args = parser.parse_args([] if argv is None else argv)
    phases: list[str] = args.phase or list(PHASES)
    if (why := asyncio.run(unreachable())) is not None:
        print(f"skipped: {why}")  # `python -m bench` goes on with the other benchmarks
        return
    m = asyncio.run(measure(phases, args.trials, args.chats))
    metrics = metrics_of(m)
    print(format_table(metrics))
    print(f"load average (1 min) per phase: {m.load}")
    payload = {
        "phases": phases,
        "metrics": [x.as_json() for x in metrics],
        "bursts": {k: [asdict(b) | {"timeline": []} for b in v] for k, v in m.bursts.items()},
        "floods": {str(k): [asdict(f) for f in v] for k, v in m.floods.items()},
        "failovers": [asdict(f) for f in m.failovers],
        "load": m.load,
        "git": git_state(),
    }
    path = write_results(NAME if phases == list(PHASES) else f"{NAME}-{'-'.join(phases)}", payload)
    print(f"\nResults: {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
