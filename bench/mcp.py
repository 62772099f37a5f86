"""Issue 28, MCP: nanobot's own time per MCP tool call, and what stdio servers cost a gateway.

1. **One tool call over stdio** (bench/_mcp_calls.py): the fake server's `echo` called by
   the bare SDK client (`mcp.Client`) and through nanobot's registry (`McpServers.call`:
   the arguments checked against the tool's schema, the result converted to a `ToolResult`
   inside the untrusted-content markers), alternating call by call in one process. The
   difference of the medians is nanobot's own time on top of the server's; target ≤ 2 ms.
   Where the sandbox runs here, the same through a server in exec's sandbox, apart.
2. **The first reply with 5 servers** (bench/_mcp_gateway.py): a gateway with 0, 1 or 5
   stdio servers configured (and 5 `sleep`s that never answer: nanobot's own work without
   the servers' CPU), a plain message waiting when it is spawned; exec → the reply shown
   and the gateway's CPU by then, paired by round (the variants' order rotating). Target:
   5 servers ≤ 100 ms after none.
3. **Idle RSS per server**, nanobot's side: the gateway process's VmRSS with 5 servers minus
   with none, divided by 5 (and with 1 server, for the fixed part); the servers' own RSS and
   PSS, for information.

``python -m bench mcp``; ``python -m bench.mcp --calls N --rounds N`` for a shorter run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from bench import _mcp_calls, _mcp_gateway
from bench._common import Metric, format_table, gateway_loop_run, write_results
from bench._mcp_calls import BARE, BOXED, SDK
from bench._mcp_gateway import Start, Variant
from nanobot import log
from tests.fakes.llm import FakeLLM

NAME = "mcp"
CALLS, CALL_WARMUPS = 500, 20
ROUNDS, WARMUPS = 9, 1
VARIANTS = (
    Variant("none", 0),
    Variant("1 server", 1),
    Variant("5 servers", 5),
    Variant("5 silent", 5, silent=True),
)
PAYLOADS = {"short": "hello", "8,000 chars": "lorem ipsum " * 666 + "lorem ip"}
CALL_TARGET_MS = 2.0
REPLY_TARGET_MS = 100.0


def _progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def call_metrics(measured: _mcp_calls.Measured) -> list[Metric]:
    metrics: list[Metric] = []
    for payload, ways in measured.timed.items():
        sdk, bare = ways[SDK], ways[BARE]
        metrics += [
            Metric(f"{payload}: bare SDK client", "ms", sdk.wall_ms),
            Metric(f"{payload}: nanobot (sandbox: none)", "ms", bare.wall_ms),
            Metric(
                f"{payload}: nanobot's own time (difference of the medians)",
                "ms",
                [_median(bare.wall_ms) - _median(sdk.wall_ms)],
                target=CALL_TARGET_MS,
            ),
            Metric(
                f"{payload}: nanobot - SDK, per pair",
                "ms",
                [b - s for b, s in zip(bare.wall_ms, sdk.wall_ms, strict=True)],
            ),
            Metric(f"{payload}: client CPU, bare SDK client", "ms", sdk.cpu_ms),
            Metric(f"{payload}: client CPU, nanobot", "ms", bare.cpu_ms),
            Metric(
                f"{payload}: nanobot's own CPU (difference of the medians)",
                "ms",
                [_median(bare.cpu_ms) - _median(sdk.cpu_ms)],
            ),
        ]
        if BOXED in ways:
            boxed = ways[BOXED]
            metrics += [
                Metric(f"{payload}: nanobot, server sandboxed", "ms", boxed.wall_ms),
                Metric(
                    f"{payload}: sandboxed: nanobot's own time (difference of the medians)",
                    "ms",
                    [_median(boxed.wall_ms) - _median(sdk.wall_ms)],
                    target=CALL_TARGET_MS,
                ),
            ]
    first = next(iter(measured.timed.values()))
    metrics += [
        Metric("first call: bare SDK client", "ms", [first[SDK].first_ms]),
        Metric(
            "first call: nanobot (the checker's import and build)", "ms", [first[BARE].first_ms]
        ),
    ]
    return metrics


def gateway_metrics(starts: dict[str, list[Start]]) -> list[Metric]:
    none, one, five, silent = (starts[v.label] for v in VARIANTS)
    labels = [v.label for v in VARIANTS]
    real = [v.label for v in VARIANTS if not v.silent]

    def each(label: str, unit: str, value: Callable[[Start], float], of: list[str]) -> list[Metric]:
        return [Metric(f"{v}: {label}", unit, [value(s) for s in starts[v]]) for v in of]

    def paired(
        label: str,
        a: list[Start],
        b: list[Start],
        value: Callable[[Start], float],
        unit: str,
        *,
        scale: float = 1.0,
        target: float | None = None,
    ) -> Metric:
        values = [(value(x) - value(y)) * scale for x, y in zip(a, b, strict=True)]
        return Metric(f"{label}, per round", unit, values, target=target)

    def reply_ms(start: Start) -> float:
        return start.reply_s * 1000

    def cpu_ms(start: Start) -> float:
        return start.reply_cpu_s * 1000

    def poll_ms(start: Start) -> float:
        return start.first_poll_s * 1000

    def gateway(start: Start) -> float:
        return start.gateway_rss_kib / 1024

    def children(start: Start) -> float:
        return start.children_rss_kib / 1024

    def running(start: Start) -> float:
        assert start.running_s is not None
        return start.running_s

    return [
        *each("exec -> reply shown", "s", lambda s: s.reply_s, labels),
        paired(
            "exec -> reply: 5 servers - none",
            five,
            none,
            reply_ms,
            "ms",
            target=REPLY_TARGET_MS,
        ),
        paired("exec -> reply: 1 server - none", one, none, reply_ms, "ms"),
        paired("exec -> reply: 5 silent - none", silent, none, reply_ms, "ms"),
        paired("exec -> reply: 5 servers - 5 silent", five, silent, reply_ms, "ms"),
        *each("gateway CPU until the reply", "s", lambda s: s.reply_cpu_s, labels),
        paired("gateway CPU until the reply: 5 servers - none", five, none, cpu_ms, "ms"),
        paired("gateway CPU until the reply: 5 silent - none", silent, none, cpu_ms, "ms"),
        *each("exec -> 1st getUpdates", "s", lambda s: s.first_poll_s, labels),
        paired("exec -> 1st getUpdates: 5 servers - none", five, none, poll_ms, "ms"),
        *each("exec -> every server running", "s", running, real[1:]),
        *each("gateway process idle RSS", "MiB", gateway, real),
        paired("gateway RSS per server, (5 - none) / 5", five, none, gateway, "MiB", scale=1 / 5),
        paired("gateway RSS, 1 server - none", one, none, gateway, "MiB"),
        paired(
            "gateway RSS per further server, (5 - 1) / 4",
            five,
            one,
            gateway,
            "MiB",
            scale=1 / 4,
        ),
        *each("descendants' RSS", "MiB", children, real),
        paired(
            "servers' own RSS per server, (5 - none) / 5",
            five,
            none,
            children,
            "MiB",
            scale=1 / 5,
        ),
        paired(
            "servers' own PSS per server, (5 - none) / 5",
            five,
            none,
            lambda s: s.children_pss_kib / 1024,
            "MiB",
            scale=1 / 5,
        ),
    ]


async def measure_gateways(tmp: Path, *, rounds: int, sandboxed: bool) -> dict[str, list[Start]]:
    starts: dict[str, list[Start]] = {}
    tmp.mkdir()
    async with FakeLLM() as llm:
        for index in range(WARMUPS + rounds):
            shift = index % len(VARIANTS)
            order = VARIANTS[shift:] + VARIANTS[:shift]
            which = f"round {index + 1 - WARMUPS}" if index >= WARMUPS else "warm-up"
            _progress(f"  {which}: {', '.join(v.label for v in order)}")
            for variant in order:
                start = await _mcp_gateway.start_one(llm, tmp, variant, sandboxed=sandboxed)
                if index >= WARMUPS:
                    starts.setdefault(variant.label, []).append(start)
    return starts


def main(calls: int = CALLS, rounds: int = ROUNDS) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    log.setup(level="WARNING")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-mcp-") as tmp:
        _progress(f"one call: {CALL_WARMUPS} warm-up + {calls} calls of each way and payload")
        measured = gateway_loop_run(
            _mcp_calls.measure(Path(tmp) / "calls", PAYLOADS, warmups=CALL_WARMUPS, calls=calls)
        )
        sandboxed = BOXED not in measured.missing
        for way, why in measured.missing.items():
            _progress(f"  not measured: {way}: {why}")
        _progress(
            f"gateways, {', '.join(v.label for v in VARIANTS)} "
            f"({'sandboxed' if sandboxed else 'sandbox: none'}): "
            f"{WARMUPS} warm-up + {rounds} rounds, order rotating"
        )
        starts = asyncio.run(
            measure_gateways(Path(tmp) / "gateways", rounds=rounds, sandboxed=sandboxed)
        )
    metrics = call_metrics(measured) + gateway_metrics(starts)
    print(format_table(metrics))
    offered = sorted({s.mcp_tools_offered for s in starts["5 servers"]})
    processes = {n: sorted({s.processes for s in ss}) for n, ss in starts.items()}
    survivors = sum(s.survivors for ss in starts.values() for s in ss)
    print(f"\nMCP tools in the first reply's model request, 5 servers: {offered}")
    print(f"Processes per gateway when idle (the gateway and its descendants): {processes}")
    print(f"Descendants alive after their gateway stopped: {survivors}")
    for way, why in measured.missing.items():
        print(f"Not measured: {way}: {why}")
    path = write_results(
        NAME,
        {
            "metrics": [m.as_json() for m in metrics],
            "load_average_at_start": load,
            "servers_sandboxed": sandboxed,
            "calls": {"warmups": CALL_WARMUPS, "calls": calls, **_mcp_calls.describe(measured)},
            "gateways": {
                "warmups": WARMUPS,
                "rounds": rounds,
                "settle_s": _mcp_gateway.SETTLE_S,
                "starts": {n: [asdict(s) for s in ss] for n, ss in starts.items()},
            },
        },
    )
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd())
    print(f"\nResults: {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.mcp", description=__doc__)
    parser.add_argument("--calls", type=int, default=CALLS, help=f"per way (default {CALLS})")
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"of gateways (default {ROUNDS})"
    )
    arguments = parser.parse_args()
    main(arguments.calls, arguments.rounds)
