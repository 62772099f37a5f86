"""Logging: loguru for everything, stdlib loggers routed into it, secrets scrubbed.

Libraries (python-telegram-bot, discord.py, httpx, aiohttp, litellm) log through the
stdlib; an intercepting handler forwards their records to loguru, so there is one format,
one set of sinks and one redactor. The redactor runs in loguru's patcher, once per record
and before any sink sees it, over everything a sink can write: the message, the traceback
and `extra`. It replaces known secret values (API keys, bot tokens, secrets from the
environment) and secret-shaped strings: httpx, for example, logs Telegram URLs that embed
the bot token.
"""

from __future__ import annotations

import errno
import inspect
import logging
import os
import pwd
import re
import sys
import tempfile
import traceback
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_plus

from loguru import logger

from nanobot.errors import ConfigError

if TYPE_CHECKING:
    from loguru import Message, Record, RecordException

    from nanobot.config import Config

REDACTED = "***"
TRACEBACK = "traceback"  # the `extra` key of a record's rendered, redacted traceback

_TOKEN_CHARS = "[A-Za-z0-9_-]"
# Shapes that are secret whatever their value: provider keys, Telegram bot tokens (also
# URL-encoded, and in `/bot<token>/` and `/file/bot<token>/` URLs) and Discord tokens.
_SECRET_SHAPES = re.compile(
    rf"\b(?:sk|gsk|xai)-{_TOKEN_CHARS}{{8,}}"
    rf"|\bAIza{_TOKEN_CHARS}{{30,}}"
    rf"|(?<=/bot)\d{{5,}}(?::|%3A){_TOKEN_CHARS}{{20,}}"
    rf"|(?<![\w-])\d{{5,}}(?::|%3A){_TOKEN_CHARS}{{30,}}"
    rf"|(?<![\w-]){_TOKEN_CHARS}{{23,30}}\.{_TOKEN_CHARS}{{6,7}}\.{_TOKEN_CHARS}{{27,}}"
)
# The value of a credential header, as sent or as a dict's repr: `Authorization: Bot ***`.
_SECRET_HEADERS = re.compile(
    r"(?i)(?P<head>\b(?:authorization|x-api-key|api-key)['\"]?\s*[:=]\s*['\"]?"
    r"(?:(?:bot|bearer|basic)\s+)?)[^\s'\",}]+"
)
# Environment variables whose values are secrets (checked on the upper-cased name). A value
# shorter than _MIN_ENV_SECRET is no real key: redacting "1" or "true" would garble the log.
_SECRET_ENV_SUFFIXES = ("_API_KEY", "_TOKEN", "_SECRET", "_SECRET_KEY", "_PASSWORD")
_MIN_ENV_SECRET = 8
# Library loggers: their own handlers removed, their records propagated to ours.
_LIBRARIES = (
    "aiohttp",
    "asyncio",
    "discord",
    "httpcore",
    "httpx",
    "litellm",
    "LiteLLM",
    "LiteLLM Proxy",
    "LiteLLM Router",
    "openai",
    "telegram",
    "websockets",
)
# Warnings libraries log at every start although nothing is wrong for nanobot: shown at DEBUG
# instead, so that a warning in the log still means something to look at. Each is (logger,
# start of the message).
_ROUTINE: tuple[tuple[str, str], ...] = (
    # discord.py, when a Client is made without its optional voice extras: nanobot sends
    # and reads text only.
    ("discord.client", "PyNaCl is not installed, voice will NOT be supported"),
    ("discord.client", "davey is not installed, voice will NOT be supported"),
    # discord.py, for the REST-only client that delivers replies: it never connects to the
    # gateway, so it asks for no intents (the gateway client asks for the guilds it needs).
    ("discord.state", "Guilds intent seems to be disabled"),
)
_LINE = "{time:YYYY-MM-DD HH:mm:ss.SSS} | {level: <7} | {name}: {message}\n"
_LINE_AND_TRACEBACK = _LINE + "{extra[traceback]}\n"
# Control characters (C0, DEL, C1), the line and paragraph separators, and the bidirectional
# overrides that reorder how a line is shown.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_UNPRINTABLE_BUT_NEWLINE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)


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
        # As written, as a URL carries it, and as `printable` shows it, and a Telegram
        # token's secret half alone; longest first, so a secret that contains another is
        # replaced whole.
        values = [s for s in secrets if len(s) >= 4]
        values += [half for s in values if len(half := _telegram_secret_half(s)) >= 20]
        forms = {
            form
            for secret in values
            for form in (secret, quote(secret, safe=""), quote_plus(secret), printable(secret))
        }
        self._secrets = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        text = _SECRET_HEADERS.sub(lambda match: match["head"] + REDACTED, text)
        return _SECRET_SHAPES.sub(REDACTED, text)

    def patch(self, record: Record) -> None:
        """loguru's patcher: makes the record safe for every sink, before any sees it.

        The message becomes one printable line. A traceback is rendered here, without local
        values, redacted and kept in `extra[TRACEBACK]` (each line indented, so that only a
        record starts a line at column 0); the record's exception is cleared, so no sink
        renders it again with loguru's own formatter, whose `diagnose` prints locals and
        which a JSON sink would serialize unredacted (`str(exception)`). Doing it once here
        rather than in a wrapper per sink keeps loguru's own file sink (rotation,
        retention, `enqueue`), and only strings cross to the file sink's thread.
        """
        record["message"] = self(printable(record["message"]))
        extra = {key: self._scrub(value) for key, value in record["extra"].items()}
        rendered = _render(record["exception"])
        if rendered:
            extra[TRACEBACK] = self(rendered)
        record["extra"] = extra
        record["exception"] = None

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            return self(value)
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, Mapping):
            return {self(str(k)): self._scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self._scrub(v) for v in value]
        return self(str(value))  # what a JSON sink would write (`default=str`)


