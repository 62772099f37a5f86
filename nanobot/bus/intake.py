"""The way in for nanobot's own events: what cron, the heartbeat and background tasks see
of the gate."""

from __future__ import annotations

from typing import Protocol

from nanobot.bus.events import InboundMessage
from nanobot.errors import StoreError


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
