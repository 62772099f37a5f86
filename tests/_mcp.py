"""What the tests of `nanobot.mcp` share: the fake servers as `ServerSettings`, a running
`Connection` they can watch, the log as lines, and processes found by their command line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from loguru import logger

from nanobot.log import route_libraries
from nanobot.mcp.connection import Connection, State
from nanobot.mcp.settings import ServerSettings
from nanobot.outage import Backoff
from nanobot.tools.sandbox import Sandbox
from tests.fakes.mcp_http import SCRIPT

LEGACY = SCRIPT.with_name("mcp_legacy.py")
QUICK = Backoff((0.05, 0.1, 0.2))  # restarts without the minute-long pauses


def stdio(name: str, *options: str, script: Path = SCRIPT, **settings: Any) -> ServerSettings:
    """The fake over stdio, started bare (the sandbox is its own tests' subject)."""
    settings.setdefault("sandbox", "none")
    return ServerSettings(name, command=sys.executable, args=(str(script), *options), **settings)


def shell(name: str, script: str, *args: str, **settings: Any) -> ServerSettings:
    """A server started by `/bin/sh -c script args...` (the first of `args` is the script's
    $0): the fake behind a wrapper, say."""
    settings.setdefault("sandbox", "none")
    return ServerSettings(name, command="/bin/sh", args=("-c", script, *args), **settings)


def remote(name: str, url: str, **settings: Any) -> ServerSettings:
    return ServerSettings(name, url=url, **settings)


async def eventually(check: Callable[[], object], within: float = 30.0) -> None:
    """Return once `check()` is true; fail the test after `within` seconds. (Polled: what
    it checks is a server's state, the log or the process table, which no event tells.)"""
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - see the docstring
            await asyncio.sleep(0.02)


@asynccontextmanager
async def running(
    config: ServerSettings,
    workspace: Path,
    *,
    sandbox: Sandbox | None = None,
    hiding: Sequence[Path] = (),
    restart: Backoff = QUICK,
    watch_every: float = 30.0,
    settled: bool = True,
) -> AsyncIterator[Connection]:
    """`config`'s Connection, running in a task of its own until the block ends (then
    cancelled, as McpServers.close does); `settled`: once it left STARTING."""
    connection = Connection(
        config.name,
        config,
        workspace=workspace,
        sandbox=sandbox,
        hiding=hiding,
        restart=restart,
        watch_every=watch_every,
    )
    task = asyncio.create_task(connection.run(), name=f"test-mcp-{config.name}")
    try:
        if settled:  # bounded by its startup_timeout; the rest is for a loaded machine
            await eventually(
                lambda: connection.status.state is not State.STARTING or task.done(),
                within=config.startup_timeout + 30,
            )
        yield connection
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.contextmanager
def log_lines(level: str = "DEBUG") -> Iterator[list[str]]:
    """Every line logged meanwhile ("LEVEL message"), the SDK's and httpx's included, as
    they are written before any redactor (none is set up here): what nanobot itself says."""
    lines: list[str] = []
    sink = logger.add(
        lambda m: lines.append(str(m).rstrip("\n")), level=level, format="{level} {message}"
    )
    route_libraries(logging.DEBUG)
    try:
        yield lines
    finally:
        logger.remove(sink)


def processes_with(mark: str) -> list[int]:
    """The live processes whose command line holds `mark` (zombies left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def servers_with(mark: str) -> list[int]:
    """The fake servers themselves (python running a script of tests/fakes, or a copy of
    one) whose command line holds `mark`: not the wrappers around them (a shell, bubblewrap,
    the reaper of a bare server), whose command lines hold it too."""
    found = []
    for pid in processes_with(mark):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0] == sys.executable.encode() and argv[1].endswith(b"mcp_server.py"):
            found.append(pid)
    return found
