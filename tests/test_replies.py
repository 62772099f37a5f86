"""Replies: the stream state machine shared by the chat channels, without a platform."""

from __future__ import annotations

import asyncio

import pytest

from nanobot.bus.events import ChatRef, OutboundMessage, StreamUpdate
from nanobot.channels._replies import Replies
from nanobot.channels.base import Undeliverable
from tests.fakes.outbox import MemoryOutbox

CHAT = ChatRef("test", "1")


class Outlet:
    """Records what would reach the platform."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.edits: list[tuple[int, str]] = []

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None) -> int:
        self.sent.append(text)
        return len(self.sent)

    async def edit(self, chat: ChatRef, message_id: int, text: str) -> bool:
        self.edits.append((message_id, text))
        return True


@pytest.mark.parametrize("clock", [0.0, 1_000_000.1, 123_456_789.7])
async def test_a_stream_taken_over_after_a_restart_is_edited_by_its_next_update(
    clock: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the interval subtracted from the clock and the difference taken again, some clock
    # values came out a rounding error short of the interval and the update was skipped.
    monkeypatch.setattr(asyncio.get_running_loop(), "time", lambda: clock)
    outlet = Outlet()
    replies = Replies(
        outlet,
        lambda text: [text],
        interval=0.2,
        name="test",
        outbox=MemoryOutbox(streams={"s-1": 7}),
    )
    await replies.recover()
    await replies.stream(StreamUpdate(CHAT, "s-1", "Once upon"))
    await replies.stream(StreamUpdate(CHAT, "s-1", "Once upon a"))  # within the interval
    assert (outlet.sent, outlet.edits) == ([], [(7, "Once upon")])


class Refusing(Outlet):
    """Refuses the `refuse`-th message sent (1-based) for good."""

    def __init__(self, refuse: int) -> None:
        super().__init__()
        self.refuse = refuse
        self.calls = 0

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None) -> int:
        self.calls += 1
        if self.calls == self.refuse:
            raise Undeliverable("Forbidden: bot was blocked by the user", chat_closed=True)
        return await super().send(chat, text, reply_to=reply_to)


async def test_a_reply_refused_for_good_is_over() -> None:
    outlet, outbox = Refusing(refuse=2), MemoryOutbox()
    replies = Replies(outlet, lambda text: text.split("|"), interval=0.0, name="t", outbox=outbox)
    await replies.stream(StreamUpdate(CHAT, "s-1", "one"))
    item = OutboundMessage(CHAT, "one|two|three", outbox_id=5, stream_id="s-1")
    with pytest.raises(Undeliverable):
        await replies.send(item)  # the first part edits the stream's message, "two" is refused
    assert outlet.sent == ["one"] and outbox.progressed == [(5, 1)]
    assert outbox.streams == {}  # its message is forgotten: the reply is over
    await replies.stream(StreamUpdate(CHAT, "s-1", "one|two"))  # a late update starts nothing
    await replies.send(item)  # sent again all the same (not by the manager): from the start
    assert outlet.sent == ["one", "one", "two", "three"]
