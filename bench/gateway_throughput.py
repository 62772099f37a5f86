"""Issue 4, gateway: concurrent chats, a burst of 1,000 chats, one message's latency.

The real ``nanobot gateway`` runs as a subprocess (as tests/gateway_process.py starts it,
in an isolated environment and a temporary data dir), polling a fake Telegram and calling a
fake model, each fake in a process of its own so that neither runs in this event loop:

- the fake model (``python -m tests.fakes.llm``): 200 ms before the first byte of every
  answer; each chat's first call gets a ``list_dir {"path": "."}`` tool call, the call after
  the tool result gets the text (``ToolThenText``), so every message is two model calls and
  one real tool run. A second fake answers text at once (the "0 ms model").
- the fake Telegram (``python -m bench._gateway telegram``, one per gateway): injects the
  messages and times the replies next to the fake (see bench/_gateway.py). A reply is
  delivered when the Bot API request that makes its chat show the final text arrives.

Gateways, all started first and kept running (start-up is not measured; each has a warm-up
burst), on the 200 ms model: the defaults (``max_concurrent_turns`` 1,000, ``agent.transport:
auto``, which calls this model directly: litellm would send the same request); the defaults
with ``transport: litellm``; one chat at a time (``max_concurrent_turns: 1``, like the
original nanobot); the defaults with 32 turns (the default before). On the 0 ms model: the
defaults, and with ``transport: litellm``. A bare python-telegram-bot echo bot
(bench/_gateway.py) is the baseline of the latency figure.

1. 20 chats write at once (fresh chats every round): time from queuing the 20 messages to
   the last final reply; the three 20-chat configurations interleaved, rotating their order.
2. 1,000 chats write at once, for the defaults, litellm and 32 turns: how many are
   answered within 3 s and within BIG_CAP_S (after which the gateway is killed: a whole
   burst takes long; the litellm gateway is watched until all are answered, up to
   BIG_LITELLM_CAP_S, and when the median and the last chat were answered is its figure),
   the gateway's CPU per answered chat, and its RSS (VmRSS sampled every 50 ms: peak minus
   the value before). Last, after the other figures, so the other gateways are stopped.
3. One message at a time in one chat, 0 ms model: time to the first bot message and to the
   final text, against the echo bot, in interleaved blocks.

CPU seconds used by the gateway and by each fake during every burst are recorded too (from
/proc): on 2 cores they tell whether the gateway or a fake was the limit.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench._common import Metric, format_table, git_state, write_results
from bench._gateway import Child
from bench._setup import (
    BURST_CHATS,
    FINAL_TEXT,
    MODEL_DELAY_S,
    TOOL_CALL,
    WARMUP_CHATS,
    ZERO_MS_TEXT,
    Burst,
    Setup,
    run_burst,
    run_sequence,
    start_echo_bot,
    start_gateway,
    start_llm,
    start_telegram,
)
from tests.gateway_process import GatewayProcess

NAME = "gateway_throughput"

BURST_TARGET_S = 0.8
BURST_ROUNDS = 5
BIG_CHATS, BIG_TARGET_S, BIG_RSS_TARGET_MIB = 1000, 3.0, 50.0
# A burst of 1,000 takes minutes on 2 cores (one-off runs: docs/benchmarks.md); the
# benchmark stops looking after BIG_CAP_S and kills that gateway. Raise it to see them end.
BIG_CAP_S = 20.0
# Except the litellm gateway's: its turns are CPU-bound (~20-70 ms of CPU per chat), so all
# 1,000 are in flight together and finish together, in one clump near the end (issue 14 in
# docs/benchmarks.md); a count at a fixed cap just before or after that clump swings by
# hundreds of chats between runs. It is watched until every chat is answered (up to
# BIG_LITELLM_CAP_S): when the last and the median chat got their answer is the figure.
BIG_LITELLM_CAP_S = 180.0
LATENCY_BLOCKS, LATENCY_BLOCK = 6, 5  # 30 messages per bot, in interleaved blocks of 5
LATENCY_WARMUPS = 3
LATENCY_PAUSE_S = 0.1
LATENCY_CHAT = 42
SETTLE_S = 0.5  # after a burst, before the next one: the gateway confirms, typing stops

# Gateways: name -> (max_concurrent_turns, None for the default; agent.transport).
DEFAULT = "default"  # AgentConfig's defaults: 1,000 turns, transport auto (direct here)
LITELLM = "default, litellm"  # the defaults but agent.transport: litellm
ONE = "1"  # one chat at a time, like the original nanobot
THIRTY_TWO = "32"  # the default turn limit before
ZERO = "0 ms model"
ZERO_LITELLM = "0 ms model, litellm"
CONFIGS: dict[str, tuple[int | None, str]] = {
    DEFAULT: (None, "auto"),
    LITELLM: (None, "litellm"),
    ONE: (1, "auto"),
    THIRTY_TWO: (32, "auto"),
}
ZERO_CONFIGS: dict[str, tuple[int | None, str]] = {
    ZERO: (None, "auto"),
    ZERO_LITELLM: (None, "litellm"),
}
BURST_CONFIGS = (DEFAULT, LITELLM, ONE)
BIG_CONFIGS = (DEFAULT, LITELLM, THIRTY_TWO)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Measurements:
    bursts: dict[str, list[Burst]] = field(default_factory=dict)
    big: dict[str, Burst] = field(default_factory=dict)
    # per 0 ms gateway, per block: to its first message, to the final text
    first_s: dict[str, list[list[float]]] = field(default_factory=dict)
    final_s: dict[str, list[list[float]]] = field(default_factory=dict)
    echo_s: list[list[float]] = field(default_factory=list)
    start_up_s: float = 0.0


async def _bursts(m: Measurements, setups: dict[str, Setup]) -> None:
    _progress(f"  warm-up: a burst of {WARMUP_CHATS} chats per gateway")
    for setup in setups.values():
        if setup.name not in ZERO_CONFIGS:
            await run_burst(setup, WARMUP_CHATS)
            await asyncio.sleep(SETTLE_S)
    _progress(
        f"  {BURST_CHATS} chats at once, {BURST_ROUNDS} rounds of max_concurrent_turns "
        f"{', '.join(BURST_CONFIGS)} (interleaved, order rotating)"
    )
    for round_ in range(BURST_ROUNDS):
        shift = round_ % len(BURST_CONFIGS)
        for config in BURST_CONFIGS[shift:] + BURST_CONFIGS[:shift]:
            burst = await run_burst(setups[config], BURST_CHATS)
            m.bursts.setdefault(config, []).append(burst)
            _progress(f"    {config}: {burst.wall:.3f} s")
            await asyncio.sleep(SETTLE_S)


async def _latency(m: Measurements, gateways: dict[str, Child], echo: Child) -> None:
    _progress(
        f"  one message at a time: {LATENCY_WARMUPS} warm-ups, then {LATENCY_BLOCKS} "
        f"interleaved blocks of {LATENCY_BLOCK} messages per bot"
    )
    sequence = partial(run_sequence, chat=LATENCY_CHAT, pause=LATENCY_PAUSE_S)
    texts = (f"ping {i}" for i in itertools.count())
    warm = [next(texts) for _ in range(LATENCY_WARMUPS)]
    for gateway in gateways.values():
        await sequence(gateway, warm, ZERO_MS_TEXT)
    await sequence(echo, warm, None)
    for _ in range(LATENCY_BLOCKS):
        block = [next(texts) for _ in range(LATENCY_BLOCK)]
        for name, gateway in gateways.items():
            first, final = await sequence(gateway, block, ZERO_MS_TEXT)
            m.first_s.setdefault(name, []).append(first)
            m.final_s.setdefault(name, []).append(final)
        m.echo_s.append((await sequence(echo, block, None))[1])


def big_cap(config: str) -> float:
    """How long the 1,000-chat burst of `config` is watched at most."""
    return BIG_LITELLM_CAP_S if config == LITELLM else BIG_CAP_S


async def _big(m: Measurements, setups: dict[str, Setup]) -> None:
    _progress(
        f"  {BIG_CHATS} chats at once, max_concurrent_turns {', '.join(BIG_CONFIGS)}: "
        f"watched for at most {BIG_CAP_S:g} s each ({LITELLM}: {BIG_LITELLM_CAP_S:g} s), "
        "then that gateway is killed"
    )
    for config in BIG_CONFIGS:
        setup = setups[config]
        burst = await run_burst(setup, BIG_CHATS, seconds=big_cap(config), cap=True)
        await setup.gateway.kill()  # what it still owes would disturb the next one
        m.big[config] = burst
        _progress(
            f"    {config}: {burst.answered_by(BIG_TARGET_S)} answered in {BIG_TARGET_S:g} s, "
            f"{len(burst.final_s)} in {burst.looked_s:.1f} s; RSS "
            f"+{burst.rss_growth_mib:.1f} MiB"
        )


async def measure() -> Measurements:
    m = Measurements()
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-gateway-") as name:
        tmp = Path(name)
        children: list[Child] = []
        gateways: list[GatewayProcess] = []
        try:
            _progress("  starting the fakes, 6 gateways and the echo bot")
            started = time.monotonic()
            tool_then_text = {"type": "ToolThenText", "call": TOOL_CALL, "text": FINAL_TEXT}
            llm = await start_llm(tmp, "model-200ms", MODEL_DELAY_S, tool_then_text)
            children.append(llm[0])
            zero_text = {"type": "Text", "content": ZERO_MS_TEXT}
            llm0 = await start_llm(tmp, "model-0ms", 0.0, zero_text)
            children.append(llm0[0])
            echo_telegram, echo_url = await start_telegram(tmp, "telegram-echo")
            children.append(echo_telegram)
            echo = await start_echo_bot(tmp, echo_url)
            children.append(echo)
            starting = [start_gateway(tmp, n, llm, c, children) for n, c in CONFIGS.items()]
            starting += [start_gateway(tmp, n, llm0, c, children) for n, c in ZERO_CONFIGS.items()]
            setups = {s.name: s for s in await asyncio.gather(*starting)}
            gateways.extend(s.gateway for s in setups.values())
            await echo.line(60)
            m.start_up_s = time.monotonic() - started

            await _bursts(m, setups)
            zero = {name: setups[name].telegram for name in ZERO_CONFIGS}
            await _latency(m, zero, echo_telegram)
            idle = [s.gateway.stop() for s in setups.values() if s.name not in BIG_CONFIGS]
            await asyncio.gather(echo.stop(), *idle)  # not needed any more
            await _big(m, setups)
        finally:
            for gateway in gateways:
                if gateway.process is not None and gateway.process.returncode is None:
                    await gateway.kill()
            for child in children:
                await child.stop()
    return m


def _per_block(values: list[list[float]], base: list[list[float]]) -> list[float]:
    med = statistics.median
    return [med(v) / med(b) for v, b in zip(values, base, strict=True)]


def _flat(blocks: list[list[float]], scale: float = 1.0) -> list[float]:
    return [v * scale for block in blocks for v in block]


def metrics_of(m: Measurements) -> list[Metric]:
    med = statistics.median
    out: list[Metric] = []
    for config in BURST_CONFIGS:
        bursts = m.bursts[config]
        target = BURST_TARGET_S if config != ONE else None
        label = f"{BURST_CHATS} chats, turns {config}"
        out += [
            Metric(f"{label}: all final", "s", [b.wall for b in bursts], target=target),
            Metric(f"{label}: median chat final", "s", [med(b.final_s) for b in bursts]),
            Metric(f"{label}: last 1st message", "s", [max(b.first_s) for b in bursts]),
            Metric(f"{label}: gateway CPU", "s", [b.cpu_s["gateway"] for b in bursts]),
        ]
    default, one = m.bursts[DEFAULT], m.bursts[ONE]
    for config in (DEFAULT, LITELLM):
        out.append(
            Metric(
                f"{BURST_CHATS} chats: turns 1 / turns {config}",
                "x",
                [a.wall / b.wall for a, b in zip(one, m.bursts[config], strict=True)],
                note="per interleaved round",
            )
        )
    out.append(
        Metric(
            f"{BURST_CHATS} chats, turns {DEFAULT}: all taken (acked)",
            "s",
            [b.taken_s for b in default if b.taken_s is not None],
        )
    )
    for config, burst in m.big.items():
        label = f"{BIG_CHATS} chats, turns {config}"
        late = BIG_CHATS - burst.answered_by(BIG_TARGET_S)
        out += [
            Metric(f"{label}: not answered in {BIG_TARGET_S:g} s", "chats", [late], target=0),
            Metric(
                f"{label}: answered in {burst.looked_s:.1f} s",
                "chats",
                [len(burst.final_s)],
                note="the cap" if not burst.complete else "all",
            ),
            Metric(f"{label}: RSS growth", "MiB", [burst.rss_growth_mib], BIG_RSS_TARGET_MIB),
            Metric(f"{label}: gateway CPU", "s", [burst.cpu_s["gateway"]]),
            Metric(
                f"{label}: gateway CPU per answered chat",
                "ms",
                [1000 * burst.cpu_s["gateway"] / max(1, len(burst.final_s))],
                note="of the whole burst" if burst.complete else "chats in hand count too",
            ),
            Metric(
                f"{label}: sendChatAction calls",
                "calls",
                [burst.api_calls.get("sendChatAction", 0)],
            ),
        ]
        if burst.complete:
            out += [
                Metric(f"{label}: median chat answered", "s", [statistics.median(burst.final_s)]),
                Metric(f"{label}: all answered", "s", [burst.wall]),
            ]
        if burst.taken_s is not None:
            out.append(Metric(f"{label}: all taken (acked)", "s", [burst.taken_s]))
    out.append(Metric("echo bot (PTB): to reply", "ms", _flat(m.echo_s, 1000)))
    for name in ZERO_CONFIGS:
        first, final = m.first_s[name], m.final_s[name]
        out += [
            Metric(f"{name}, gateway: to 1st message", "ms", _flat(first, 1000)),
            Metric(f"{name}, gateway: to final text", "ms", _flat(final, 1000)),
            Metric(
                f"{name}: gateway final / echo bot",
                "x",
                _per_block(final, m.echo_s),
                note="per interleaved block",
            ),
            Metric(
                f"{name}: gateway 1st message / echo bot",
                "x",
                _per_block(first, m.echo_s),
                note="per interleaved block",
            ),
        ]
    return out


def _timeline(burst: Burst) -> str:
    """The bot's sends and edits of one burst, as "+t method×n" runs."""
    runs: list[tuple[float, str, int]] = []
    for at, method, _ in burst.timeline:
        short = "send" if method.lower() == "sendmessage" else "edit"
        if runs and runs[-1][1] == short:
            runs[-1] = (runs[-1][0], short, runs[-1][2] + 1)
        else:
            runs.append((at, short, 1))
    return ", ".join(f"{at:.2f} s {method}×{n}" for at, method, n in runs)


