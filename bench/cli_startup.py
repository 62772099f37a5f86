"""Issue 2, CLI start-up: ``nanobot --help`` and ``nanobot agent -m hi`` against a 0 ms model.

``agent -m`` runs on the default config plus ``agent.api_base`` (the fake) and an api key,
three times per round: with the default ``agent.transport: auto``, with ``direct`` (issue 14:
the direct transport imports no litellm at all), and the original nanobot (PyPI
``nanobot-ai`` 0.3.5, bench/_original.py) with the same model and ``providers.openai.apiBase``
(issue 24: ``auto`` should take at most 0.7 s and 120 MiB; ratios per interleaved pair).

Every command runs as a real subprocess of the installed package, in an isolated
environment (a temporary HOME and config, no NANOBOT_*/PYTHON* variables). Baselines are
measured in the same run with the same interpreter: ``python -c pass`` (the floor) and
``python -c 'import X'`` for nanobot.app, litellm and both (each prints time.monotonic()
once imported, which splits its wall time into the import and the interpreter's exit).
The fake model server (tests/fakes/llm.py) runs in this process's event loop, so the
arrival of the first request is known on the same monotonic clock as the CLI's spawn.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _original
from bench._common import (
    BIN_DIR,
    BenchError,
    Metric,
    Run,
    format_table,
    isolated_env,
    run_measured,
    write_results,
)
from tests.fakes.llm import FakeLLM

NAME = "cli_startup"
HELP_TARGET_S = 0.3
CHEAP_WARMUPS, CHEAP_RUNS = 2, 15  # python -c pass, --help, import nanobot.app
HEAVY_WARMUPS, HEAVY_RUNS = 1, 7  # anything importing litellm (~4-5 s each), the original
AGENT_TARGET_S, AGENT_RSS_TARGET_MIB = 0.7, 120.0  # issue 24, agent.transport: auto
MESSAGE = "hi"
TOP_IMPORTS = 10

PYTHON = sys.executable
NANOBOT = str(BIN_DIR / "nanobot")


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


def _progress(text: str) -> None:
    sys.stdout.flush()
    print(text, file=sys.stderr, flush=True)


def _write_config(home: Path, fake: FakeLLM, transport: str = "auto") -> dict[str, str]:
    """The default config plus ``fake`` as ``agent.api_base`` (and a key) under ``home``;
    returns the environment that selects it. The model is the default, openai/gpt-4o-mini."""
    config = home / "config.yaml"
    config.write_text(
        f"data_dir: {home / 'data'}\n"
        "agent:\n"
        f"  api_base: {fake.base_url}\n"
        "  api_key: sk-bench\n"
        f"  transport: {transport}\n",
        encoding="utf-8",
    )
    return isolated_env(home, NANOBOT_CONFIG=str(config))


async def _help_once(env: dict[str, str], home: Path) -> Run:
    run = (await run_measured([NANOBOT, "--help"], env, cwd=home)).check()
    if not run.stdout.startswith("Usage: nanobot"):
        raise BenchError(f"unexpected --help output: {run.stdout[:200]!r}")
    return run


async def _import_once(modules: str, env: dict[str, str], home: Path) -> ImportRun:
    """``python -c 'import <modules>'``, the child printing time.monotonic() once imported."""
    code = f"import {modules}\nimport time\nprint(repr(time.monotonic()))"
    run = (await run_measured([PYTHON, "-c", code], env, cwd=home)).check()
    try:
        return ImportRun(run, float(run.stdout.strip()))
    except ValueError:
        raise BenchError(f"import {modules} printed {run.stdout!r}") from None


async def _agent_once(fake: FakeLLM, transport: str = "auto") -> AgentRun:
    """``nanobot agent -m hi`` in a fresh HOME (so a new data dir, store and workspace)."""
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-home-") as tmp:
        home = Path(tmp)
        before = len(fake.requests)
        argv = [NANOBOT, "agent", "-m", MESSAGE]
        run = await run_measured(argv, _write_config(home, fake, transport), cwd=home)
        replied_at = _check_reply(run)
    requests = fake.requests[before:]
    if len(requests) != 1:
        raise BenchError(f"expected one model request per turn, got {len(requests)}")
    return AgentRun(run, requests[0].received_at, replied_at)


async def _original_once(fake: FakeLLM, original: _original.Original) -> AgentRun:
    """The original's ``nanobot agent -m hi`` in a fresh HOME (it makes its workspace)."""
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-original-") as tmp:
        home = Path(tmp)
        before = len(fake.requests)
        argv = [original.nanobot, "agent", "-m", MESSAGE]
        run = await run_measured(argv, original.agent_env(home, fake.base_url), cwd=home)
    run.check()
    # It prints a banner, then the reply (padded to the terminal's width).
    if f"echo: {MESSAGE}" not in run.stdout or run.first_stdout_at is None:
        raise BenchError(f"unexpected reply from the original's agent -m: {run.stdout!r}")
    requests = fake.requests[before:]
    if len(requests) != 1:
        raise BenchError(f"expected one model request from the original, got {len(requests)}")
    return AgentRun(run, requests[0].received_at, run.exited_at)


