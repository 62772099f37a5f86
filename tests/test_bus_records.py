"""Inbound events as journal rows: each producer's event survives the round trip, and rows
stored before `Route` (the routing fields flat in the record) load as they were meant."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from nanobot.bus.events import Attachment, ChatRef, InboundMessage, OutboundMessage, Route
from nanobot.bus.records import (
    Record,
    inbound_from,
    inbound_record,
    outbound_from,
    outbound_record,
)

CHAT = ChatRef("telegram", "42", "7")
AT = datetime(2025, 5, 3, 9, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    "message",
    [
        InboundMessage.from_chat(
            CHAT,
            "42",
            "see the file",
            "m1",
            sender_name="Ada",
            is_private=False,
            addressed=False,
            attachments=(Attachment("document", Path("/inbox/cv.txt"), "text/plain", 7),),
            received_at=AT,
        ),
        InboundMessage.from_press(CHAT, "42", "/approve a1 once", "q9", received_at=AT),
        InboundMessage.from_cron(CHAT, "j1", "water the plants", 9, deliver=True),
        InboundMessage.from_heartbeat(
            "check", "b1", session="heartbeat", quiet="HEARTBEAT_OK", deliver_to=None
        ),
        InboundMessage.from_task(CHAT, "42", "[report]", "t1", session="s", is_private=True),
        InboundMessage.from_chat(CHAT, "local", "hi", "c1", session="mine", deliver=False),
    ],
    ids=["chat", "press", "cron", "heartbeat", "task", "cli"],
)
def test_every_producers_event_comes_back_from_its_row(message: InboundMessage) -> None:
    assert inbound_from(inbound_record(message), 5) == InboundMessage(
        message.route,
        message.sender_id,
        message.text,
        message.message_id,
        message.sender_name,
        message.is_private,
        message.addressed,
        message.attachments,
        message.received_at,
        5,
        message.source,
        message.ref,
        message.press,
    )


def test_a_chat_messages_row_keeps_no_routing() -> None:
    record = inbound_record(InboundMessage.from_chat(CHAT, "42", "hi", "m1"))
    assert set(record) == {
        "chat",
        "sender_id",
        "sender_name",
        "text",
        "message_id",
        "is_private",
        "addressed",
        "received_at",
        "attachments",
    }


def test_rows_stored_before_routes_load_as_they_were_meant() -> None:
    chat = {"channel": "telegram", "chat_id": "42", "thread_id": None}
    beat: Record = {
        "chat": {"channel": "heartbeat", "chat_id": "heartbeat", "thread_id": None},
        "sender_id": "heartbeat",
        "sender_name": None,
        "text": "check",
        "message_id": "heartbeat:b1",
        "is_private": True,
        "addressed": True,
        "received_at": AT.isoformat(),
        "attachments": [],
        "source": "heartbeat",
        "session": "heartbeat",
        "deliver": False,
        "mode": "next_turn",
        "quiet": "HEARTBEAT_OK",
        "fresh": True,
        "ref": None,
        "press": None,
    }
    loaded = inbound_from(beat, 3)
    assert loaded.route == Route(
        ChatRef("heartbeat", "heartbeat"),
        session="heartbeat",
        deliver=False,
        quiet="HEARTBEAT_OK",
        fresh=True,
        mode="next_turn",
    )
    assert (loaded.source, loaded.journal_id, loaded.session_key) == ("heartbeat", 3, "heartbeat")
    # The oldest rows: a chat message with only the fields it had then.
    oldest: Record = {
        "chat": chat,
        "sender_id": "42",
        "text": "hi",
        "message_id": "m1",
        "received_at": AT.isoformat(),
    }
    message = inbound_from(oldest)
    assert message.route == Route(ChatRef("telegram", "42"))
    assert (message.source, message.is_private, message.addressed) == ("chat", True, True)
    assert message.attachments == () and message.press is None


def test_a_reply_to_be_spoken_keeps_that_but_not_its_audio() -> None:
    spoken = OutboundMessage(CHAT, "hi", reply_to="m1", speak=True, voice=Path("/ws/a.ogg"))
    record = outbound_record(spoken)
    assert record["speak"] is True and "voice" not in str(record)
    back = outbound_from(record, 5, parts_sent=1)
    assert (back.speak, back.voice, back.parts_sent, back.outbox_id) == (True, None, 1, 5)
    plain = outbound_record(OutboundMessage(CHAT, "hi"))
    assert "speak" not in plain and outbound_from(plain, 6).speak is False
