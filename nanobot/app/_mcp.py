"""`nanobot mcp test NAME`: one server started as the gateway would start it (in exec's
sandbox, with its environment), its tools listed with their approval policy, then stopped;
and when a gateway starts its servers (`start_when_quiet`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING

from loguru import logger

from nanobot.app._exec import open_sandbox
from nanobot.app._parts import mcp_hiding, mcp_settings, private_dir
from nanobot.config import Config
from nanobot.errors import ConfigError
from nanobot.mcp.connection import LAST_WORDS, State
from nanobot.mcp.servers import McpServers
from nanobot.mcp.settings import ServerSettings
from nanobot.tools.sandbox import Sandbox
from nanobot.workspace import copy_template

if TYPE_CHECKING:
    from loguru import Message

STDERR_SHOWN = 10  # of a failed server's last stderr lines
QUIET_FOR = 1.0  # seconds without a turn, every channel tried, before the servers start
START_BY = 15.0  # seconds after the gateway's start: then the servers start, quiet or not


async def start_when_quiet(
    servers: McpServers,
    settled: Callable[[], bool],
    busy: Callable[[], bool],
    *,
    quiet_for: float = QUIET_FOR,
    start_by: float = START_BY,
) -> None:
    """Start `servers` once the gateway has answered what waited for it at its start: when
    `settled()` (each channel connected, or failed, once) and not `busy()` (no turn running)
    have held for `quiet_for` seconds, or `start_by` seconds after this was called at the
    latest (a member of a cluster runs some channels only while it holds their role).

    The first server imports the SDK (about a second of CPU, on the GIL the event loop
    needs too) and each server's own start takes the other core: begun with the gateway,
    they held up its first poll and reply by half a second (docs/benchmarks.md, MCP). The
    first turns after a start do not have the servers' tools either way: none was running
    yet. Returns once they are started; cancellable.
    """
    loop = asyncio.get_running_loop()
    latest = loop.time() + start_by
    quiet_since: float | None = None
    while (now := loop.time()) < latest:
        if not settled() or busy():
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= quiet_for:
            break
        await asyncio.sleep(0.1)  # two conditions of other parts: no event to wait on
    servers.start()


async def test_server(config: Config, name: str) -> tuple[list[str], bool]:
    """Lines saying how starting the server `name` went, and whether it ran; one that did
    not run is shown with the last lines it wrote to its stderr (redacted, as logged).

    Raises:
        ConfigError: no server has that name.
    """
    settings = {s.name: s for s in mcp_settings(config)}
    if name not in settings:
        known = ", ".join(settings) or "none are configured"
        raise ConfigError(f"no MCP server is named {name!r} in mcp.servers ({known})")
    from dataclasses import replace

    server = replace(settings[name], enabled=True)
    private_dir(config.data_dir)
    copy_template(config.workspace_path)  # the sandbox shows the workspace: it must exist
    with _stderr_of(name) as said:
        async with _sandbox_for(config, server) as sandbox:
            servers = McpServers(
                [server],
                workspace=config.workspace_path,
                sandbox=sandbox,
                hiding=mcp_hiding(config),
                other=config.tools.approval.other,
            )
            servers.start()
            try:
                await servers.settled()
                status = servers.statuses()[name]
            finally:
                await servers.close()
    if status.state is not State.RUNNING:
        logger.debug("mcp test {}: {}", name, status.reason)
        # The SDK's reason for a server that exited is only "Connection closed": what the
        # server said before it went is what tells a person why (all of it, shown below).
        reason = status.reason.partition(LAST_WORDS)[0] if said else status.reason
        lines = [f"{name}: {status.state.value}: {reason or 'no reason given'}"]
        if said:
            lines.append("  its last lines on stderr:")
            lines += [f"    {line}" for line in said[-STDERR_SHOWN:]]
        return lines, False
    bare = server.transport == "stdio" and server.sandbox == "none"
    where = f", WITHOUT the sandbox (mcp.servers.{name}.sandbox: none)" if bare else ""
    lines = [f"{name}: running{where}, {len(status.tools)} tools"]
    for tool in status.tools.values():
        rule = servers.rule_of(tool)
        hints = f"; the server says: {tool.hints()}" if tool.hints() else ""
        lines.append(f"  {tool.name}: {rule.policy} ({rule.key}){hints}")
        if tool.description:
            lines.append(f"      {tool.description.splitlines()[0][:150]}")
    return lines, True


@asynccontextmanager
async def _sandbox_for(config: Config, server: ServerSettings) -> AsyncIterator[Sandbox | None]:
    """exec's sandbox where `server` runs in it; none for a remote or a bare one (building
    it costs a second or more, and a sandbox that cannot work here is not their business)."""
    if server.transport != "stdio" or server.sandbox == "none":
        yield None
        return
    async with open_sandbox(config) as sandbox:
        yield sandbox


@contextmanager
def _stderr_of(name: str) -> Iterator[list[str]]:
    """The lines server `name` writes to its stderr while this lasts, as the MCP client
    logs them (redacted; its rate limit applies)."""
    prefix = f"MCP server {name} stderr: "
    said: list[str] = []

    def keep(message: Message) -> None:
        said.append(message.record["message"].removeprefix(prefix))

    sink = logger.add(
        keep,
        level="INFO",
        format="{message}",
        filter=lambda r: r["name"] == "nanobot.mcp.connection" and r["message"].startswith(prefix),
    )
    try:
        yield said
    finally:
        logger.remove(sink)