def _telegram_secret_half(secret: str) -> str:
    """The secret half of a Telegram token ("<bot id>:<secret>"); "" for anything else."""
    bot_id, colon, half = secret.partition(":")
    return half if colon and bot_id.isdigit() else ""


def _render(exception: RecordException | None) -> str:
    """The traceback as Python prints it (no local values), without trailing newline; ""
    when there is none (`logger.opt(exception=True)` outside an `except`)."""
    if exception is None or exception.value is None:
        return ""
    lines = traceback.format_exception(exception.type, exception.value, exception.traceback)
    text = _UNPRINTABLE_BUT_NEWLINE.sub(_escape, "".join(lines).rstrip("\n"))
    return "\n".join(f"  {line}" if line else line for line in text.split("\n"))


def _format(record: Record) -> str:
    return _LINE_AND_TRACEBACK if TRACEBACK in record["extra"] else _LINE


class _InterceptHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        if record.levelno == logging.WARNING and _routine(record):
            level = "DEBUG"
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a library's bad format string is still logged
            # (logging's own fallback prints the record's arguments to stderr, unredacted)
            message = f"{record.msg!r} % {record.args!r}"
        # The caller is the first frame outside the logging module (loguru's recipe).
        frame, depth = inspect.currentframe(), 0
        while frame is not None and (depth == 0 or frame.f_code.co_filename == logging.__file__):
            frame, depth = frame.f_back, depth + 1
        logger.opt(depth=depth, exception=record.exc_info).log(level, message)


def _routine(record: logging.LogRecord) -> bool:
    message = str(record.msg)
    return any(record.name == name and message.startswith(start) for name, start in _ROUTINE)


