"""The chat channels' sections: who may talk to the bot, and Telegram's webhook."""

from __future__ import annotations

import re
from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from nanobot.config._section import Section

VoiceReplies = Literal["off", "when_spoken", "always"]


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
    # Replies also sent spoken (needs tts.model): never, when the message was a voice note,
    # or always; each chat may choose otherwise with /voice.
    voice_replies: VoiceReplies = "off"

    @field_validator("voice_replies", mode="before")
    @classmethod
    def _voice_word(cls, value: object) -> object:
        # YAML 1.1 reads a bare `off` as false (and `on` as true, which names no mode).
        if value is False:
            return "off"
        if value is True:
            raise ValueError("is one of off, when_spoken, always (`on` names none of them)")
        return value.strip().lower() if isinstance(value, str) else value

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
