"""Helpers of ``bench/mcp.py``: one MCP tool call over stdio, nanobot's way and the bare SDK's.

Everything runs in the benchmark's process, on the event loop the gateway runs (uvloop),
after the gateway's garbage-collector tuning. nanobot's calls go through `open_parts`, as
`nanobot agent` builds them from a config file: the registry's `execute` (argument check
against the tool's schema, the call, the result turned into a `ToolResult` inside the
untrusted-content markers, its taint added to the turn's) with a turn's `ToolContext` set.
The baseline is `mcp.Client` over stdio, alone, calling the same tool of another copy of the
same fake server (tests/fakes/mcp_server.py). The ways alternate call by call, their order
rotating, so a change in the machine's load falls on all alike.
"""

from __future__ import annotations

import gc
import shutil
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench._common import REPO_ROOT, BenchError
from nanobot.app import open_parts
from nanobot.config.loading import load
from nanobot.launch import GC_YOUNG_THRESHOLD
from nanobot.mcp.connection import State
from nanobot.tools.base import ToolContext, current_context
from nanobot.tools.registry import ToolRegistry

SCRIPT = REPO_ROOT / "tests" / "fakes" / "mcp_server.py"
SERVER_FILE = "fake_mcp_server.py"  # the fake's copy in the workspace, where a sandbox sees it
SDK, BARE, BOXED = "sdk", "nanobot", "nanobot, sandboxed"
# The server names in the config: the tools are offered as bare_echo and boxed_echo.
SERVER_OF = {BARE: "bare", BOXED: "boxed"}
TOOL = "echo"
MARKER = "<untrusted_content "

Call = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class Timed:
    """The calls of one way with one payload: wall and CPU time of each, in ms."""

    first_ms: float  # the way's first call (nanobot's: the argument checker's import too)
    wall_ms: list[float]
    cpu_ms: list[float]  # this process's CPU (`time.process_time`): the client's side only


@dataclass(frozen=True)
class Measured:
    """What `measure` found: payload -> way -> its calls, and why a way is absent."""

    timed: dict[str, dict[str, Timed]]
    missing: dict[str, str]


def write_config(root: Path) -> Path:
    """A config file under `root`: a data dir there, two servers running the fake from the
    workspace, one bare (`sandbox: none`) and one in exec's sandbox (the default)."""
    workspace = root / "data" / "workspace"
    workspace.mkdir(parents=True)
    shutil.copy(SCRIPT, workspace / SERVER_FILE)
    server = {"command": sys.executable, "args": [SERVER_FILE], "startup_timeout": 60}
    config = {
        "data_dir": str(root / "data"),
        "mcp": {"servers": {"bare": server | {"sandbox": "none"}, "boxed": server}},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    path.chmod(0o600)
    return path


@asynccontextmanager
async def _sdk(workspace: Path) -> AsyncIterator[Call]:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[SERVER_FILE], cwd=workspace)
    async with Client(params) as client:

        async def call(text: str) -> None:
            result = await client.call_tool(TOOL, {"text": text})
            block = result.content[0] if result.content else None
            if result.is_error or getattr(block, "text", None) != text:
                raise BenchError(f"the SDK's {TOOL} answered {result!r}")

        yield call


def _ours(tools: ToolRegistry, name: str) -> Call:
    async def call(text: str) -> None:
        result = await tools.execute(name, {"text": text})
        if result.is_error or not result.content.startswith(MARKER) or text not in result.content:
            raise BenchError(f"nanobot's {name} answered {result.content[:300]!r}")

    return call


async def _timed(call: Call, text: str) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    await call(text)
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


async def _alternate(
    ways: Mapping[str, Call], payloads: Mapping[str, str], *, warmups: int, calls: int
) -> dict[str, dict[str, Timed]]:
    names = list(ways)
    first: dict[tuple[str, str], float] = {}
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for index in range(warmups + calls):
        shift = index % len(names)
        for payload, text in payloads.items():
            for way in names[shift:] + names[:shift]:
                spent, used = await _timed(ways[way], text)
                first.setdefault((payload, way), spent)
                if index >= warmups:
                    wall.setdefault((payload, way), []).append(spent)
                    cpu.setdefault((payload, way), []).append(used)
    return {
        payload: {w: Timed(first[payload, w], wall[payload, w], cpu[payload, w]) for w in names}
        for payload in payloads
    }


async def measure(root: Path, payloads: Mapping[str, str], *, warmups: int, calls: int) -> Measured:
    """Start both servers and the SDK's, then time `warmups` + `calls` calls of each way
    with each payload (the warm-ups' times are not kept, but the first call's is)."""
    config = load(write_config(root))
    async with (
        open_parts(config, require_key=False) as parts,
        _sdk(config.workspace_path) as sdk,
    ):
        servers = parts.servers
        assert servers is not None
        if parts.sandbox is not None:
            parts.sandbox.prepare()  # as the gateway does
        await servers.settled()
        statuses = servers.statuses()
        ways: dict[str, Call] = {SDK: sdk}
        missing: dict[str, str] = {}
        for way, server in SERVER_OF.items():
            status = statuses[server]
            if status.state is State.RUNNING:
                ways[way] = _ours(parts.tools, f"{server}_{TOOL}")
            else:
                missing[way] = f"{status.state.value}: {status.reason}"
        if BARE in missing:
            raise BenchError(f"the bare server did not start: {missing[BARE]}")
        _tune_garbage_collection()
        context = ToolContext("bench", "1", "bench:1", "bench-run", private=True)
        token = current_context.set(context)
        try:
            timed = await _alternate(ways, payloads, warmups=warmups, calls=calls)
        finally:
            current_context.reset(token)
        if not context.taint:
            raise BenchError("nanobot's MCP results did not taint the turn")
    return Measured(timed, missing)


def _tune_garbage_collection() -> None:
    """As the gateway does once started (nanobot/launch.py): start-up's heap frozen, the
    youngest generation collected every GC_YOUNG_THRESHOLD objects."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def describe(measured: Measured) -> dict[str, Any]:
    """The raw values, for the results file."""
    return {
        "missing": measured.missing,
        "timed": {
            payload: {
                way: {"first_ms": t.first_ms, "wall_ms": t.wall_ms, "cpu_ms": t.cpu_ms}
                for way, t in ways.items()
            }
            for payload, ways in measured.timed.items()
        },
    }