def _log_uncaught(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    # Python's own hook would print the exception's text to stderr, past the redactor.
    logger.opt(exception=(kind, value, tb)).critical("unhandled {}; exiting", kind.__name__)


def route_libraries(level: int | None = None) -> None:
    """Send every stdlib logger's records through nanobot's sinks and redactor, library
    loggers at `level` (None: the level `setup` chose, kept as the root logger's), and
    uncaught exceptions through the log too.

    `setup` calls it; call it again after importing a library that installs handlers of
    its own (litellm puts a stderr handler on its loggers at import time).
    """
    if level is None:
        level = logging.getLogger().level
    logging.basicConfig(handlers=[_InterceptHandler()], level=level, force=True)
    for name in _LIBRARIES:
        library = logging.getLogger(name)
        for handler in list(library.handlers):
            library.removeHandler(handler)
        library.propagate = True
        library.setLevel(level)
    sys.excepthook = _log_uncaught


_active: Redactor | None = None  # the one `setup` installed last


def redact(text: str) -> str:
    """`text` with every secret the logs hide hidden, for what a command prints itself (an
    error's message may quote a key a server echoed). Before logging is set up, the
    environment's secrets and the secret shapes are hidden."""
    redactor = _active if _active is not None else Redactor(environment_secrets(os.environ))
    return redactor(text)


def setup(
    *,
    level: str = "INFO",
    json: bool = False,
    log_dir: Path | None = None,
    secrets: Iterable[str] = (),
    off_stderr: Collection[str] = (),
    stderr_level: str | None = None,
) -> Redactor:
    """Configure loguru sinks (stderr, and a rotating file under `log_dir` if given), at
    `level` (stderr at `stderr_level` when given).

    Library loggers are kept one level quieter than nanobot's own unless DEBUG is asked
    for. `log_dir` is made private to the user (0700, its log files 0600), also when it
    exists already. Warnings (and less) of the modules in `off_stderr` go to the file only.
    Returns the redactor in use, so callers can scrub text they print themselves. Safe to
    call more than once; each call replaces the previous configuration.

    Raises:
        OSError: `log_dir` or its log file cannot be created or written.
    """
    global _active  # noqa: PLW0603 - loguru's configuration is process-wide too
    redactor = _active = Redactor(secrets)
    logger.remove()
    logger.configure(patcher=redactor.patch)
    # `diagnose=False` everywhere although the patcher clears exceptions: a record that
    # somehow kept one must still not print local values.
    options: dict[str, Any] = {"format": _format, "serialize": json, "diagnose": False}
    shown = stderr_level or level
    logger.add(_to_stderr, level=shown, backtrace=False, filter=_shown(off_stderr), **options)
    if log_dir is not None:
        _make_private(log_dir)
        logger.add(
            log_dir / "nanobot.log",
            level=level,
            backtrace=False,
            rotation="10 MB",
            retention=5,
            encoding="utf-8",
            opener=_private_opener,
            enqueue=True,  # file writes happen on loguru's thread, not the event loop
            **options,
        )
    route_libraries(logging.DEBUG if level in ("TRACE", "DEBUG") else logging.WARNING)
    return redactor


def _to_stderr(line: Message) -> None:
    # To the `sys.stderr` of the moment, not the one at set-up: the terminal chat's prompt
    # puts one there that prints above the prompt, leaving what was typed intact.
    stream = sys.stderr
    stream.write(line)
    stream.flush()


def _shown(off_stderr: Collection[str]) -> Callable[[Record], bool]:
    hidden = frozenset(off_stderr)
    error = logger.level("ERROR").no

    def shown(record: Record) -> bool:
        return record["name"] not in hidden or record["level"].no >= error

    return shown


def _make_private(log_dir: Path) -> None:
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_dir.chmod(0o700)
    for path in log_dir.glob("nanobot*.log*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o600)


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def _secrets(config: Config) -> list[str]:
    """Every `SecretStr` in the config tree (keys, tokens, and any added later)."""
    from pydantic import BaseModel, SecretBytes, SecretStr

    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, SecretStr):
            found.append(value.get_secret_value())
        elif isinstance(value, SecretBytes):
            found.append(value.get_secret_value().decode("utf-8", errors="replace"))
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(config)
    return [secret for secret in found if secret]


def environment_secrets(environ: Mapping[str, str]) -> list[str]:
    """Values of the variables named like secrets: OPENAI_API_KEY, GITHUB_TOKEN,
    NANOBOT_CHANNELS__TELEGRAM__TOKEN, ... (names ending in one of _SECRET_ENV_SUFFIXES)."""
    return [
        value
        for name, value in environ.items()
        if name.upper().endswith(_SECRET_ENV_SUFFIXES) and len(value) >= _MIN_ENV_SECRET
    ]


def configure(config: Config, *, quiet: bool, reported: Collection[str] = ()) -> Redactor:
    """Logging as `config.log` says, with every secret of `config` and of the environment
    redacted. `quiet` keeps stderr to warnings (for commands whose stdout and stderr a person
    reads); the log file keeps `log.level` all the same. Warnings of the modules in
    `reported` go to the log file only (the command reports what they are about itself, in
    its own line).

    Raises:
        ConfigError: the data dir cannot be written (its logs, or a file in it): the
            message names the path and what is needed, in one line.
    """
    quieter = quiet and config.log.level in ("INFO", "DEBUG", "TRACE")
    try:
        redactor = setup(
            level=config.log.level,
            stderr_level="WARNING" if quieter else None,
            json=config.log.json_,
            log_dir=config.log_dir,
            secrets=[*_secrets(config), *environment_secrets(os.environ)],
            off_stderr=reported,
        )
        with tempfile.TemporaryFile(dir=config.data_dir):  # state.db and the workspace go here
            pass
    except OSError as exc:
        raise ConfigError(_unwritable(config.data_dir, exc)) from None
    return redactor


def _unwritable(data_dir: Path, exc: OSError) -> str:
    """One line: which path of the data dir could not be written, and what would fix it."""
    uid = os.geteuid()
    try:
        user = f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:  # a container's arbitrary uid
        user = f"uid {uid}"
    path = exc.filename or data_dir
    where = "" if Path(path) == data_dir else f" ({path})"
    if exc.errno == errno.EROFS:
        fix = "it is on a read-only file system: mount it read-write"
    else:
        fix = f"make it writable for that user (e.g. chown -R {uid} {data_dir})"
    return (
        f"data dir {data_dir} cannot be written{where}: {exc.strerror or exc}; nanobot keeps "
        f"its state and logs there and needs to write to it as {user}: {fix}, or set data_dir "
        "(NANOBOT_DATA_DIR) to a directory it can write"
    )
