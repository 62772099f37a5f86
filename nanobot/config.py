"""nanobot's configuration: one typed tree, loaded once, failing loudly.

The YAML file is found at `--config PATH`, else `$NANOBOT_CONFIG`, else
`~/.nanobot/config.yaml`. Environment variables `NANOBOT_<SECTION>__<KEY>` override the file.
Every component receives its own section; nothing reads configuration files after start-up.
"""

from __future__ import annotations

import json
import os
import re
import stat
import types
import zoneinfo
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Self, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from nanobot.allowed_hosts import AllowedHost
from nanobot.durations import parse_duration
from nanobot.errors import ConfigError
from nanobot.outage import DEFAULT_BACKOFF, Backoff
from nanobot.sizes import parse_size

ENV_PREFIX = "NANOBOT_"
ENV_CONFIG_PATH = "NANOBOT_CONFIG"
DEFAULT_DATA_DIR = Path("~/.nanobot")
DEFAULT_CONFIG_PATH = DEFAULT_DATA_DIR / "config.yaml"


class Section(BaseModel):
    """A config section: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class AgentConfig(Section):
    model: str = "openai/gpt-4o-mini"
    api_key: SecretStr | None = None
    api_base: str | None = None
    transport: Literal["auto", "litellm", "direct"] = "auto"
    fallbacks: list[str] = Field(default_factory=list)
    max_tokens: int = Field(4096, gt=0)
    temperature: float = Field(0.3, ge=0, le=2)
    max_iterations: int = Field(20, gt=0)
    max_concurrent_turns: int = Field(1000, gt=0)
    context_window: int | None = Field(None, gt=0)
    request_timeout: float = Field(120, gt=0)
    max_retries: int = Field(3, ge=0, le=10)
    retry_max_seconds: float = Field(60, gt=0)
    max_tool_rounds: int = Field(20, gt=0)
    max_tool_calls: int = Field(50, gt=0)
    max_parallel_tools: int = Field(1, gt=0)
    max_turn_seconds: float = Field(600, gt=0)
    queue_mode: Literal["steer", "follow_up"] = "steer"
    max_subagents: int = Field(4, ge=0)
    subagent_max_iterations: int = Field(15, gt=0)
    subagent_max_seconds: float = Field(300, gt=0)
    subagent_exec: bool = False  # background tasks may use exec (when tools.exec.enabled)
    steering_delivery: Literal["one", "all"] = "one"
    follow_up_delivery: Literal["one", "all"] = "one"
    # Characters of each prompt file or memory file in the system prompt, and of all together.
    prompt_file_chars: int = Field(20_000, ge=1000)
    prompt_total_chars: int = Field(60_000, ge=1000)

    @field_validator("model")
    @classmethod
    def _model_names_its_provider(cls, model: str) -> str:
        return _model_id(model)

    @field_validator("fallbacks")
    @classmethod
    def _fallbacks_name_their_providers(cls, models: list[str]) -> list[str]:
        return [_model_id(model) for model in models]

    @model_validator(mode="after")
    def _direct_needs_a_base(self) -> Self:
        if self.transport == "direct" and not self.api_base:
            raise ValueError(
                "agent.transport: direct needs agent.api_base (the URL of an "
                "OpenAI-compatible API, e.g. http://localhost:8000/v1)"
            )
        return self


# What a model id without its provider most likely meant, by how it starts.
_USUAL_PROVIDERS = (
    (("gpt-", "o1", "o3", "o4", "chatgpt-"), "openai"),
    (("claude-",), "anthropic"),
    (("gemini-",), "gemini"),
    (("deepseek-",), "deepseek"),
    (("mistral-", "codestral-"), "mistral"),
    (("grok-",), "xai"),
)


def _model_id(model: str) -> str:
    """`model` if it names its provider (`openai/gpt-4o`): litellm would guess the provider
    of a bare `gpt-4o`, and an OpenAI-compatible server's bare model name not at all."""
    provider, _, name = model.partition("/")
    if provider.strip() and name.strip():
        return model
    problem, example = "is not <provider>/<model>", "openai/gpt-4o"
    if model.strip() and "/" not in model:
        starts = model.lower()
        guess = next((p for prefixes, p in _USUAL_PROVIDERS if starts.startswith(prefixes)), None)
        problem, example = "names no provider", f"{guess or 'openai'}/{model}"
    raise ValueError(
        f"{model!r} {problem}: write <provider>/<model>, e.g. {example} "
        "(for an OpenAI-compatible server at agent.api_base: openai/<its model name>)"
    )


