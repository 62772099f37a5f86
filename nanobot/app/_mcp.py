"""`nanobot mcp test NAME`: one server started as the gateway would start it (in exec's
sandbox, with its environment), its tools listed with their approval policy, then stopped."""

from __future__ import annotations

from loguru import logger

from nanobot.app._exec import open_sandbox
from nanobot.app._parts import mcp_settings, private_dir
from nanobot.config import Config
from nanobot.errors import ConfigError
from nanobot.mcp.connection import State
from nanobot.mcp.servers import McpServers
from nanobot.workspace import copy_template


async def test_server(config: Config, name: str) -> tuple[list[str], bool]:
    """Lines saying how starting the server `name` went, and whether it ran.

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
    async with open_sandbox(config) as sandbox:
        servers = McpServers(
            [server],
            workspace=config.workspace_path,
            sandbox=sandbox,
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
        return [f"{name}: {status.state.value}: {status.reason or 'no reason given'}"], False
    lines = [f"{name}: running, {len(status.tools)} tools"]
    for tool in status.tools.values():
        rule = servers.rule_of(tool)
        hints = f"; the server says: {tool.hints()}" if tool.hints() else ""
        lines.append(f"  {tool.name}: {rule.policy} ({rule.key}){hints}")
        if tool.description:
            lines.append(f"      {tool.description.splitlines()[0][:150]}")
    return lines, True
