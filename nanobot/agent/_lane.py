"""A session's lane as the agent loop keeps it: the messages waiting for its running turn,
and the journal rows of what its turns answer."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from nanobot.bus.events import QueueMode
from nanobot.providers.base import Message
from nanobot.store import NewEntry

Delivery = Literal["one", "all"]


@dataclass
class Queued:
    """A session's messages for its running turn, and that turn's bookkeeping."""

    run_id: str | None = None
    steering: deque[Message] = field(default_factory=deque)
    follow_up: deque[Message] = field(default_factory=deque)
    next_turn: deque[Message] = field(default_factory=deque)  # each waits for a turn of its own
    inbound: dict[int, int] = field(default_factory=dict)  # id(message) -> journal row
    senders: dict[int, str] = field(default_factory=dict)  # id(message) -> platform id
    answered: list[int] = field(default_factory=list)

    @property
    def waiting(self) -> bool:
        return bool(self.steering or self.follow_up or self.next_turn)

    def queue(
        self, message: Message, mode: QueueMode, inbound_id: int | None, sender: str | None
    ) -> None:
        queues = {"steer": self.steering, "follow_up": self.follow_up, "next_turn": self.next_turn}
        queues[mode].append(message)
        self.mark(message, inbound_id, sender)

    def mark(self, message: Message, inbound_id: int | None, sender: str | None) -> None:
        """Note the journal row `message` came from and who sent it, for its entry."""
        if inbound_id is not None:
            self.inbound[id(message)] = inbound_id
        if sender is not None:
            self.senders[id(message)] = sender

    def entry(self, message: Message, run_id: str | None = None) -> NewEntry:
        """The entry for a user message, linked to its journal row if it has one, naming
        its sender if it has one."""
        inbound_id = self.inbound.pop(id(message), None)
        if inbound_id is not None:
            self.answered.append(inbound_id)
        sender = self.senders.pop(id(message), None)
        return NewEntry("message", message, run_id, inbound_id, sender)

    def after_turn(self, follow_up: Delivery) -> list[Message]:
        """What waits once a turn has ended, for a turn of its own after it: steering that
        came too late to steer, follow-ups (one at a time or all, as `follow_up` says), and
        what asked for a turn of its own. Taken out of the queues."""
        queued = [*self.steering, *take(self.follow_up, follow_up), *self.next_turn]
        self.steering.clear()
        self.next_turn.clear()
        return queued


def take(queue: deque[Message], delivery: Delivery) -> list[Message]:
    """The next message of `queue`, or all of them, taken out of it."""
    if delivery == "all":
        taken = list(queue)
        queue.clear()
        return taken
    return [queue.popleft()] if queue else []
