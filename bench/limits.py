"""Issue 25 §2, the cost of exec's limits: `true` through the exec tool in the bubblewrap
sandbox, with the limits (`tools.exec.limits` defaults: the command's cgroup made, joined and
removed where one is available, the rlimits set by prlimit inside the sandbox) and without,
and without any sandbox, in the same run.

Calls alternate (limits, no limits, no sandbox) so that a change in the machine's load falls
on all alike; 3 warm-up rounds, then 50. "Added by the limits" is the median of the pairwise
differences to the sandbox without limits; "sandbox and limits" the median of the pairwise
differences to no sandbox. Target: the sandbox with its limits adds at most 10 ms per call.
"""

from __future__ import annotations

import asyncio
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import Metric, format_table, write_results
from nanobot.tools.limits import Limits, enforce
from nanobot.tools.sandbox import Confinement, Unconfined, probe
from nanobot.tools.shell import ExecParams, ExecTool

NAME = "limits"
RUNS, WARMUPS = 50, 3
TARGET_MS = 10.0


async def _time(tool: ExecTool) -> tuple[float, float]:
    """(wall time, CPU time of the processes it started), in ms."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = await tool.run(ExecParams(command="true"))
    elapsed = time.perf_counter() - started
    out = result if isinstance(result, str) else result.content
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not out.startswith("exit code 0"):
        raise RuntimeError(f"true failed: {out}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return elapsed * 1000, cpu * 1000


async def measure(workspace: Path) -> tuple[list[Metric], str]:
    limits = Limits()
    hidden = (workspace.parent / "data",)
    enforcement = enforce(limits, confined=True)
    tools = {
        "bubblewrap with limits": ExecTool(
            workspace,
            sandbox=probe(
                "bwrap", Confinement(workspace, hidden, network="host", tmp_size=limits.tmp_size)
            ),
            limits=enforcement,
        ),
        "bubblewrap without limits": ExecTool(
            workspace, sandbox=probe("bwrap", Confinement(workspace, hidden, network="host"))
        ),
        "no sandbox": ExecTool(workspace, sandbox=Unconfined()),
    }
    times: dict[str, list[float]] = {name: [] for name in tools}
    cpu: dict[str, list[float]] = {name: [] for name in tools}
    for run in range(WARMUPS + RUNS):
        for name, tool in tools.items():
            wall, used = await _time(tool)
            if run >= WARMUPS:
                times[name].append(wall)
                cpu[name].append(used)
    metrics = [Metric(f"exec true, {name}", "ms", values) for name, values in times.items()]
    limited, bare, none = (times[name] for name in tools)
    medians = [m.stats.median for m in metrics]
    metrics.append(
        Metric(
            "added by the limits",
            "ms",
            [a - b for a, b in zip(limited, bare, strict=True)],
            note=f"difference of the medians: {medians[0] - medians[1]:.2f} ms",
        )
    )
    metrics.append(
        Metric(
            "added by the sandbox with its limits",
            "ms",
            [a - b for a, b in zip(limited, none, strict=True)],
            target=TARGET_MS,
            note=f"difference of the medians: {medians[0] - medians[2]:.2f} ms",
        )
    )
    # CPU time is what the machine's load does not stretch: the cost itself.
    metrics += [Metric(f"CPU of the processes, {name}", "ms", v) for name, v in cpu.items()]
    await asyncio.to_thread(enforcement.close)
    return metrics, enforcement.describe()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-") as tmp:
        workspace = Path(tmp) / "data" / "workspace"
        workspace.mkdir(parents=True)
        metrics, enforced = asyncio.run(measure(workspace))
    print(f"limits: {enforced}")
    print(format_table(metrics))
    for metric in metrics:
        if metric.note:
            print(f"{metric.name}: {metric.note}")
    payload: dict[str, Any] = {"metrics": [m.as_json() for m in metrics], "enforced": enforced}
    print(f"results: {write_results(NAME, payload)}")