class ChannelConfig(Section):
    """What every chat channel has: a switch, a secret token and who may talk to it."""

    enabled: bool = False
    token: SecretStr = SecretStr("")
    allow_from: list[str] = Field(default_factory=list)
    group_policy: Literal["mention", "open", "disabled"] = "mention"
    max_file_mb: float = Field(20, gt=0)
    # Show a reply while the model writes it (edited in place about once a second); off,
    # it arrives whole, and through litellm a turn costs under half the CPU.
    stream: bool = True
    # Platform user ids who may decide tool calls that need approval (tools.approval).
    approvers: list[str] = Field(default_factory=list)

    @field_validator("allow_from", "approvers", mode="before")
    @classmethod
    def _ids_as_strings(cls, value: object) -> object:
        # YAML reads numeric ids as ints; ids are compared as strings everywhere.
        if isinstance(value, list):
            return [str(item) if isinstance(item, int) else item for item in value]
        return value

    @field_validator("allow_from")
    @classmethod
    def _numeric_or_everyone(cls, ids: list[str]) -> list[str]:
        for user_id in ids:
            if user_id != "*" and not (user_id.isascii() and user_id.isdigit()):
                raise ValueError(
                    f"{user_id!r} is not a user id: allow_from takes numeric platform user ids "
                    '(e.g. 123456789) or "*" for everyone, not usernames, which can change; '
                    "`nanobot pairing list` shows the id of everyone who wrote to the bot"
                )
        return ids

    @field_validator("approvers")
    @classmethod
    def _numeric_approvers(cls, ids: list[str]) -> list[str]:
        for user_id in ids:
            if not user_id.isascii() or not user_id.isdigit():
                raise ValueError(
                    f"{user_id!r} is not a user id: approvers are numeric platform user ids"
                    " (e.g. 123456789), not names, and not '*'"
                )
        return ids


_WEBHOOK_PORTS = (443, 80, 88, 8443)  # the only ports Telegram posts to
_WEBHOOK_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")