def report(m: Measurements, metrics: Sequence[Metric]) -> dict[str, Any]:
    """Print the table and what explains it; return everything for the JSON."""
    print(format_table(metrics))
    med = statistics.median
    print(
        f"\nBot messages of the median-length round ({BURST_CHATS} chats; 'send' is a reply's "
        "first words, 'edit' its final text; seconds since the messages were queued):"
    )
    for config in BURST_CONFIGS:
        bursts = sorted(m.bursts[config], key=lambda b: b.wall)
        print(f"  turns {config}: {_timeline(bursts[len(bursts) // 2])}")
    for config, burst in m.big.items():
        print(
            f"{BIG_CHATS} chats, turns {config}: first final reply after "
            f"{min(burst.final_s, default=float('nan')):.1f} s; "
            f"{burst.answered_by(BIG_TARGET_S)} answered in {BIG_TARGET_S:g} s, "
            f"{len(burst.final_s)} in {burst.looked_s:.1f} s; Bot API calls: {burst.api_calls}; "
            f"CPU (s): {', '.join(f'{k} {v:.1f}' for k, v in burst.cpu_s.items())}"
        )
    for name in ZERO_CONFIGS:
        print(
            f"One message, {name}: gateway {med(_flat(m.first_s[name], 1000)):.1f} ms to the "
            f"first message, {med(_flat(m.final_s[name], 1000)):.1f} ms to the final text; "
            f"echo bot {med(_flat(m.echo_s, 1000)):.1f} ms."
        )
    return {
        "metrics": [metric.as_json() for metric in metrics],
        "bursts": {k: [asdict(b) for b in v] for k, v in m.bursts.items()},
        "big": {k: asdict(b) for k, b in m.big.items()},
        "latency_s": {
            "gateway_first": m.first_s,
            "gateway_final": m.final_s,
            "echo": m.echo_s,
        },
        "start_up_s": m.start_up_s,
        "git": git_state(),
        "settings": {
            "model_delay_s": MODEL_DELAY_S,
            "tool_call": TOOL_CALL,
            "burst_chats": BURST_CHATS,
            "burst_rounds": BURST_ROUNDS,
            "big_chats": BIG_CHATS,
            "big_cap_s": BIG_CAP_S,
            "big_litellm_cap_s": BIG_LITELLM_CAP_S,
            "latency_messages": LATENCY_BLOCKS * LATENCY_BLOCK,
            "configs": {**CONFIGS, **ZERO_CONFIGS},
        },
    }


def main() -> None:
    m = asyncio.run(measure())
    metrics = metrics_of(m)
    payload = report(m, metrics)
    path = write_results(NAME, payload)
    print(f"\nResults: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
