"""`nanobot mcp list` and the MCP lines of `nanobot status`: each configured server, its
transport and, while a gateway runs on this data dir, its state and tools as that gateway
last recorded them (`mcp.json`). Nothing here starts a server (`nanobot mcp test` does)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nanobot.cluster.roster import moment
from nanobot.config import Config, McpServerConfig
from nanobot.manage._command import config_zone
from nanobot.manage._gateway_lock import lock_holder_of
from nanobot.mcp.servers import FILE, read_states


def mcp_list(config: Config) -> tuple[list[str], bool]:
    """Lines for `nanobot mcp list`; ok is False when a running gateway reports a server
    failed."""
    servers = config.mcp.servers
    if not servers:
        return ["no MCP servers are configured (mcp.servers; see docs/tools.md, MCP servers)"], True
    states = _running_states(config)
    lines: list[str] = []
    ok = True
    for name, server in servers.items():
        state = states.get(name) if states is not None else None
        lines.append(f"{name}: {transport(server)}; {_state_text(config, server, state, states)}")
        if state is not None and state.get("state") == "failed":
            ok = False
        for tool, info in (state or {}).get("tools", {}).items():
            hints = f" ({info['hints']})" if info.get("hints") else ""
            lines.append(f"  {tool}: {info.get('policy', '?')}{hints}")
    return lines, ok


def mcp_rows(config: Config) -> list[tuple[str, str]]:
    """One `status` row per configured server."""
    states = _running_states(config)
    return [
        (
            f"mcp {name}",
            f"{transport(server)}; "
            + _state_text(config, server, states.get(name) if states else None, states),
        )
        for name, server in config.mcp.servers.items()
    ]


def transport(server: McpServerConfig) -> str:
    """How nanobot reaches `server`, for a person."""
    if server.url is not None:
        return f"remote, {shown_url(server.url)}"
    where = "in the sandbox" if server.sandbox == "auto" else "WITHOUT the sandbox"
    return f"stdio ({server.command}), {where}"


def shown_url(url: str) -> str:
    """`url` without its user part, query and fragment, where a server's key may be
    written (`https://user:key@host/mcp?token=...`)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _state_text(
    config: Config,
    server: McpServerConfig,
    state: dict[str, Any] | None,
    states: dict[str, Any] | None,
) -> str:
    if not server.enabled:
        return "disabled (enabled: false)"
    if states is None:
        return (
            "not running: no gateway runs on this data dir (nanobot mcp test NAME starts it once)"
        )
    if state is None:
        return "not started by the running gateway (restart it to start this one)"
    when = moment(datetime.fromtimestamp(float(state.get("since", 0)), UTC), config_zone(config))
    kind = str(state.get("state", "unknown"))
    if kind == "running":
        return f"running since {when}, {len(state.get('tools', {}))} tools"
    reason = f": {state['reason']}" if state.get("reason") else ""
    return f"{kind} since {when}{reason}"


def _running_states(config: Config) -> dict[str, Any] | None:
    """What the gateway running on this data dir recorded; None when none runs."""
    if lock_holder_of(config.data_dir) is None:
        return None
    return read_states(config.data_dir / FILE) or {}
