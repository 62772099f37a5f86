"""What the MCP client reads of the config (`mcp.servers`), as the composition root gives it:
the config tree itself stays with the app (DESIGN.md §1)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from nanobot.agent.approvals import Policy


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """One server, as `mcp.servers.<name>` configures it (see `nanobot.config.mcp`). `env`
    and `headers` hold the secrets' values."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    tools: tuple[str, ...] | None = None
    timeout: float = 60.0
    startup_timeout: float = 30.0
    approval: Policy | None = None
    approval_tools: Mapping[str, Policy] = field(default_factory=dict)
    sandbox: Literal["auto", "none"] = "auto"
    trust_annotations: bool = False
    enabled: bool = True

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    def __repr__(self) -> str:  # the secrets' values stay out of any repr
        return f"ServerSettings({self.name!r}, {self.transport})"
