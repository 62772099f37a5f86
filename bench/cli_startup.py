"""Issue 2, CLI start-up: ``nanobot --help`` and ``nanobot agent -m hi`` against a 0 ms model.

Every command runs as a real subprocess of the installed package, in an isolated
environment (a temporary HOME and config, no NANOBOT_*/PYTHON* variables). Baselines are
measured in the same run with the same interpreter: ``python -c pass`` (the floor),
``import nanobot.app``, ``import litellm`` and both together. The fake model server
(tests/fakes/llm.py) runs in this process's event loop, so the moment the first request
reaches it is known on the same monotonic clock as the moment the CLI was spawned.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
HEAVY_WARMUPS, HEAVY_RUNS = 1, 7  # anything importing litellm (~4 s each)
MESSAGE = "hi"
TOP_IMPORTS = 10

PYTHON = sys.executable
NANOBOT = str(BIN_DIR / "nanobot")


@dataclass(frozen=True)
class AgentRun:
    run: Run
    first_request: float  # seconds from spawn to the first request reaching the server

    @property
    def after_request(self) -> float:
        return self.run.wall - self.first_request


@dataclass(frozen=True)
class ImportTime:
    module: str
    self_s: float
    cumulative_s: float


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _write_config(home: Path, fake: FakeLLM) -> dict[str, str]:
    """A config for ``fake`` under ``home``; returns the environment that selects it."""
    config = home / "config.yaml"
    config.write_text(
        f"data_dir: {home / 'data'}\n"
        "agent:\n"
        "  model: openai/fake-model\n"
        f"  api_base: {fake.base_url}\n"
        "  api_key: sk-bench\n",
        encoding="utf-8",
    )
    return isolated_env(home, NANOBOT_CONFIG=str(config))


async def _repeat(
    label: str, argv: Sequence[str], env: dict[str, str], home: Path, *, warmups: int, runs: int
) -> list[Run]:
    _progress(f"  {label}: {warmups} warm-up(s) + {runs} runs")
    results: list[Run] = []
    for index in range(warmups + runs):
        run = (await run_measured(argv, env, cwd=home)).check()
        if index >= warmups:
            results.append(run)
    return results


async def _floor_and_help(env: dict[str, str], home: Path) -> tuple[list[Run], list[Run]]:
    """``python -c pass`` and ``nanobot --help``, interleaved so drift hits both alike."""
    _progress(f"  python -c pass / nanobot --help: {CHEAP_WARMUPS} + {CHEAP_RUNS} pairs")
    floor: list[Run] = []
    help_: list[Run] = []
    for index in range(CHEAP_WARMUPS + CHEAP_RUNS):
        base = (await run_measured([PYTHON, "-c", "pass"], env, cwd=home)).check()
        shown = (await run_measured([NANOBOT, "--help"], env, cwd=home)).check()
        if not shown.stdout.startswith("Usage: nanobot"):
            raise BenchError(f"unexpected --help output: {shown.stdout[:200]!r}")
        if index >= CHEAP_WARMUPS:
            floor.append(base)
            help_.append(shown)
    return floor, help_


def _check_reply(run: Run) -> None:
    """The fake echoes the user's message (nanobot may prefix it, e.g. with a timestamp)."""
    run.check()
    if not (run.stdout.startswith("echo: ") and run.stdout.endswith(f"{MESSAGE}\n")):
        raise BenchError(f"unexpected reply from agent -m: {run.stdout!r}")


async def _agent_runs(fake: FakeLLM) -> list[AgentRun]:
    """``nanobot agent -m hi``, each run in a fresh HOME (new data dir, store, workspace)."""
    _progress(f"  nanobot agent -m {MESSAGE}: {HEAVY_WARMUPS} warm-up(s) + {HEAVY_RUNS} runs")
    results: list[AgentRun] = []
    for index in range(HEAVY_WARMUPS + HEAVY_RUNS):
        with tempfile.TemporaryDirectory(prefix="nanobot-bench-home-") as tmp:
            home = Path(tmp)
            before = len(fake.requests)
            run = await run_measured(
                [NANOBOT, "agent", "-m", MESSAGE], _write_config(home, fake), cwd=home
            )
            _check_reply(run)
        requests = fake.requests[before:]
        if len(requests) != 1:
            raise BenchError(f"expected one model request per turn, got {len(requests)}")
        if index >= HEAVY_WARMUPS:
            results.append(AgentRun(run, requests[0].received_at - run.launched_at))
    return results


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


@dataclass(frozen=True)
class Measurements:
    floor: list[Run]
    help: list[Run]
    app_import: list[Run]
    litellm_import: list[Run]
    both_import: list[Run]
    agent: list[AgentRun]
    imports: list[ImportTime]


async def measure() -> Measurements:
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-home-") as tmp:
        home = Path(tmp)
        env = isolated_env(home)
        floor, help_ = await _floor_and_help(env, home)

        def python_c(code: str) -> list[str]:
            return [PYTHON, "-c", code]

        cheap = {"warmups": CHEAP_WARMUPS, "runs": CHEAP_RUNS}
        heavy = {"warmups": HEAVY_WARMUPS, "runs": HEAVY_RUNS}
        app = await _repeat(
            "import nanobot.app", python_c("import nanobot.app"), env, home, **cheap
        )
        lit = await _repeat("import litellm", python_c("import litellm"), env, home, **heavy)
        both_code = "import nanobot.app, litellm"
        both = await _repeat(both_code, python_c(both_code), env, home, **heavy)
    async with FakeLLM() as fake:  # answers at once: Echo, no delay
        agent = await _agent_runs(fake)
        imports = await _importtime_profile(fake)
    return Measurements(floor, help_, app, lit, both, agent, imports)


