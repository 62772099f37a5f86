"""The `mcp` section: the Model Context Protocol servers whose tools the model gets.

Each server is either started by nanobot (`command`: it speaks over its stdin and stdout,
inside exec's sandbox unless `sandbox: none`) or reached at a `url` (Streamable HTTP, or the
older HTTP+SSE transport where the server only speaks that). The values of `env` and
`headers` are secrets: never logged, shown or sent to the model.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from nanobot.config._section import Section, lowered
from nanobot.config.tools import Approval

SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
# The built-in tools: an MCP tool offered under one of these names would shadow it.
BUILT_IN_TOOLS = frozenset(
    {
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "web_fetch",
        "web_search",
        "message",
        "memory_search",
        "memory_get",
        "exec",
        "cron",
        "spawn",
    }
)


class McpServerConfig(Section):
    """One server: `command` (stdio) or `url` (remote), and what its tools may do."""

    enabled: bool = True
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, SecretStr] = Field(default_factory=dict)
    cwd: str | None = None  # relative to the workspace; default: the workspace itself
    url: str | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    tools: list[str] | None = None  # the tools to offer (default: every one it lists)
    timeout: float = Field(60, gt=0)  # seconds per call
    startup_timeout: float = Field(30, gt=0)  # seconds to start and list its tools
    approval: Approval | None = None  # every tool of it; None: tools.approval.other
    approval_tools: dict[str, Approval] = Field(default_factory=dict)
    sandbox: Literal["auto", "none"] = "auto"
    trust_annotations: bool = False

    _lower = field_validator("approval", mode="before")(lowered)

    @field_validator("approval_tools", mode="before")
    @classmethod
    def _lower_each(cls, value: object) -> object:
        if isinstance(value, dict):
            return {key: lowered(policy) for key, policy in value.items()}
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return env

    @field_validator("url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"must be an http:// or https:// address of an MCP server, not {url!r}"
            )
        return url.strip()

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if self.command is not None and self.url is not None:
            raise ValueError(
                "give either command (a server nanobot starts) or url (a remote server), not both"
            )
        if self.command is None and self.url is None:
            raise ValueError(
                "give command (a server nanobot starts, with args) or url (a remote server)"
            )
        if self.command is not None and not self.command.strip():
            raise ValueError("command is empty")
        if self.url is None and self.headers:
            raise ValueError("headers are for a url; a command's server takes env")
        if self.url is not None and (self.env or self.args or self.cwd is not None):
            raise ValueError("env, args and cwd are for a command; a url's server takes headers")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"


class McpConfig(Section):
    servers: dict[str, McpServerConfig] = Field(default_factory=dict)

    @field_validator("servers", mode="before")
    @classmethod
    def _keys(cls, servers: object) -> object:
        if isinstance(servers, dict):
            for name in servers:
                if isinstance(name, bool | int | float) or name is None:
                    raise ValueError(
                        f"a server named {name!r}: YAML reads a bare on, off, yes, no or a "
                        "number as that value, not a name; quote it ('off') or choose another"
                    )
        return servers

    @field_validator("servers")
    @classmethod
    def _names(cls, servers: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in servers:
            if not SERVER_NAME.fullmatch(name):
                raise ValueError(f"server name {name!r}: use letters, digits, - and _ (at most 40)")
        names = sorted(servers)
        for name in names:
            for other in names:
                # `a` and `a_b`: a tool `b_c` of the one and `c` of the other would both be
                # offered as `a_b_c`.
                if other != name and other.startswith(f"{name}_"):
                    raise ValueError(
                        f"servers {name!r} and {other!r}: the tool names of one could pass for "
                        f"the other's ({name}_…); rename one"
                    )
            for built_in in sorted(BUILT_IN_TOOLS):  # the same one named each time
                if built_in.startswith(f"{name}_"):
                    raise ValueError(
                        f"server name {name!r}: its tools could pass for the built-in "
                        f"{built_in}; choose another name"
                    )
        return servers

    def enabled(self) -> dict[str, McpServerConfig]:
        """The servers to start, by name."""
        return {name: server for name, server in self.servers.items() if server.enabled}