class TelegramWebhookConfig(Section):
    """Webhook mode: Telegram posts every update to `url`, which a reverse proxy forwards to
    `listen`, and any gateway sharing the store may take it. Without a url: long polling."""

    url: str | None = None  # the public https:// URL Telegram posts to
    listen: str = "127.0.0.1:8443"  # host:port nanobot serves on, behind the proxy
    path: str | None = None  # the path served; default: the url's own
    secret_token: SecretStr | None = None  # Telegram sends it with every update
    max_connections: int | None = Field(None, ge=1, le=100)

    @field_validator("url")
    @classmethod
    def _https(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        text = value.strip()
        parts = urlsplit(text)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(
                f"{text!r} is not an https:// URL: Telegram posts updates only over HTTPS "
                "(put a reverse proxy with a certificate in front of nanobot, e.g. "
                "https://bot.example.com/telegram)"
            )
        try:
            port = parts.port or 443
        except ValueError:
            raise ValueError(f"{text!r} has an invalid port") from None
        if port not in _WEBHOOK_PORTS:
            raise ValueError(f"Telegram posts only to ports 443, 80, 88 or 8443, not {port}")
        if parts.fragment:
            raise ValueError(f"{text!r} has a #fragment, which is never sent: remove it")
        return text

    @field_validator("listen")
    @classmethod
    def _host_and_port(cls, value: str) -> str:
        _split_listen(value)
        return value.strip()

    @field_validator("path")
    @classmethod
    def _absolute_path(cls, value: str | None) -> str | None:
        if value is not None and (
            not value.startswith("/") or any(c in value for c in "?# ") or not value.isascii()
        ):
            raise ValueError(
                f"{value!r} is not a URL path: it starts with / and has no spaces, ? or #"
            )
        return value

    @field_validator("secret_token")
    @classmethod
    def _telegram_secret(cls, value: SecretStr | None) -> SecretStr | None:
        # The value is never shown: it is a secret.
        if value is not None and not _WEBHOOK_SECRET.fullmatch(value.get_secret_value()):
            raise ValueError(
                "must be 1 to 256 characters, each a letter A-Z or a-z, a digit, _ or - "
                "(Telegram's rule); make one with: python -c "
                "'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    @model_validator(mode="after")
    def _secret_with_url(self) -> Self:
        if self.url is not None and self.secret_token is None:
            raise ValueError(
                "a webhook url needs secret_token too (1 to 256 characters of A-Z a-z 0-9 _ -; "
                "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'): "
                "Telegram sends it with every update, and a request without it is refused"
            )
        return self

    @property
    def host(self) -> str:
        """The address `listen` names (an IPv6 one without its brackets)."""
        return _split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return _split_listen(self.listen)[1]

    @property
    def served_path(self) -> str:
        """The path nanobot takes updates on: `path`, else the url's path ("/" if none)."""
        if self.path is not None:
            return self.path
        return (urlsplit(self.url).path if self.url is not None else "") or "/"


def _split_listen(listen: str) -> tuple[str, int]:
    """`host:port` (`[v6 address]:port` for IPv6) as host and port; ValueError if it is not."""
    host, colon, port = listen.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    # Port 0: one the system picks, said in the log (for tests; a proxy needs a fixed one).
    if not colon or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(
            f"{listen!r} is not host:port, e.g. 127.0.0.1:8443 (where the reverse proxy "
            "forwards Telegram's requests to), or 0.0.0.0:8443 to listen on every address"
        )
    return host, int(port)


class TelegramConfig(ChannelConfig):
    api_base: str = "https://api.telegram.org"
    webhook: TelegramWebhookConfig = Field(default_factory=TelegramWebhookConfig)


class DiscordConfig(ChannelConfig):
    api_base: str = "https://discord.com/api/v10"
    gateway_url: str = "wss://gateway.discord.gg"


class ChannelsConfig(Section):
    telegram: TelegramConfig = Field(default_factory=TelegramConfig)
    discord: DiscordConfig = Field(default_factory=DiscordConfig)


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
        return _duration(value)

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
    other: Approval = "ask"  # every tool not listed above (MCP tools, tools added later)
    timeout: timedelta = timedelta(minutes=10)
    unattended: Literal["ask", "deny"] = "ask"

    @field_validator("*", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return _duration(value)

    @field_validator("timeout")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be longer than zero (e.g. 10m)")
        return value

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


def _duration(value: object) -> object:
    """A duration in the syntax of nanobot.durations (`10m`, `1h30m`); a plain number is
    seconds, as pydantic reads one."""
    if isinstance(value, str) and value.strip().isdigit():
        return timedelta(seconds=int(value))
    if isinstance(value, str):
        return parse_duration(value)
    return value


class CronConfig(Section):
    enabled: bool = True
    catch_up_window: timedelta = timedelta(hours=1)

    @field_validator("catch_up_window", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        # The syntax of `nanobot cron add --every` (nanobot.durations); a plain number is
        # seconds, as pydantic reads one.
        if isinstance(value, str) and value.strip().isdigit():
            return timedelta(seconds=int(value))
        if isinstance(value, str):
            return parse_duration(value)
        return value


class GatewayConfig(Section):
    shutdown_timeout: float = Field(10, gt=0)
    # uvloop where it is installed (it is a dependency except on Windows): the same asyncio
    # API, with less CPU per message; "asyncio" is the standard library's own loop.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"


class ChatTarget(Section):
    """A chat to send to: the channel and its chat id (a Discord channel id, a Telegram chat id)."""

    channel: Literal["telegram", "discord"]
    chat_id: str

    @field_validator("chat_id", mode="before")
    @classmethod
    def _id_as_string(cls, value: object) -> object:
        return str(value) if isinstance(value, int) else value


class HeartbeatConfig(Section):
    enabled: bool = False
    interval_minutes: float = Field(30, gt=0)
    deliver_to: ChatTarget | None = None


class LogConfig(Section):
    level: Literal["TRACE", "DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    json_: bool = Field(False, alias="json")

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


class StoreConfig(Section):
    """Where the state lives (sessions, pending messages and replies, cron jobs, usage,
    pairings, approvals)."""

    # sqlite:///<absolute path> (default: state.db in the data dir), or
    # postgresql://user:password@host:port/database for a state on PostgreSQL.
    url: SecretStr | None = None
    # Seconds between tries of a store that fails (nanobot.outage): the last one repeats.
    retry_seconds: tuple[float, ...] = DEFAULT_BACKOFF.pauses

    @property
    def retry(self) -> Backoff:
        return Backoff(self.retry_seconds)

    @field_validator("retry_seconds")
    @classmethod
    def _backoff(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        return Backoff(value).pauses  # its ValueError says what is wrong

    @field_validator("url")
    @classmethod
    def _known_backend(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        text = value.get_secret_value().strip()
        if text.startswith(_SQLITE_URL) and len(text) > len(_SQLITE_URL):
            return SecretStr(text)
        if text.lower().startswith(("postgresql://", "postgres://")):
            return SecretStr(text)
        # Only the scheme is shown: the rest may hold a password.
        scheme = text.split("://", 1)[0] if "://" in text else "none"
        raise ValueError(
            f"unsupported store URL (scheme {scheme!r}): use sqlite:///<absolute path of "
            "the file> or postgresql://user:password@host:port/database"
        )

    @property
    def sqlite_path(self) -> Path | None:
        """The SQLite file `url` names; None when it names none (unset, or PostgreSQL)."""
        text = self.url.get_secret_value() if self.url is not None else ""
        if not text.startswith(_SQLITE_URL):
            return None
        path = text.removeprefix(_SQLITE_URL)
        return Path(path).expanduser() if path.startswith("~") else Path("/" + path.lstrip("/"))


_SQLITE_URL = "sqlite:///"


class ClusterConfig(Section):
    """Several gateways on one store form a cluster: one member at a time plays each role
    (a channel's polling or gateway connection, the schedule of cron and the heartbeat)."""

    # Seconds a member keeps a role without renewing it (it renews every third of that):
    # when a member dies, another takes its roles over within this.
    lease_seconds: float = Field(10, ge=1, le=300)

    @property
    def lease(self) -> timedelta:
        return timedelta(seconds=self.lease_seconds)


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
        # The file's contents arrive as init kwargs; listing env first makes env win.
        return (env_settings, init_settings)

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


def config_path(explicit: Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """Where the config file is: explicit path, else $NANOBOT_CONFIG, else the default."""
    env = os.environ if env is None else env
    if explicit is not None:
        return explicit.expanduser()
    if env.get(ENV_CONFIG_PATH):
        return Path(env[ENV_CONFIG_PATH]).expanduser()
    return DEFAULT_CONFIG_PATH.expanduser()


def load(path: Path | None = None) -> Config:
    """Load the configuration from the file (see `config_path`) and the environment.

    A missing file at the default location means "all defaults"; a missing file that was
    named explicitly (argument or $NANOBOT_CONFIG) is an error.

    Raises:
        ConfigError: the file cannot be read or parsed, or a key is unknown or invalid. The
            message names the file (or environment variable), the key path and the reason.
    """
    named = path is not None or bool(os.environ.get(ENV_CONFIG_PATH))
    file = config_path(path)
    data = _read_yaml(file, must_exist=named)
    _check_env_names(os.environ)
    try:
        config = Config(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, file)) from None
    except SettingsError as exc:  # a variable `_check_env_names` let through
        raise ConfigError(f"environment: {exc}") from None
    _check_workspace(config, file)
    config._source = file
    config._file_secrets = _secrets_in(config, data)
    return config


def exposed(config: Config) -> str | None:
    """The start-up warning for a config file that sets a secret and that others than its
    owner may read or write: one line naming the file, its mode, the keys and the fix
    (`chmod 600 FILE`). None when it is private, sets no secret, or was not read from a file.

    nanobot warns and leaves the mode alone: the file is the user's, who may share it with a
    group on purpose, manage it with a tool that would set it back, or mount it read-only (as
    Docker and Kubernetes secrets are). The files nanobot writes itself are created private
    (`nanobot onboard`'s config 0600; the data dir 0700, tightened at every start).
    """
    file = config.source
    if file is None or not config._file_secrets:
        return None
    try:
        mode = stat.S_IMODE(file.stat().st_mode)
    except OSError:
        return None
    if not mode & 0o066:
        return None
    access = " and ".join(
        word for bits, word in ((0o044, "read"), (0o022, "changed")) if mode & bits
    )
    who = " and ".join(
        word for bits, word in ((0o060, "its group"), (0o006, "anyone")) if mode & bits
    )
    return (
        f"{file} holds secrets ({', '.join(config._file_secrets)}) and can be {access} by "
        f"{who} (mode {mode:04o}): run `chmod 600 {file}`"
    )


def _is_secret(text: str) -> bool:
    """Whether a secret's value gives anything away: a URL without a password (a SQLite
    store's path) does not."""
    if "://" in text:
        try:
            return urlsplit(text).password is not None
        except ValueError:
            return True
    return bool(text)


def _secrets_in(model: BaseModel, data: Mapping[str, Any], prefix: str = "") -> tuple[str, ...]:
    """The key paths of the secrets in `model` that `data` (the file's mapping) sets."""
    found: list[str] = []
    for name in type(model).model_fields:
        given = data.get(name)
        if given is None:
            continue
        value = getattr(model, name)
        if isinstance(value, SecretStr) and _is_secret(value.get_secret_value()):
            found.append(f"{prefix}{name}")
        elif isinstance(value, BaseModel) and isinstance(given, Mapping):
            found += _secrets_in(value, given, f"{prefix}{name}.")
    return tuple(found)


def _check_workspace(config: Config, file: Path) -> None:
    """The workspace is what the agent may read: it must not hold nanobot's own secrets."""
    workspace = config.workspace_path.resolve()
    for what, path in (("data_dir", config.data_dir), ("the config file", file)):
        if path.resolve().is_relative_to(workspace):
            raise ConfigError(
                f"{file}: invalid configuration\n  workspace: {config.workspace_path} holds "
                f"{what} ({path}), so the agent could read nanobot's state and secrets; "
                "choose a workspace folder that holds neither"
            )


def _read_yaml(file: Path, *, must_exist: bool) -> dict[str, Any]:
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        if must_exist:
            raise ConfigError(f"{file}: config file not found") from None
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read config file: {exc}") from None
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader: no arbitrary objects
    except _DuplicateKey as exc:
        raise ConfigError(
            f"{file}: line {exc.line}: key {exc.key!r} is set twice (first at line "
            f"{exc.first}); YAML would silently keep only the last: remove one"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(f"{file}: the top level must be a mapping of keys, not a {kind}")
    return data


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, line: int, first: int) -> None:
        super().__init__(f"duplicate key {key!r} at line {line}")
        self.key, self.line, self.first = key, line, first


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key set twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges; keys it brings may be overridden
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                first = lines.get(key)
            except TypeError:  # unhashable: the safe loader's own error follows
                continue
            if first is not None:
                raise _DuplicateKey(key, line, first)
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


def _check_env_names(env: Mapping[str, str]) -> None:
    """Every NANOBOT_* variable names a key, and one for a list or a section holds JSON.

    pydantic-settings ignores variables that match no field (a typo such as
    NANOBOT_AGENT_MODEL, one underscore, would be silently dropped), and fails on a list
    or section that is not JSON with a traceback naming neither the variable nor the form.
    """
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG_PATH:
            continue
        model: type[BaseModel] | None = Config
        annotation: object = None
        for part in name[len(ENV_PREFIX) :].lower().split("__"):
            fields = {f.alias or n: f for n, f in model.model_fields.items()} if model else {}
            field = fields.get(part)
            if field is None:
                raise ConfigError(
                    f"environment variable {name}: unknown key (nested keys are separated "
                    "by a double underscore, e.g. NANOBOT_AGENT__MODEL)"
                )
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                model = annotation
            else:
                model = None
        _check_json(name, value, annotation)


def _check_json(name: str, value: str, annotation: object) -> None:
    """A list or a section set by variable `name` must be JSON (as pydantic-settings reads
    it); if it is not, say which form is expected, with an example."""
    if not value:
        return  # not decoded: pydantic reports the empty value with the key
    if get_origin(annotation) in (Union, types.UnionType):  # X | None
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        annotation = inner[0] if len(inner) == 1 else None
    if get_origin(annotation) in (list, set, tuple, frozenset):
        items = [item.strip().strip("'\"") for item in value.strip().strip("[]").split(",")]
        expected = f"a JSON list, e.g. {name}='{json.dumps([i for i in items if i])}'"
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        key = next(iter(annotation.model_fields))
        expected = (
            f"a JSON object, e.g. {name}='{{\"{key}\": ...}}', or set one key at a time: "
            f"{name}__{key.upper()}=..."
        )
    else:
        return
    try:
        json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"environment variable {name}: not valid JSON ({exc.msg} at character {exc.pos}); "
            f"it must be {expected}"
        ) from None


def _describe(exc: ValidationError, file: Path) -> str:
    lines = [f"{file}: invalid configuration"]
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        reason = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        reason = reason.removeprefix("Value error, ")  # pydantic's prefix for our own checks
        env_name = ENV_PREFIX + "__".join(str(part) for part in error["loc"]).upper()
        origin = f" (from environment variable {env_name})" if env_name in os.environ else ""
        lines.append(f"  {key}: {reason}{origin}")
    return "\n".join(lines)
