"""The way in for nanobot's own events: what cron, the heartbeat and background tasks see
of the gate."""

from __future__ import annotations

from typing import Protocol

from nanobot.bus.events import InboundMessage


class EventIntake(Protocol):
    """Journals and queues an event nanobot produces itself, as a chat message is."""

    async def submit(self, message: InboundMessage) -> int | None:
        """Journal `message` and queue it for the agent; its journal row, or None when an
        event with the same channel and `message_id` was submitted before (nothing is done:
        that one is answered, or will be after a restart). May be cancelled; once it has
        returned, the event's turn runs even across a crash.

        Raises:
            StoreError: the journal could not be written; nothing was taken.
        """
        ...
