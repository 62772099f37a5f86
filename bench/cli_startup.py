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
arrival of the first request is known on the same monotonic clock as the CLI's spawn. What
is recorded, and the figures and the breakdown made of it, are bench/_cli_startup_figures.py.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from bench import _original
from bench._cli_startup_figures import (
    MESSAGE,
    AgentRun,
    ImportRun,
    ImportTime,
    Measurements,
    metrics_of,
    parse_importtime,
    report,
)
from bench._common import (
    BIN_DIR,
    BenchError,
    Run,
    isolated_env,
    run_measured,
    write_results,
)
from tests.fakes.llm import FakeLLM

NAME = "cli_startup"
CHEAP_WARMUPS, CHEAP_RUNS = 2, 15  # python -c pass, --help, import nanobot.app
HEAVY_WARMUPS, HEAVY_RUNS = 1, 7  # anything importing litellm (~4-5 s each), the original

PYTHON = sys.executable
NANOBOT = str(BIN_DIR / "nanobot")


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


def main() -> None:
    load = os.getloadavg()
    m = asyncio.run(measure())
    metrics = metrics_of(m)
    runs = {
        "cheap": {"warmups": CHEAP_WARMUPS, "runs": CHEAP_RUNS},
        "heavy": {"warmups": HEAVY_WARMUPS, "runs": HEAVY_RUNS},
    }
    payload = report(m, metrics, runs) | {"load_average_at_start": load}
    path = write_results(NAME, payload)
    print(f"\nResults: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
