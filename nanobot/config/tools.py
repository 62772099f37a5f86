"""The tools' section: exec and its sandbox limits, the web tools, and approvals."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator

from nanobot.allowed_hosts import AllowedHost
from nanobot.config._section import Section, duration, lowered, positive
from nanobot.sizes import parse_size


class ExecLimitsConfig(Section):
    """What one sandboxed command may take (`nanobot.tools.limits`); null lifts a limit.
    Sizes as `nanobot.sizes` reads them (`512MB`, `1GB`), durations as `nanobot.durations`
    (`90s`, `5m`; a plain number is seconds)."""

    processes: int | None = Field(256, gt=0)
    memory: int | None = Field(1024**3, gt=0)
    cpu_time: timedelta | None = timedelta(minutes=5)
    open_files: int | None = Field(1024, gt=0)
    file_size: int | None = Field(1024**3, gt=0)
    tmp_size: int | None = Field(256 * 1024**2, gt=0)
    disk_reserve: int | None = Field(200 * 1024**2, gt=0)

    @field_validator("memory", "file_size", "tmp_size", "disk_reserve", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        if isinstance(value, int | float):  # bool too: it is an int
            raise ValueError(f"{value!r} has no unit: write a size with one, e.g. '512MB' or '1GB'")
        return parse_size(value) if isinstance(value, str) else value

    @field_validator("cpu_time", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return duration(value)

    @field_validator("cpu_time")
    @classmethod
    def _whole_seconds(cls, value: timedelta | None) -> timedelta | None:
        # The kernel counts CPU time limits in whole seconds.
        if value is not None and value.total_seconds() < 1:
            raise ValueError(f"must be at least 1 second, not {value.total_seconds():g} s")
        return value

    @field_validator("open_files")
    @classmethod
    def _enough_files(cls, value: int | None) -> int | None:
        # Below a few dozen, the shell and the dynamic loader themselves fail to start.
        if value is not None and value < 32:
            raise ValueError(f"must be at least 32 (a shell needs a few), not {value}")
        return value


class ExecConfig(Section):
    enabled: bool = True
    timeout: float = Field(60, gt=0)
    # auto: bubblewrap where it works, else exec is refused (never run bare); bwrap: it must
    # work or start-up fails; none: no sandbox, commands run with nanobot's own rights.
    sandbox: Literal["auto", "bwrap", "none"] = "auto"
    # public: a network of its own, out only through nanobot's proxy to public addresses;
    # none: no network; host: the host's own (its loopback services too).
    network: Literal["public", "none", "host"] = "public"
    allow_hosts: list[str] = Field(default_factory=list)  # host[:port] public may reach
    deny_patterns: list[str] | None = None
    limits: ExecLimitsConfig = Field(default_factory=ExecLimitsConfig)
    # Set when the file said `network: true/false` (the old form): said once at start.
    _legacy_network: bool | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _legacy(cls, data: Any, handler: Any) -> ExecConfig:
        given = data.get("network") if isinstance(data, dict) else None
        # YAML gives a bool; an environment variable (NANOBOT_TOOLS__EXEC__NETWORK) a string.
        legacy = (
            {"true": True, "false": False}.get(str(given).lower()) if given is not None else None
        )
        if legacy is not None:
            data = {**data, "network": "public" if legacy else "none"}
        config: ExecConfig = handler(data)
        config._legacy_network = legacy
        return config

    @field_validator("allow_hosts")
    @classmethod
    def _hosts(cls, entries: list[str]) -> list[str]:
        return [AllowedHost.parse(entry).text for entry in entries]

    def allowed_hosts(self) -> tuple[AllowedHost, ...]:
        return tuple(AllowedHost.parse(entry) for entry in self.allow_hosts)

    @property
    def legacy_network(self) -> bool | None:
        """The old boolean the config gave for `network`, if it did."""
        return self._legacy_network

    @field_validator("deny_patterns")
    @classmethod
    def _compiles(cls, patterns: list[str] | None) -> list[str] | None:
        for pattern in patterns or ():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
        return patterns


class WebConfig(Section):
    search_api_key: SecretStr = SecretStr("")
    fetch_max_bytes: int = Field(2_000_000, gt=0)
    fetch_timeout: float = Field(20, gt=0)
    fetch_allow_hosts: list[str] = Field(default_factory=list)


Approval = Literal["allow", "ask", "deny"]


class ApprovalConfig(Section):
    """Which tool calls ask a person first (`allow | ask | deny` per tool), how long a
    request waits, and what scheduled and heartbeat turns do when one would ask."""

    exec: Approval = "ask"
    cron: Approval = "ask"  # creating or changing jobs; listing them never asks
    spawn: Approval = "allow"
    read_file: Approval = "allow"
    write_file: Approval = "allow"
    edit_file: Approval = "allow"
    list_dir: Approval = "allow"
    web_fetch: Approval = "allow"
    web_search: Approval = "allow"
    message: Approval = "allow"
    memory_search: Approval = "allow"
    memory_get: Approval = "allow"
    other: Approval = "ask"  # every tool not listed above (tools added later)
    timeout: timedelta = timedelta(minutes=10)
    unattended: Literal["ask", "deny"] = "ask"

    _lower = field_validator("*", mode="before")(lowered)

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return duration(value)

    _positive = field_validator("timeout")(positive)

    def policies(self) -> dict[str, Approval]:
        """Each listed tool's policy, by tool name (`other` applies to the rest)."""
        settings = {"other", "timeout", "unattended"}
        return {
            name: getattr(self, name) for name in type(self).model_fields if name not in settings
        }


class ToolsConfig(Section):
    restrict_to_workspace: bool = True
    exec: ExecConfig = Field(default_factory=ExecConfig)
    web: WebConfig = Field(default_factory=WebConfig)
    approval: ApprovalConfig = Field(default_factory=ApprovalConfig)