def _walls(runs: Sequence[Run]) -> list[float]:
    return [r.wall for r in runs]


def _rss(runs: Sequence[Run]) -> list[float]:
    return [r.peak_rss_mib for r in runs]


def metrics_of(m: Measurements) -> list[Metric]:
    return [
        Metric("python -c pass (floor)", "s", _walls(m.floor)),
        Metric("nanobot --help", "s", _walls(m.help), target=HELP_TARGET_S),
        Metric(
            "nanobot --help / floor",
            "x",
            [h.wall / f.wall for h, f in zip(m.help, m.floor, strict=True)],
            note="per interleaved pair",
        ),
        Metric("python -c 'import nanobot.app'", "s", _walls(m.app_import)),
        Metric("python -c 'import litellm'", "s", _walls(m.litellm_import)),
        Metric("python -c 'import nanobot.app, litellm'", "s", _walls(m.both_import)),
        Metric(f"agent -m {MESSAGE}: total", "s", [a.run.wall for a in m.agent]),
        Metric(
            f"agent -m {MESSAGE}: spawn -> 1st request", "s", [a.first_request for a in m.agent]
        ),
        Metric(f"agent -m {MESSAGE}: 1st request -> exit", "s", [a.after_request for a in m.agent]),
        Metric("peak RSS: python -c pass", "MiB", _rss(m.floor)),
        Metric("peak RSS: nanobot --help", "MiB", _rss(m.help)),
        Metric("peak RSS: import nanobot.app", "MiB", _rss(m.app_import)),
        Metric("peak RSS: import litellm", "MiB", _rss(m.litellm_import)),
        Metric(f"peak RSS: agent -m {MESSAGE}", "MiB", [a.run.peak_rss_mib for a in m.agent]),
    ]


def breakdown(m: Measurements) -> list[tuple[str, float]]:
    """Where the median ``agent -m`` time goes, from the medians of the baselines.

    Rows add up to the total. litellm and nanobot.app share dependencies (pydantic, httpx,
    ...), so litellm is charged only what it adds on top of nanobot.app.
    """

    def med(values: Sequence[float]) -> float:
        return statistics.median(values)

    floor, app = med(_walls(m.floor)), med(_walls(m.app_import))
    both = med(_walls(m.both_import))
    first = med([a.first_request for a in m.agent])
    total = med([a.run.wall for a in m.agent])
    return [
        ("interpreter start-up (python -c pass)", floor),
        ("nanobot.app and its dependencies (import nanobot.app - floor)", app - floor),
        ("litellm on top of that (import both - import nanobot.app)", both - app),
        ("CLI, config, store, workspace, 1st call set-up (rest until request)", first - both),
        ("1st request -> exit (0 ms model: reply, store, shutdown)", total - first),
    ]


def report(m: Measurements, metrics: Sequence[Metric]) -> dict[str, Any]:
    rows = breakdown(m)
    total = sum(seconds for _, seconds in rows)
    first = statistics.median([a.first_request for a in m.agent])
    litellm_alone = statistics.median(_walls(m.litellm_import)) - statistics.median(_walls(m.floor))
    top = sorted(m.imports, key=lambda i: i.cumulative_s, reverse=True)[:TOP_IMPORTS]
    imports_total = sum(i.cumulative_s for i in m.imports)

    print(format_table(metrics))
    print(f"\nWhere the median `agent -m {MESSAGE}` time goes ({total:.3f} s):")
    width = max(len(label) for label, _ in rows)
    for label, seconds in rows:
        print(f"  {label:<{width}}  {seconds:6.3f} s  {seconds / total:6.1%}")
    print(
        f"  litellm's import alone (import litellm - floor) = {litellm_alone:.3f} s, "
        f"{litellm_alone / first:.0%} of the time before the first request."
    )
    print(
        f"\n-X importtime, one run of `agent -m {MESSAGE}`: top-level imports, "
        f"{imports_total:.3f} s in all (importtime inflates them):"
    )
    for item in top:
        print(f"  {item.cumulative_s:7.3f} s  {item.module}")
    return {
        "metrics": [metric.as_json() for metric in metrics],
        "breakdown_s": dict(rows),
        "litellm_import_minus_floor_s": litellm_alone,
        "importtime": {
            "total_top_level_s": imports_total,
            "top": [vars(item) for item in top],
        },
        "runs": {
            "cheap": {"warmups": CHEAP_WARMUPS, "runs": CHEAP_RUNS},
            "heavy": {"warmups": HEAVY_WARMUPS, "runs": HEAVY_RUNS},
        },
        "wrapper_overhead_s": statistics.median(
            [r.parent_wall - r.wall for r in [*m.floor, *m.help]]
        ),
    }


def main() -> None:
    m = asyncio.run(measure())
    metrics = metrics_of(m)
    payload = report(m, metrics)
    path = write_results(NAME, payload)
    print(f"\nResults: {path}")
