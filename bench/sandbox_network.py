"""Issue 25, the sandbox's own network: what it adds to each exec call, and to a fetch.

1. `true` through the exec tool (as the model's calls go: process start, output pipe, exit,
   the process-group stop) with no sandbox (`sh -c true` bare), in bubblewrap on the host's
   network (`network: host`, today's behaviour before this issue), and in bubblewrap with a
   network of its own (`network: public`: nsenter into the shared namespace, the per-call
   proxy credentials, the seccomp filter, the per-call masks, HOME's tmpfs), and the last
   with the default `tools.exec.limits` too (the default a user gets). Target: that default
   adds at most 10 ms per call to bare.
2. `curl` of a loopback stand-in for a public server (an HTTP server on 127.0.0.1, named in
   allow_hosts), through the egress proxy from `public`, against curl of it directly from
   `host`.

On the event loop the gateway runs by default (uvloop, where installed), with the launcher
thread and the sandbox's gate as the gateway has them. The variants alternate call by call,
so a change in the machine's load falls on all alike; the figures are medians over RUNS
calls each.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from bench._common import Metric, format_table, gateway_loop_run, write_results
from nanobot.allowed_hosts import AllowedHost
from nanobot.tools.egress import EgressProxy
from nanobot.tools.limits import Limits, enforce
from nanobot.tools.netns import NetworkNamespace
from nanobot.tools.sandbox import Confinement, Network, Sandbox, Unconfined, probe
from nanobot.tools.shell import ExecParams, ExecTool

NAME = "sandbox_network"
RUNS, WARMUPS = 60, 5
TARGET_MS = 10.0


async def _time(tool: ExecTool, command: str) -> float:
    started = time.perf_counter()
    result = await tool.run(ExecParams(command=command))
    elapsed = time.perf_counter() - started
    out = result if isinstance(result, str) else result.content  # a fetch: wrapped, tainted
    if not out.startswith("exit code 0"):
        raise RuntimeError(f"{command!r} failed: {out}")
    return elapsed * 1000


async def _alternating(tools: dict[str, ExecTool], command: str) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in tools}
    for run in range(WARMUPS + RUNS):
        for name, tool in tools.items():
            value = await _time(tool, command)
            if run >= WARMUPS:
                times[name].append(value)
    return times


async def measure(workspace: Path) -> list[Metric]:
    hidden = (workspace.parent / "data",)
    hello = web.Application()

    async def answer(_: web.Request) -> web.Response:
        return web.Response(text="stand-in for a public server")

    hello.router.add_get("/", answer)
    runner = web.AppRunner(hello)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    namespace = NetworkNamespace.create()
    proxy = EgressProxy(namespace.listener, allow_hosts=[AllowedHost("127.0.0.1", port)])
    await proxy.start()
    limits = Limits()
    enforcement = enforce(limits, confined=True)
    try:
        sandboxes: dict[str, Sandbox] = {
            "bare": Unconfined(workspace),
            "host": probe("bwrap", Confinement(workspace, hidden, network="host")),
            "public": probe(
                "bwrap",
                Confinement(workspace, hidden, network="public"),
                network=Network.of(namespace, proxy),
            ),
        }
        tools = {name: ExecTool(workspace, sandbox=s) for name, s in sandboxes.items()}
        # The default: its own network and the default limits (tools.exec.limits).
        tools["public with limits"] = ExecTool(
            workspace,
            sandbox=probe(
                "bwrap",
                Confinement(workspace, hidden, network="public", tmp_size=limits.tmp_size),
                network=Network.of(namespace, proxy),
            ),
            limits=enforcement,
        )
        metrics = _exec_metrics(await _alternating(tools, "true"))
        curl = f"curl -sS -o /dev/null http://127.0.0.1:{port}/"
        fetched = await _alternating({k: tools[k] for k in ("host", "public")}, curl)
        metrics.append(Metric("curl of loopback, direct (network host)", "ms", fetched["host"]))
        metrics.append(
            Metric("curl of loopback, through the proxy (public)", "ms", fetched["public"])
        )
        extra = [p - h for p, h in zip(fetched["public"], fetched["host"], strict=True)]
        metrics.append(Metric("added by the proxy to a curl", "ms", extra))
        return metrics
    finally:
        enforcement.close()
        await proxy.close()
        namespace.close()
        await runner.cleanup()


def _exec_metrics(times: dict[str, list[float]]) -> list[Metric]:
    metrics = [Metric(f"exec true, {name}", "ms", values) for name, values in times.items()]
    for name in ("host", "public", "public with limits"):
        extra = [s - b for s, b in zip(times[name], times["bare"], strict=True)]
        metrics.append(
            Metric(
                f"added by the sandbox, network {name}",
                "ms",
                extra,
                target=TARGET_MS if name == "public with limits" else None,
            )
        )
    extra = [p - h for p, h in zip(times["public"], times["host"], strict=True)]
    metrics.append(Metric("added by public over host", "ms", extra))
    return metrics


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-") as tmp:
        workspace = Path(tmp) / "data" / "workspace"
        workspace.mkdir(parents=True)
        metrics = gateway_loop_run(measure(workspace))
    print(format_table(metrics))
    payload: dict[str, Any] = {"metrics": [m.as_json() for m in metrics]}
    print(f"results: {write_results(NAME, payload)}")
