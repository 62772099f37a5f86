"""The store's section: where the state lives, SQLite or PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr, field_validator

from nanobot.config._section import Section
from nanobot.outage import DEFAULT_BACKOFF, Backoff


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
