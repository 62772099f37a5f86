"""Issue 13, the cost of exec's sandbox: `true` and `python3 -c pass` through the exec tool,
in the bubblewrap sandbox and without one (`tools.exec.sandbox: none`), in the same run.

Each call goes through `ExecTool.run` as the model's calls do (process start, output pipe,
exit, the process-group stop); the two sandboxes alternate call by call, so a change in the
machine's load falls on both alike. Target: the sandbox adds at most 15 ms per call (the
median of the bwrap calls minus the median of the unsandboxed ones).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import Metric, format_table, write_results
from nanobot.tools.sandbox import Confinement, Sandbox, Unconfined, probe
from nanobot.tools.shell import ExecParams, ExecTool

NAME = "sandbox"
RUNS, WARMUPS = 50, 3
TARGET_MS = 15.0
COMMANDS = {"true": "true", "python3 -c pass": "python3 -c pass"}


async def _time(tool: ExecTool, command: str) -> float:
    started = time.perf_counter()
    out = await tool.run(ExecParams(command=command))
    assert isinstance(out, str)  # a clean command: plain text
    elapsed = time.perf_counter() - started
    if not out.startswith("exit code 0"):
        raise RuntimeError(f"{command!r} failed: {out}")
    return elapsed * 1000


async def measure(workspace: Path) -> list[Metric]:
    sandboxes: dict[str, Sandbox] = {
        "bwrap": probe(
            "bwrap", Confinement(workspace, (workspace.parent / "data",), network="none")
        ),
        "none": Unconfined(),
    }
    tools = {name: ExecTool(workspace, sandbox=s) for name, s in sandboxes.items()}
    metrics: list[Metric] = []
    for label, command in COMMANDS.items():
        times: dict[str, list[float]] = {name: [] for name in tools}
        for run in range(WARMUPS + RUNS):
            for name, tool in tools.items():
                value = await _time(tool, command)
                if run >= WARMUPS:
                    times[name].append(value)
        for name, values in times.items():
            metrics.append(Metric(f"exec {label}, sandbox {name}", "ms", values))
        extra = [b - n for b, n in zip(times["bwrap"], times["none"], strict=True)]
        by_medians = metrics[-2].stats.median - metrics[-1].stats.median
        metrics.append(
            Metric(
                f"added by the sandbox, {label}",
                "ms",
                extra,
                target=TARGET_MS,
                note=f"difference of the medians: {by_medians:.2f} ms",
            )
        )
    return metrics


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-") as tmp:
        workspace = Path(tmp) / "data" / "workspace"
        workspace.mkdir(parents=True)
        metrics = asyncio.run(measure(workspace))
    print(format_table(metrics))
    for metric in metrics:
        if metric.note:
            print(f"{metric.name}: {metric.note}")
    payload: dict[str, Any] = {"metrics": [m.as_json() for m in metrics]}
    print(f"results: {write_results(NAME, payload)}")
