"""What every benchmark shares: measured child processes, statistics, tables, JSON results."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
BIN_DIR = Path(sys.executable).parent  # the venv's bin/: not resolved, or the venv is lost
RUN_LIMIT_S = 120.0  # one measured command; beyond it the benchmark fails
COUNT_UNITS = frozenset({"chats", "calls"})  # whole numbers in tables

# Runs argv[2:] and writes, as JSON to argv[1], the child's spawn and exit times
# (time.monotonic(), one clock for every process on Linux) and its peak RSS from wait4.
# A wrapper, because asyncio's child watcher reaps the processes it starts, and their rusage
# with them; the wrapper's own start-up (~10 ms) is outside the measured interval.
_WRAPPER = """\
import json, os, sys, time
report, argv = sys.argv[1], sys.argv[2:]
start = time.monotonic()
pid = os.posix_spawn(argv[0], argv, os.environ)
_, status, usage = os.wait4(pid, 0)
end = time.monotonic()
with open(report, "w") as file:
    json.dump({"start": start, "end": end, "maxrss_kib": usage.ru_maxrss}, file)
sys.exit(os.waitstatus_to_exitcode(status))
"""


class BenchError(RuntimeError):
    """A measured command failed or misbehaved: its figures would mean nothing."""


@dataclass(frozen=True)
class Run:
    """One measured execution of a command."""

    argv: tuple[str, ...]
    code: int
    stdout: str
    stderr: str
    launched_at: float  # time.monotonic() just before the command was spawned
    exited_at: float  # time.monotonic() just after it was reaped
    peak_rss_kib: int
    parent_wall: float  # as the benchmark saw it, wrapper start-up included
    first_stdout_at: float | None  # time.monotonic() when stdout's first bytes arrived

    @property
    def wall(self) -> float:
        return self.exited_at - self.launched_at

    @property
    def peak_rss_mib(self) -> float:
        return self.peak_rss_kib / 1024

    def check(self, expected_stdout: str | None = None) -> Run:
        """Raise BenchError unless the command exited 0 (and printed ``expected_stdout``)."""
        if self.code != 0 or (expected_stdout is not None and self.stdout != expected_stdout):
            raise BenchError(
                f"{' '.join(self.argv)} exited {self.code}\n"
                f"stdout: {self.stdout!r}\nstderr (tail): {self.stderr[-2000:]}"
            )
        return self


def gateway_loop_run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on the event loop the gateway runs by default (uvloop where installed,
    `gateway.event_loop`), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def isolated_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without NANOBOT_* or PYTHON* variables; HOME is ``home``.

    NANOBOT_* would reconfigure (or, unknown, break) nanobot; PYTHON* would change what is
    measured (PYTHONPROFILEIMPORTTIME, PYTHONDEVMODE, ...). litellm reads its local price list.
    """
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("NANOBOT_", "PYTHON", "LITELLM_"))
    }
    env.update(HOME=str(home), LITELLM_LOCAL_MODEL_COST_MAP="True", **extra)
    return env


async def run_measured(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: Path | None = None,
    stdin: bytes | None = None,
) -> Run:
    """Run ``argv`` (argv[0] an absolute path) to completion; its stdin is ``stdin`` (a
    little: it is written whole before stdout is read), else /dev/null."""
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-") as tmp:
        report = Path(tmp) / "rusage.json"
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            "-c",
            _WRAPPER,
            str(report),
            *argv,
            env=dict(env),
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # so a timeout can kill the command with the wrapper
        )
        try:
            async with asyncio.timeout(RUN_LIMIT_S):
                if stdin is not None:
                    assert process.stdin is not None
                    process.stdin.write(stdin)
                    await process.stdin.drain()
                    process.stdin.close()
                assert process.stdout is not None and process.stderr is not None
                (stdout, first_stdout_at), stderr, _ = await asyncio.gather(
                    _read_timed(process.stdout), process.stderr.read(), process.wait()
                )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            raise BenchError(f"{' '.join(argv)} took more than {RUN_LIMIT_S} s") from None
        parent_wall = time.monotonic() - started
        try:
            data = json.loads(report.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BenchError(f"no report from the wrapper of {' '.join(argv)}: {stderr!r}") from exc
    assert process.returncode is not None
    return Run(
        argv=tuple(argv),
        code=process.returncode,
        stdout=stdout.decode(errors="replace"),
        stderr=stderr.decode(errors="replace"),
        launched_at=float(data["start"]),
        exited_at=float(data["end"]),
        peak_rss_kib=int(data["maxrss_kib"]),
        parent_wall=parent_wall,
        first_stdout_at=first_stdout_at,
    )


async def _read_timed(stream: asyncio.StreamReader) -> tuple[bytes, float | None]:
    """All of ``stream``, and the time.monotonic() at which its first bytes arrived."""
    chunks: list[bytes] = []
    first: float | None = None
    while chunk := await stream.read(65536):
        if first is None:
            first = time.monotonic()
        chunks.append(chunk)
    return b"".join(chunks), first


@dataclass(frozen=True)
class Stats:
    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        if not values:
            raise ValueError("no values")
        return cls(statistics.median(values), min(values), max(values), len(values))


@dataclass
class Metric:
    """One measured figure: its values over the runs and, if it has one, its target."""

    name: str
    unit: str  # "s", "ms", "MiB", "x" (a ratio), or a count (COUNT_UNITS)
    values: list[float]
    target: float | None = None  # the median must be at most this
    note: str = ""
    stats: Stats = field(init=False)

    def __post_init__(self) -> None:
        self.stats = Stats.of(self.values)

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.stats.median <= self.target

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "median": self.stats.median,
            "min": self.stats.min,
            "max": self.stats.max,
            "n": self.stats.n,
            "target": self.target,
            "met": self.met,
            "note": self.note,
            "values": self.values,
        }


def _number(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "x":
        return f"{value:.2f}x"
    if unit in COUNT_UNITS:
        return f"{value:.0f} {unit}"
    return f"{value:.1f} {unit}"


def format_table(metrics: Sequence[Metric]) -> str:
    """A plain-text table: metric, median, min, max, n, target, met."""
    header = ("metric", "median", "min", "max", "n", "target", "met")
    rows: list[tuple[str, ...]] = [header]
    for m in metrics:
        single = m.stats.n == 1
        rows.append(
            (
                m.name,
                _number(m.stats.median, m.unit),
                "" if single else _number(m.stats.min, m.unit),
                "" if single else _number(m.stats.max, m.unit),
                str(m.stats.n),
                "" if m.target is None else "<= " + _number(m.target, m.unit),
                {None: "", True: "yes", False: "NO"}[m.met],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """What the figures depend on: CPUs, Python, platform, key library versions."""
    versions: dict[str, str] = {}
    for name in ("nanobot", "litellm", "pydantic", "typer", "python-telegram-bot"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "load_average": os.getloadavg(),  # 1, 5, 15 min, as the results were written
        "packages": versions,
    }


def write_results(name: str, payload: Mapping[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` (with a timestamp and the machine) and return it."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    document = {
        "benchmark": name,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        **payload,
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def git_state() -> dict[str, str | bool]:
    """The commit measured, and whether the tree had changes (read-only git commands)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"commit": commit, "dirty": bool(status.strip())}
