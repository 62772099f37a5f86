"""Bus events as plain JSON-able records, for the journal and the outbox."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from nanobot.bus.events import Attachment, Button, ChatRef, InboundMessage, OutboundMessage, Route

Record = dict[str, Any]


def chat_record(chat: ChatRef) -> Record:
    return {"channel": chat.channel, "chat_id": chat.chat_id, "thread_id": chat.thread_id}


def chat_from(record: Record) -> ChatRef:
    return ChatRef(str(record["channel"]), str(record["chat_id"]), record.get("thread_id"))


def inbound_record(message: InboundMessage) -> Record:
    return {
        "chat": chat_record(message.chat),
        "sender_id": message.sender_id,
        "sender_name": message.sender_name,
        "text": message.text,
        "message_id": message.message_id,
        "is_private": message.is_private,
        "addressed": message.addressed,
        "received_at": message.received_at.isoformat(),
        "attachments": [_attachment_record(a) for a in message.attachments],
        **_routing_record(message),
    }


def _attachment_record(attachment: Attachment) -> Record:
    record: Record = {
        "kind": attachment.kind,
        "path": str(attachment.path),
        "mime_type": attachment.mime_type,
        "size": attachment.size,
    }
    if attachment.duration is not None:
        record["duration"] = attachment.duration
    return record


def _attachment(record: Record) -> Attachment:
    duration = record.get("duration")
    return Attachment(
        record["kind"],
        Path(record["path"]),
        record.get("mime_type"),
        int(record.get("size", 0)),
        float(duration) if isinstance(duration, int | float) else None,
    )


def _routing_record(message: InboundMessage) -> Record:
    """Where a message's turn runs and its answer goes, where that is not a chat message's
    default (kept out of the record otherwise: most rows are chat messages). Stored flat,
    beside the message's own fields, as rows have been since before `Route`."""
    route = message.route
    routing = {
        "source": message.source,
        "session": route.session,
        "deliver": route.deliver,
        "mode": route.mode,
        "quiet": route.quiet,
        "fresh": route.fresh,
        "ref": message.ref,
        "press": message.press,
    }
    return {} if routing == _CHAT_ROUTING else routing


_CHAT_ROUTING: Record = {
    "source": "chat",
    "session": None,
    "deliver": True,
    "mode": None,
    "quiet": None,
    "fresh": False,
    "ref": None,
    "press": None,
}


def inbound_from(record: Record, journal_id: int | None = None) -> InboundMessage:
    route = Route(
        chat_from(record["chat"]),
        session=record.get("session"),
        deliver=bool(record.get("deliver", True)),
        quiet=record.get("quiet"),
        fresh=bool(record.get("fresh", False)),
        mode=record.get("mode"),
    )
    return InboundMessage(
        route,
        sender_id=str(record["sender_id"]),
        text=str(record["text"]),
        message_id=str(record["message_id"]),
        sender_name=record.get("sender_name"),
        is_private=bool(record.get("is_private", True)),
        addressed=bool(record.get("addressed", True)),
        attachments=tuple(_attachment(a) for a in record.get("attachments", ())),
        received_at=datetime.fromisoformat(record["received_at"]),
        journal_id=journal_id,
        source=record.get("source", "chat"),
        ref=record.get("ref"),
        press=record.get("press"),
    )


def outbound_record(message: OutboundMessage) -> Record:
    record: Record = {
        "chat": chat_record(message.chat),
        "text": message.text,
        "kind": message.kind,
        "reply_to": message.reply_to,
        "stream_id": message.stream_id,
    }
    if message.buttons:
        record["buttons"] = [[b.label, b.data] for b in message.buttons]
    if message.edits is not None:
        record["edits"] = message.edits
    if message.speak:  # its audio is made at delivery: a path of this process's, not kept
        record["speak"] = True
    return record


def outbound_from(record: Record, outbox_id: int, parts_sent: int = 0) -> OutboundMessage:
    return OutboundMessage(
        parts_sent=parts_sent,
        chat=chat_from(record["chat"]),
        text=str(record["text"]),
        kind=record.get("kind", "reply"),
        reply_to=record.get("reply_to"),
        outbox_id=outbox_id,
        stream_id=record.get("stream_id"),
        buttons=tuple(Button(str(label), str(data)) for label, data in record.get("buttons", ())),
        edits=record.get("edits"),
        speak=bool(record.get("speak", False)),
    )
