"""The way in for nanobot's own events: what cron, the heartbeat and background tasks see
of the gate."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from loguru import logger

from nanobot.bus.events import InboundMessage
from nanobot.errors import StoreError

_T = TypeVar("_T")


class IntakePaused(StoreError):
    """Intake is stopped because the state database cannot be written: the message was not
    taken (do not acknowledge it, and do not drop it). Hand it over again in `retry_in`
    seconds, when the gate tries the store again; `reason` is what the store said."""

    def __init__(self, message: str, *, reason: str, retry_in: float) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_in = retry_in


class EventIntake(Protocol):
    """Journals and queues an event nanobot produces itself, as a chat message is."""

    async def submit(self, message: InboundMessage) -> int | None:
        """Journal `message` and queue it for the agent; its journal row, or None when an
        event with the same channel and `message_id` was submitted before (nothing is done:
        that one is answered, or will be after a restart). May be cancelled; once it has
        returned, the event's turn runs even across a crash.

        Raises:
            IntakePaused: the journal could not be written, now or by an earlier failure
                that stopped intake; nothing was taken (submit it again in `retry_in`).
        """
        ...


async def once_taken(
    hand: Callable[[], Awaitable[_T]],
    who: str,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> _T:
    """What `hand()` (a submission of nanobot's own event) returns, calling it again after
    the pause `IntakePaused` says for as long as it raises that, with one warning naming
    `who` each time: an event due while a store failure pauses intake is made late, not
    dropped. What else it raises is raised. Cancellation is safe (it only waits)."""
    while True:
        try:
            return await hand()
        except IntakePaused as exc:
            logger.warning(
                "{} waits: intake is paused ({}); handed over again in {:.0f} s",
                who,
                exc.reason,
                exc.retry_in,
            )
            await sleep(exc.retry_in)
