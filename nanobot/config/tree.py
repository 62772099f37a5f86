"""The whole configuration: one settings tree of the sections, the environment over the file."""

from __future__ import annotations

import zoneinfo
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from nanobot.config.agent import AgentConfig
from nanobot.config.automation import CronConfig, HeartbeatConfig
from nanobot.config.budget import BudgetConfig
from nanobot.config.channels import ChannelsConfig
from nanobot.config.gateway import ClusterConfig, GatewayConfig, LogConfig
from nanobot.config.mcp import McpConfig
from nanobot.config.media import DocumentsConfig, TranscriptionConfig, TtsConfig
from nanobot.config.people import PeopleConfig
from nanobot.config.store import StoreConfig
from nanobot.config.tools import ToolsConfig

ENV_PREFIX = "NANOBOT_"
DEFAULT_DATA_DIR = Path("~/.nanobot")


class Config(BaseSettings):
    """The whole configuration. Build it with `load()`, not directly."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_assignment=True,
        populate_by_name=True,
    )

    data_dir: Path = DEFAULT_DATA_DIR
    workspace: Path | None = None
    timezone: str | None = None
    agent: AgentConfig = Field(default_factory=AgentConfig)
    channels: ChannelsConfig = Field(default_factory=ChannelsConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    cron: CronConfig = Field(default_factory=CronConfig)
    heartbeat: HeartbeatConfig = Field(default_factory=HeartbeatConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)
    transcription: TranscriptionConfig = Field(default_factory=TranscriptionConfig)
    documents: DocumentsConfig = Field(default_factory=DocumentsConfig)
    tts: TtsConfig = Field(default_factory=TtsConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    people: PeopleConfig = Field(default_factory=PeopleConfig)
    # The file this was loaded from (None when built directly): a secret to keep out of
    # the sandbox like the data dir.
    _source: Path | None = PrivateAttr(default=None)
    # The keys of the secrets the file itself sets (not the environment): `exposed` says so.
    _file_secrets: tuple[str, ...] = PrivateAttr(default=())

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's contents arrive as init kwargs; listing env first makes env win. The
        # servers' variables were merged into them already, with their case (`_env_servers`).
        return (_BesideServers(settings_cls, env_settings), init_settings)

    @field_validator("data_dir", "workspace", mode="after")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                zoneinfo.ZoneInfo(value)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"unknown IANA time zone {value!r}") from None
        return value

    @property
    def source(self) -> Path | None:
        """The config file `load()` read this from (whether or not it existed)."""
        return self._source

    @property
    def workspace_path(self) -> Path:
        return self.workspace if self.workspace is not None else self.data_dir / "workspace"

    @property
    def state_db_path(self) -> Path:
        """The SQLite file of the state: store.url's, else state.db in the data dir (unused
        when the state is on PostgreSQL)."""
        return self.store.sqlite_path or self.data_dir / "state.db"

    @property
    def store_target(self) -> Path | str:
        """What opens the state (`Database.open`): the SQLite file, or the PostgreSQL URL,
        password included (never to be shown; the store redacts it)."""
        url = self.store.url.get_secret_value() if self.store.url is not None else ""
        return url if url and self.store.sqlite_path is None else self.state_db_path

    @property
    def shared_store(self) -> bool:
        """Whether the state is on PostgreSQL, where several gateways may share it (a
        cluster: work is shared out, roles are leased)."""
        return isinstance(self.store_target, str)

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"


class _BesideServers(PydanticBaseSettingsSource):
    """The environment's settings less `mcp.servers`, which `load` reads itself: pydantic-
    settings would lowercase the names below a server (its env's variable names)."""

    def __init__(self, settings_cls: type[BaseSettings], env: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        self._env = env

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._env.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        values = self._env()
        mcp = values.get("mcp")
        if isinstance(mcp, dict) and "servers" in mcp:
            rest = {key: value for key, value in mcp.items() if key != "servers"}
            values = {key: value for key, value in values.items() if key != "mcp"}
            if rest:
                values["mcp"] = rest
        return values
