"""Replies: the stream state machine shared by the chat channels, without a platform."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

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


class Voices(Outlet):
    """An outlet that also sends voice notes (a `VoiceOutlet`); captions fit up to
    `caption` characters; `refuse` refuses every voice note for good."""

    def __init__(self, caption: int = 10, *, refuse: bool = False) -> None:
        super().__init__()
        self.caption, self.refuse = caption, refuse
        self.voices: list[tuple[str, str | None, str | None]] = []  # file, caption, reply_to
        self.order: list[str] = []

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None) -> int:
        self.order.append(f"text:{text}@{reply_to}")
        return await super().send(chat, text, reply_to=reply_to)

    def caption_fits(self, part: str) -> bool:
        return len(part) <= self.caption

    async def send_voice(
        self, chat: ChatRef, audio: Path, *, caption: str | None, reply_to: str | None
    ) -> int:
        if self.refuse:
            raise Undeliverable("Bad Request: VOICE_MESSAGES_FORBIDDEN")
        self.voices.append((audio.name, caption, reply_to))
        self.order.append(f"voice:{caption}@{reply_to}")
        return 100 + len(self.voices)


def spoken(text: str, *, voice: str | None = "r.ogg", parts_sent: int = 0) -> OutboundMessage:
    return OutboundMessage(
        CHAT,
        text,
        reply_to="m9",
        outbox_id=3,
        stream_id="s-3",
        parts_sent=parts_sent,
        speak=True,
        voice=Path(voice) if voice else None,
    )


def speaking(outlet: Voices, outbox: MemoryOutbox) -> Replies:
    return Replies(
        outlet, lambda text: text.split("|"), interval=0.0, name="t", outbox=outbox, voices=outlet
    )


async def test_a_short_spoken_reply_is_a_voice_note_with_its_text_as_caption() -> None:
    outlet, outbox = Voices(), MemoryOutbox()
    assert await speaking(outlet, outbox).send(spoken("Hi Anna.")) == "101"
    assert outlet.order == ["voice:Hi Anna.@m9"]
    assert outbox.progressed == []  # one part: the manager confirms it


async def test_a_long_one_is_the_voice_note_then_its_text() -> None:
    outlet, outbox = Voices(caption=5), MemoryOutbox()
    await speaking(outlet, outbox).send(spoken("first part|second"))
    # The voice note answers the message; the text follows it.
    assert outlet.order == ["voice:None@m9", "text:first part@None", "text:second@None"]
    assert outbox.progressed == [(3, 1), (3, 2)]  # the voice note counts as the first part


async def test_a_restart_after_the_voice_note_sends_only_the_rest() -> None:
    outlet, outbox = Voices(caption=5), MemoryOutbox()
    await speaking(outlet, outbox).send(spoken("first part|second", voice=None, parts_sent=2))
    assert outlet.order == ["text:second@None"]
    outlet = Voices(caption=5)
    await speaking(outlet, MemoryOutbox()).send(spoken("first part|second", parts_sent=1))
    assert outlet.order == ["text:first part@None", "text:second@None"]


@pytest.mark.parametrize("text", ["Hi.", "a long first part|second"])
async def test_without_audio_the_text_goes_alone_as_it_would(text: str) -> None:
    outlet, outbox = Voices(), MemoryOutbox()
    await speaking(outlet, outbox).send(spoken(text, voice=None))
    assert outlet.voices == []
    assert outlet.sent == text.split("|")
    assert outlet.order[0].endswith("@m9")  # the text answers the message instead


@pytest.mark.parametrize("text", ["Hi.", "a long first part|second"])
async def test_a_voice_note_refused_leaves_the_text_to_go_alone(text: str) -> None:
    outlet, outbox = Voices(refuse=True), MemoryOutbox()
    await speaking(outlet, outbox).send(spoken(text))
    assert outlet.sent == text.split("|")
    assert outlet.order[0].endswith("@m9")


async def test_a_channel_without_voice_notes_sends_the_text() -> None:
    outlet = Voices()
    replies = Replies(outlet, lambda text: text.split("|"), interval=0.0, name="t")
    await replies.send(spoken("Hi.|there"))
    assert (outlet.sent, outlet.voices) == (["Hi.", "there"], [])
