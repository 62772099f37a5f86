"""The way in for nanobot's own events: what cron, the heartbeat and background tasks see
of the gate."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from nanobot.bus.events import InboundMessage
from nanobot.errors import StoreError
from nanobot.outage import Outage, Sleep, sleep_or_wake

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
    now: Callable[[], float] = time.monotonic,
    sleep: Sleep = sleep_or_wake,
) -> _T:
    """What `hand()` (a submission of nanobot's own event) returns, calling it again after
    the pause `IntakePaused` says for as long as it raises that: an event due while a store
    failure pauses intake is made late, not dropped. Said as an outage of `who`'s
    (`nanobot.outage`): one warning when it first waits, one when it is handed over. What
    else it raises is raised. Cancellation is safe (it only waits). `now` and `sleep`: the
    clock the pauses run on."""
    outage = Outage(
        failing=f"{who} waits",
        effect="intake is paused; it is handed over once intake takes it",
        back=f"{who} is handed over",
        now=now,
        sleep=sleep,
    )
    while True:
        try:
            result = await hand()
        except IntakePaused as exc:
            outage.failed(exc.reason, retry_in=exc.retry_in)
            await outage.wait()
            continue
        outage.recovered()
        return result
