"""A Bot API call with Telegram's error semantics: what a failure means, and how a call is
retried. Every failed call is classified in one place (`classify`):

| kind      | Telegram answered                                  | what is done                 |
|-----------|----------------------------------------------------|------------------------------|
| transient | 429 (`retry_after`), 5xx, a network error or       | `attempt` retries: a 429 is  |
|           | timeout, a garbled answer; 401/404 and 409 (the    | waited out as asked, the     |
|           | bot's token or its polling, not the message)       | rest backs off; then         |
|           |                                                    | DeliveryError (the manager   |
|           |                                                    | tries again, later)          |
| markup    | 400 "can't parse entities"                         | the chunk as plain text      |
| length    | 400 ENTITIES_TOO_LONG, "message is too long"       | shorter parts (fewer         |
|           |                                                    | entities each), then plain   |
| closed    | 403 (bot blocked, kicked, not a member, user       | Undeliverable, chat closed:  |
|           | deactivated), 400 "chat not found", a group        | nothing more goes there      |
|           | upgraded to a supergroup (ChatMigrated)            | until it writes again        |
| refused   | any other 400 ("message text is empty", "message   | Undeliverable: the reply is  |
|           | thread not found", "not enough rights", ...)       | given up at once             |

`attempt` makes a call with that policy; `Retry` says how hard it tries.
"""

from __future__ import annotations

import asyncio
import datetime as dtm
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from loguru import logger
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Forbidden,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)
from telegram.warnings import PTBDeprecationWarning

from nanobot.channels.base import DeliveryError, Undeliverable

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Retry:
    """How hard one call tries: `backoff` are the waits (seconds) before each retry after a
    network error or 5xx; flood control (429) is waited out up to `rate_limit_waits` times."""

    backoff: tuple[float, ...] = (1.0, 2.0, 4.0)
    rate_limit_waits: int = 5


ONCE = Retry(backoff=(), rate_limit_waits=0)  # best effort: stream edits, typing


def retry_after_seconds(exc: RetryAfter) -> float:
    # PTB 22 warns on every read while it moves `retry_after` from int to timedelta.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, dtm.timedelta) else float(value)


Kind = Literal["transient", "markup", "length", "closed", "refused"]

# A 400's kind by what Telegram says (lower-cased; python-telegram-bot cuts "Bad Request: ").
_BAD_REQUESTS: tuple[tuple[Kind, tuple[str, ...]], ...] = (
    ("markup", ("can't parse entities",)),
    ("length", ("entities_too_long", "message is too long", "text is too long")),
    ("closed", ("chat not found", "peer_id_invalid", "user is deactivated")),
)


def classify(exc: TelegramError) -> Kind:
    """What a failed Bot API call means for the message (see the module docstring)."""
    match exc:
        case Forbidden() | ChatMigrated():
            return "closed"
        case BadRequest(message=message):
            text = message.lower()
            for kind, marks in _BAD_REQUESTS:
                if any(mark in text for mark in marks):
                    return kind
            return "refused"
    return "transient"


async def attempt(
    call: Callable[[], Awaitable[T]], retry: Retry, *, what: str, resends: bool = False
) -> T:
    """`call()`, retried per `retry` while its failure is transient. A BadRequest that does
    not close the chat is raised as is (the caller knows what it means, and what other form
    to try); a failure that closes the chat is raised as Undeliverable; a transient one that
    outlives the retries as DeliveryError.

    `resends`: the call creates something (a message). A TimedOut request may have been
    performed all the same, so it is retried only once: a rare duplicate beats losing a
    reply, and the outbox would retry it later anyway.
    """
    backoff = iter(retry.backoff)
    waits = timeouts = 0
    while True:
        try:
            return await call()
        except RetryAfter as exc:
            waits += 1
            if waits > retry.rate_limit_waits:
                raise DeliveryError(f"{what}: rate limited by Telegram ({exc})") from exc
            await asyncio.sleep(retry_after_seconds(exc))
            continue
        except TelegramError as exc:
            kind = classify(exc)
            if kind == "closed":
                raise Undeliverable(f"{what}: {exc}", chat_closed=True) from exc
            if kind != "transient":
                raise
            if isinstance(exc, TimedOut):
                timeouts += 1
                if resends and timeouts > 1:
                    raise DeliveryError(f"{what}: timed out twice") from exc
            elif not isinstance(exc, NetworkError):  # the token, a garbled answer: not now
                raise DeliveryError(f"{what}: {exc}") from exc
            error = exc
        delay = next(backoff, None)
        if delay is None:
            raise DeliveryError(f"{what}: {error}") from error
        logger.debug("telegram {} failed ({}); retrying in {}s", what, error, delay)
        await asyncio.sleep(delay)