def _check_reply(run: Run) -> float:
    """The fake echoes the message (nanobot may prefix it); returns when stdout got it."""
    run.check()
    if not (run.stdout.startswith("echo: ") and run.stdout.endswith(f"{MESSAGE}\n")):
        raise BenchError(f"unexpected reply from agent -m: {run.stdout!r}")
    assert run.first_stdout_at is not None
    return run.first_stdout_at


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


async def _importtime_profile(fake: FakeLLM) -> list[ImportTime]:
    _progress(f"  python -X importtime nanobot agent -m {MESSAGE}: 1 run")
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-home-") as tmp:
        home = Path(tmp)
        argv = [PYTHON, "-X", "importtime", NANOBOT, "agent", "-m", MESSAGE]
        run = await run_measured(argv, _write_config(home, fake), cwd=home)
        _check_reply(run)
    return parse_importtime(run.stderr)


async def measure() -> Measurements:
    """Cheap commands, then heavy ones, each group in interleaved rounds (drift hits all)."""
    floor: list[Run] = []
    help_: list[Run] = []
    app: list[ImportRun] = []
    lit: list[ImportRun] = []
    both: list[ImportRun] = []
    agent: list[AgentRun] = []
    direct: list[AgentRun] = []
    original_runs: list[AgentRun] = []
    original = await asyncio.to_thread(_original.install)
    if isinstance(original, str):
        _progress(f"  the original nanobot is skipped: {original}")
    async with FakeLLM() as fake:  # Echo, no delay: the model answers in 0 ms
        _progress(f"  agent -m {MESSAGE}: preflight")  # fail in seconds, not minutes
        await _agent_once(fake)
        await _agent_once(fake, "direct")
        if isinstance(original, _original.Original):
            await _original_once(fake, original)
        with tempfile.TemporaryDirectory(prefix="nanobot-bench-home-") as tmp:
            home = Path(tmp)
            env = isolated_env(home)
            _progress(
                f"  python -c pass, nanobot --help, import nanobot.app: "
                f"{CHEAP_WARMUPS} warm-up + {CHEAP_RUNS} measured rounds"
            )
            for index in range(CHEAP_WARMUPS + CHEAP_RUNS):
                runs = (
                    (await run_measured([PYTHON, "-c", "pass"], env, cwd=home)).check(),
                    await _help_once(env, home),
                    await _import_once("nanobot.app", env, home),
                )
                if index >= CHEAP_WARMUPS:
                    floor.append(runs[0])
                    help_.append(runs[1])
                    app.append(runs[2])
            _progress(
                f"  import litellm, import nanobot.app+litellm, "
                f"agent -m {MESSAGE} (auto, direct, original): "
                f"{HEAVY_WARMUPS} warm-up + {HEAVY_RUNS} measured rounds"
            )
            for index in range(HEAVY_WARMUPS + HEAVY_RUNS):
                heavy = (
                    await _import_once("litellm", env, home),
                    await _import_once("nanobot.app, litellm", env, home),
                    await _agent_once(fake),
                    await _agent_once(fake, "direct"),
                )
                if isinstance(original, _original.Original):
                    theirs = await _original_once(fake, original)
                    if index >= HEAVY_WARMUPS:
                        original_runs.append(theirs)
                if index >= HEAVY_WARMUPS:
                    lit.append(heavy[0])
                    both.append(heavy[1])
                    agent.append(heavy[2])
                    direct.append(heavy[3])
        imports = await _importtime_profile(fake)
    return Measurements(
        floor,
        help_,
        app,
        lit,
        both,
        agent,
        direct,
        imports,
        original_runs,
        _original.describe(original),
    )


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


def report(m: Measurements, metrics: Sequence[Metric]) -> dict[str, Any]:
    """Print the table, the breakdown and the import profile; return them for the JSON."""
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
        "runs": {
            "cheap": {"warmups": CHEAP_WARMUPS, "runs": CHEAP_RUNS},
            "heavy": {"warmups": HEAVY_WARMUPS, "runs": HEAVY_RUNS},
        },
        "wrapper_overhead_s": med([r.parent_wall - r.wall for r in [*m.floor, *m.help]]),
    }


def main() -> None:
    load = os.getloadavg()
    m = asyncio.run(measure())
    metrics = metrics_of(m)
    payload = report(m, metrics) | {"load_average_at_start": load}
    path = write_results(NAME, payload)
    print(f"\nResults: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
