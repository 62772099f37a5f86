"""Replies: the stream state machine shared by the chat channels, without a platform."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from nanobot.bus.events import Button, ChatRef, OutboundMessage, StreamUpdate
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


class Cards(Outlet):
    """Records messages with the buttons under them; `editable` ids can be edited."""

    def __init__(self) -> None:
        super().__init__()
        self.buttons: dict[int, tuple[Button, ...]] = {}
        self.editable: set[int] = set()

    async def send(
        self, chat: ChatRef, text: str, *, reply_to: str | None, buttons: Sequence[Button] = ()
    ) -> int:
        sent = await super().send(chat, text, reply_to=reply_to)
        self.buttons[sent] = tuple(buttons)
        self.editable.add(sent)
        return sent

    async def edit(
        self, chat: ChatRef, message_id: int, text: str, *, buttons: Sequence[Button] = ()
    ) -> bool:
        if message_id not in self.editable:
            return False
        self.buttons[message_id] = tuple(buttons)
        return await super().edit(chat, message_id, text)


DENY = (Button("Deny", "/deny a1"),)


def cards_replies(cards: Cards, outbox: MemoryOutbox | None = None) -> Replies:
    split = lambda text: text.split("|")  # noqa: E731
    return Replies(cards, split, interval=0.0, name="t", outbox=outbox, cards=cards)


async def test_a_card_has_its_buttons_under_its_last_part_and_names_that_message() -> None:
    cards, outbox = Cards(), MemoryOutbox()
    replies = cards_replies(cards, outbox)
    item = OutboundMessage(CHAT, "one|two", kind="card", buttons=DENY, outbox_id=4)
    assert await replies.send(item) == "2"
    assert cards.sent == ["one", "two"] and cards.buttons == {1: (), 2: DENY}
    assert outbox.progressed == [(4, 1)]
    # After a restart with the first part out: only the last, with its buttons.
    assert await replies.send(OutboundMessage(CHAT, "one|two", buttons=DENY, parts_sent=1)) == "3"
    assert cards.buttons[3] == DENY


async def test_an_edit_replaces_its_message_or_is_posted_anew() -> None:
    cards = Cards()
    replies = cards_replies(cards)
    card = await replies.send(OutboundMessage(CHAT, "Run it?", kind="card", buttons=DENY))
    assert await replies.send(OutboundMessage(CHAT, "Denied.", replaces=card)) == card
    assert cards.edits == [(1, "Denied.")] and cards.buttons[1] == ()  # its buttons removed
    cards.editable.clear()  # deleted, too old, ...
    assert await replies.send(OutboundMessage(CHAT, "Expired.", replaces=card)) == "2"
    assert cards.sent == ["Run it?", "Expired."]
    assert await replies.send(OutboundMessage(CHAT, "a|b", replaces="not-an-id")) == "4"


async def test_a_channel_without_buttons_refuses_cards_and_edits() -> None:
    replies = Replies(Outlet(), lambda text: [text], interval=0.0, name="plain")
    for item in (
        OutboundMessage(CHAT, "Run it?", kind="card", buttons=DENY),
        OutboundMessage(CHAT, "Denied.", replaces="1"),
    ):
        with pytest.raises(Undeliverable, match="plain cannot show buttons"):
            await replies.send(item)
    assert await replies.send(OutboundMessage(CHAT, "hello")) == "1"
