"""Logging: loguru for everything, stdlib loggers routed into it, secrets scrubbed.

Libraries (python-telegram-bot, discord.py, httpx, litellm) log through the stdlib; an
intercepting handler forwards their records to loguru so there is one format and one set of
sinks. Every message passes through a redactor that replaces known secret values (API keys,
bot tokens) before any sink sees it: httpx, for example, logs Telegram URLs that embed the
bot token.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from loguru import logger

if TYPE_CHECKING:
    from loguru import Record

    from nanobot.config import Config

REDACTED = "***"

# Shapes that are secret whatever their value: provider keys and bot tokens in URLs.
_SECRET_SHAPES = re.compile(
    r"(?P<key>\bsk-[A-Za-z0-9_\-]{8,})|(?P<bot>(?<=/bot)\d{5,}:[A-Za-z0-9_\-]{20,})"
)
_NOISY_LIBRARIES = ("httpx", "httpcore", "telegram", "discord", "LiteLLM", "litellm")
# Control characters (C0, DEL, C1), the line and paragraph separators, and the bidirectional
# overrides that reorder how a line is shown.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` from outside (a chat user's name or message) made safe to show on one line of a
    log or a terminal: every control character becomes a visible escape (`\\n`, `\\x1b`,
    `\\u202e`), so it can neither forge a log line nor move the cursor."""
    return _UNPRINTABLE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


class Redactor:
    """Replaces secret values and secret-shaped strings in log text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return _SECRET_SHAPES.sub(REDACTED, text)

    def patch(self, record: Record) -> None:
        record["message"] = self(record["message"])
        if record["exception"] is not None and record["exception"].value is not None:
            value = record["exception"].value
            value.args = tuple(self(a) if isinstance(a, str) else a for a in value.args)


class _InterceptHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        logger.opt(depth=6, exception=record.exc_info).log(level, record.getMessage())


def setup(
    *,
    level: str = "INFO",
    json: bool = False,
    log_dir: Path | None = None,
    secrets: Iterable[str] = (),
) -> Redactor:
    """Configure loguru sinks (stderr, and a rotating file under `log_dir` if given).

    Library loggers are kept one level quieter than nanobot's own unless DEBUG is asked
    for. Returns the redactor in use, so callers can scrub text they print themselves.
    Safe to call more than once; each call replaces the previous configuration.
    """
    redactor = Redactor(secrets)
    logger.remove()
    logger.configure(patcher=redactor.patch)
    fmt = "{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <7} | {name}: {message}"
    logger.add(sys.stderr, level=level, format=fmt, serialize=json, backtrace=False)
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        logger.add(
            log_dir / "nanobot.log",
            level=level,
            format=fmt,
            serialize=json,
            rotation="10 MB",
            retention=5,
            encoding="utf-8",
            enqueue=True,  # file writes happen on loguru's thread, not the event loop
        )
    library_level = logging.DEBUG if level in ("TRACE", "DEBUG") else logging.WARNING
    logging.basicConfig(handlers=[_InterceptHandler()], level=library_level, force=True)
    for name in _NOISY_LIBRARIES:
        logging.getLogger(name).setLevel(library_level)
    return redactor


def _secrets(config: Config) -> list[str]:
    channels = config.channels
    values = [
        config.agent.api_key,
        channels.telegram.token,
        channels.discord.token,
        config.tools.web.search_api_key,
    ]
    return [v.get_secret_value() for v in values if v is not None and v.get_secret_value()]


def configure(config: Config, *, quiet: bool) -> Redactor:
    """Logging as `config.log` says, with every secret of `config` redacted. `quiet` keeps
    stderr to warnings (for commands whose stdout and stderr a person reads)."""
    level = "WARNING" if quiet and config.log.level in ("INFO", "DEBUG", "TRACE") else None
    return setup(
        level=level or config.log.level,
        json=config.log.json_,
        log_dir=config.log_dir,
        secrets=_secrets(config),
    )
