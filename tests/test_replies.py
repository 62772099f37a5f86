"""Replies: the stream state machine shared by the chat channels, without a platform."""

from __future__ import annotations

import asyncio

import pytest

from nanobot.bus.events import ChatRef, StreamUpdate
from nanobot.channels._replies import Replies
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
