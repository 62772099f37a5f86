"""When a gateway starts its MCP servers (`nanobot.app._mcp.start_when_quiet`): once every
channel has tried to connect and no turn has run for a while, or at the latest after a
bound, so the SDK's import never holds up the replies a start owes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nanobot.app._mcp import start_when_quiet
from nanobot.mcp.servers import McpServers


class Recorded(McpServers):
    """No server of its own: only whether, and when in the story, it was started."""

    def __init__(self, workspace: Path) -> None:
        super().__init__([], workspace=workspace, sandbox=None)
        self.started = asyncio.Event()

    def start(self) -> None:
        self.started.set()


async def test_the_servers_wait_for_the_channels_and_a_quiet_spell(tmp_path: Path) -> None:
    servers = Recorded(tmp_path)
    state = {"settled": False, "busy": False}
    waiting = asyncio.create_task(
        start_when_quiet(
            servers,
            lambda: state["settled"],
            lambda: state["busy"],
            quiet_for=0.3,
            start_by=60,
        )
    )
    try:
        await asyncio.sleep(0.5)
        assert not servers.started.is_set(), "started before the channels tried"
        state.update(settled=True, busy=True)  # the first poll brought a message
        await asyncio.sleep(0.5)
        assert not servers.started.is_set(), "started during the first turn"
        state["busy"] = False
        async with asyncio.timeout(10):
            await servers.started.wait()
        await waiting
    finally:
        waiting.cancel()


async def test_the_servers_start_by_the_bound_whatever_the_channels_do(tmp_path: Path) -> None:
    servers = Recorded(tmp_path)
    async with asyncio.timeout(10):
        await start_when_quiet(servers, lambda: False, lambda: True, start_by=0.2)
    assert servers.started.is_set()
