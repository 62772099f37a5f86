"""What ``bench/cli_startup.py`` measures (each command's runs, the import profile), and the
figures, the time breakdown and the report it makes of them, with issue 2's and issue 24's
targets."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench import _original
from bench._common import Metric, Run, format_table

HELP_TARGET_S = 0.3
AGENT_TARGET_S, AGENT_RSS_TARGET_MIB = 0.7, 120.0  # issue 24, agent.transport: auto
MESSAGE = "hi"
TOP_IMPORTS = 10


@dataclass(frozen=True)
class ImportRun:
    """``python -c 'import X'``: when the import was done, and when the process was gone."""

    run: Run
    imported_at: float  # time.monotonic() printed by the child right after the import

    @property
    def import_s(self) -> float:
        return self.imported_at - self.run.launched_at

    @property
    def exit_s(self) -> float:
        return self.run.exited_at - self.imported_at


@dataclass(frozen=True)
class AgentRun:
    """``nanobot agent -m hi``: spawn, first request at the server, reply on stdout, exit."""

    run: Run
    requested_at: float  # the fake's time.monotonic() on receiving the request
    replied_at: float  # this process's time.monotonic() when the reply reached stdout

    @property
    def to_request_s(self) -> float:
        return self.requested_at - self.run.launched_at

    @property
    def request_to_reply_s(self) -> float:
        return self.replied_at - self.requested_at

    @property
    def reply_to_exit_s(self) -> float:
        return self.run.exited_at - self.replied_at


@dataclass(frozen=True)
class ImportTime:
    module: str
    self_s: float
    cumulative_s: float


@dataclass(frozen=True)
class Measurements:
    floor: list[Run]
    help: list[Run]
    app: list[ImportRun]
    litellm: list[ImportRun]
    both: list[ImportRun]
    agent: list[AgentRun]
    direct: list[AgentRun]  # agent.transport: direct
    imports: list[ImportTime]
    original: list[AgentRun]  # nanobot-ai 0.3.5; empty when skipped
    original_info: dict[str, Any]  # bench._original.describe


def parse_importtime(stderr: str) -> list[ImportTime]:
    """The top-level imports (nesting level 0) of ``-X importtime`` output, in order."""
    found: list[ImportTime] = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|", 2)
        if len(name) - len(name.lstrip(" ")) == 1:  # " name" is level 0, "   name" level 1
            found.append(ImportTime(name.strip(), int(self_us) / 1e6, int(cumulative_us) / 1e6))
    return found


def metrics_of(m: Measurements) -> list[Metric]:
    def walls(runs: Sequence[Run]) -> list[float]:
        return [r.wall for r in runs]

    def rss(runs: Sequence[Run]) -> list[float]:
        return [r.peak_rss_mib for r in runs]

    agent = f"agent -m {MESSAGE}"
    metrics = [
        Metric("python -c pass (floor)", "s", walls(m.floor)),
        Metric("nanobot --help", "s", walls(m.help), target=HELP_TARGET_S),
        Metric(
            "nanobot --help / floor",
            "x",
            [h.wall / f.wall for h, f in zip(m.help, m.floor, strict=True)],
            note="per interleaved pair",
        ),
        Metric("import nanobot.app: wall", "s", walls([i.run for i in m.app])),
        Metric("import nanobot.app: spawn -> imported", "s", [i.import_s for i in m.app]),
        Metric("import litellm: wall", "s", walls([i.run for i in m.litellm])),
        Metric("import litellm: spawn -> imported", "s", [i.import_s for i in m.litellm]),
        Metric("import litellm: imported -> exit", "s", [i.exit_s for i in m.litellm]),
        Metric("import nanobot.app, litellm: wall", "s", walls([i.run for i in m.both])),
        Metric("import nanobot.app, litellm: -> imported", "s", [i.import_s for i in m.both]),
        Metric(f"{agent}: total", "s", [a.run.wall for a in m.agent], target=AGENT_TARGET_S),
        Metric(f"{agent}: spawn -> 1st request", "s", [a.to_request_s for a in m.agent]),
        Metric(f"{agent}: 1st request -> reply", "s", [a.request_to_reply_s for a in m.agent]),
        Metric(f"{agent}: reply -> exit", "s", [a.reply_to_exit_s for a in m.agent]),
        Metric(f"{agent} (direct): total", "s", [a.run.wall for a in m.direct]),
        Metric(f"{agent} (direct): spawn -> 1st request", "s", [a.to_request_s for a in m.direct]),
        Metric("peak RSS: python -c pass", "MiB", rss(m.floor)),
        Metric("peak RSS: nanobot --help", "MiB", rss(m.help)),
        Metric("peak RSS: import nanobot.app", "MiB", rss([i.run for i in m.app])),
        Metric("peak RSS: import litellm", "MiB", rss([i.run for i in m.litellm])),
        Metric(
            f"peak RSS: {agent}",
            "MiB",
            rss([a.run for a in m.agent]),
            target=AGENT_RSS_TARGET_MIB,
        ),
        Metric(f"peak RSS: {agent} (direct)", "MiB", rss([a.run for a in m.direct])),
        *_pairs(f"{agent}: auto / direct", m.agent, m.direct),
    ]
    if m.original:
        theirs = [a.run for a in m.original]
        metrics += [
            Metric(f"{agent} (original {_original.VERSION}): total", "s", walls(theirs)),
            Metric(
                f"{agent} (original): spawn -> 1st request",
                "s",
                [a.to_request_s for a in m.original],
            ),
            Metric(f"peak RSS: {agent} (original)", "MiB", rss(theirs)),
            *_pairs(f"{agent}: auto / original", m.agent, m.original),
            *_pairs(f"{agent}: direct / original", m.direct, m.original),
        ]
    return metrics


def _pairs(name: str, ours: Sequence[AgentRun], theirs: Sequence[AgentRun]) -> list[Metric]:
    """Wall time and peak RSS of ``ours`` over ``theirs``, per interleaved pair."""
    pairs = list(zip(ours, theirs, strict=True))
    note = "per interleaved pair"
    return [
        Metric(f"{name}: total", "x", [a.run.wall / b.run.wall for a, b in pairs], note=note),
        Metric(
            f"{name}: peak RSS",
            "x",
            [a.run.peak_rss_kib / b.run.peak_rss_kib for a, b in pairs],
            note=note,
        ),
    ]


def breakdown(m: Measurements) -> list[tuple[str, float]]:
    """Where the median ``agent -m`` time goes, from medians; the rows add up to the total.

    litellm and nanobot.app share dependencies (pydantic, httpx, ...), so litellm is
    charged only what it adds on top of nanobot.app, and only if `agent -m` imported it
    (by its import profile).
    """
    med = statistics.median
    floor = med([r.wall for r in m.floor])
    app = med([i.import_s for i in m.app])
    imported = any(i.module == "litellm" for i in m.imports)
    both = med([i.import_s for i in m.both]) if imported else app
    to_request = med([a.to_request_s for a in m.agent])
    to_reply = med([a.replied_at - a.run.launched_at for a in m.agent])
    total = med([a.run.wall for a in m.agent])
    return [
        ("interpreter start-up (python -c pass)", floor),
        ("nanobot.app and its dependencies (import nanobot.app - floor)", app - floor),
        (
            "litellm on top of that (import both - import nanobot.app)"
            if imported
            else "litellm (not imported)",
            both - app,
        ),
        ("the rest until the request: CLI, config, store, 1st-call set-up", to_request - both),
        ("request -> reply printed (the model answers in 0 ms)", to_reply - to_request),
        ("reply printed -> exit (interpreter shutdown)", total - to_reply),
    ]


def report(
    m: Measurements, metrics: Sequence[Metric], runs: dict[str, dict[str, int]]
) -> dict[str, Any]:
    """Print the table, the breakdown and the import profile; return them for the JSON, with
    `runs` (the warm-up and measured rounds of each group)."""
    med = statistics.median
    rows = breakdown(m)
    total = sum(seconds for _, seconds in rows)
    to_request = med([a.to_request_s for a in m.agent])
    litellm_alone = med([i.import_s for i in m.litellm]) - med([r.wall for r in m.floor])
    top = sorted(m.imports, key=lambda i: i.cumulative_s, reverse=True)[:TOP_IMPORTS]
    imports_total = sum(i.cumulative_s for i in m.imports)
    names = [i.module for i in m.imports]
    after = m.imports[names.index("litellm") + 1 :] if "litellm" in names else []
    lazy_s = sum(i.cumulative_s for i in after)

    print(format_table(metrics))
    if "skipped" in m.original_info:
        print(f"The original nanobot was skipped: {m.original_info['skipped']}")
    print(f"\nWhere the median `agent -m {MESSAGE}` time goes ({total:.3f} s):")
    width = max(len(label) for label, _ in rows)
    for label, seconds in rows:
        print(f"  {label:<{width}}  {seconds:6.3f} s  {seconds / total:6.1%}")
    print(
        f"litellm's import alone (import litellm - floor): {litellm_alone:.3f} s, "
        f"{litellm_alone / to_request:.0%} of the time before the first request."
    )
    print(
        f"\n-X importtime, one run of `agent -m {MESSAGE}`: top-level imports by cumulative "
        f"time ({imports_total:.3f} s in all; the profiler inflates them):"
    )
    for item in top:
        print(f"  {item.cumulative_s:7.3f} s  {item.module}")
    print(
        f"Imported after litellm, i.e. lazily during the first call: {lazy_s:.3f} s "
        f"({', '.join(i.module for i in sorted(after, key=lambda i: -i.cumulative_s)[:3])}, ...)."
    )
    return {
        "metrics": [metric.as_json() for metric in metrics],
        "breakdown_s": dict(rows),
        "litellm_import_minus_floor_s": litellm_alone,
        "importtime": {
            "total_top_level_s": imports_total,
            "after_litellm_s": lazy_s,
            "top": [vars(item) for item in top],
        },
        "original": m.original_info,
        "runs": runs,
        "wrapper_overhead_s": med([r.parent_wall - r.wall for r in [*m.floor, *m.help]]),
    }
