"""Telegram messages as nanobot sees them: which chat or topic, whether the bot is addressed,
the text without the bot's @mention, and the files worth downloading.

`read` turns one update into what intake gets (a button press, `callback_query`, becomes a
message too: see `pressed`); the rest are pure functions of PTB objects.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Literal

from loguru import logger
from telegram import Bot, CallbackQuery, Message, MessageEntity, Update, User
from telegram.constants import ChatType, MessageEntityType
from telegram.error import BadRequest
from telegram.warnings import PTBDeprecationWarning

from nanobot.bus.events import Attachment, ChatRef, InboundMessage
from nanobot.channels._telegram_retry import Retry, attempt
from nanobot.channels.base import (
    DeliveryError,
    InboxError,
    InboxPolicy,
    IntakePort,
    discard_files,
    not_fetched,
    safe_filename,
    save_file,
)

CHANNEL = "telegram"
MB = 1024 * 1024

FileKind = Literal["photo", "document", "voice", "audio", "video", "video_note"]


def chat_ref(message: Message) -> ChatRef:
    """A forum topic is its own conversation; a reply thread in a plain group is not."""
    thread = message.message_thread_id if message.is_topic_message else None
    return ChatRef(CHANNEL, str(message.chat.id), str(thread) if thread else None)


def message_key(message: Message) -> str:
    """A platform id unique within the channel: Telegram numbers messages per chat."""
    return f"{message.chat.id}:{message.message_id}"


def message_number(key: str | None) -> int | None:
    """The Telegram message id inside a `message_key` (or a bare id)."""
    if not key:
        return None
    tail = key.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _entities(message: Message) -> dict[MessageEntity, str]:
    kinds: list[str | None] = [MessageEntityType.MENTION, MessageEntityType.TEXT_MENTION]
    kinds.append(MessageEntityType.BOT_COMMAND)
    if message.text is not None:
        return message.parse_entities(kinds)
    return message.parse_caption_entities(kinds)


def _is_me(entity: MessageEntity, text: str, me: User) -> bool:
    if entity.type == MessageEntityType.TEXT_MENTION:
        return entity.user is not None and entity.user.id == me.id
    return entity.type == MessageEntityType.MENTION and text[1:].lower() == _name(me)


def _name(me: User) -> str:
    return (me.username or "").lower()


def _command_target(message: Message) -> str | None:
    """For a message that is a /command: the bot it names ("" when it names none)."""
    for entity, text in _entities(message).items():
        if entity.type == MessageEntityType.BOT_COMMAND and entity.offset == 0:
            return text.partition("@")[2].lower()
    return None


def for_another_bot(message: Message, me: User) -> bool:
    """A `/command@other_bot`: never ours, whatever the group policy."""
    target = _command_target(message)
    return bool(target) and target != _name(me)


def is_addressed(message: Message, me: User) -> bool:
    """Private chat, an @mention of the bot, a reply to one of its messages, or a /command."""
    if message.chat.type == ChatType.PRIVATE:
        return True
    reply = message.reply_to_message
    # In a forum topic every message "replies" to the topic's creation message.
    topic_root = reply is not None and (
        reply.forum_topic_created is not None or reply.message_id == message.message_thread_id
    )
    if reply is not None and not topic_root and reply.from_user and reply.from_user.id == me.id:
        return True
    if any(_is_me(entity, text, me) for entity, text in _entities(message).items()):
        return True
    return _command_target(message) in ("", _name(me))


def text_without_mentions(message: Message, me: User) -> str:
    """The text or caption with the bot's own @mentions taken out."""
    text = message.text if message.text is not None else message.caption or ""
    cuts = sorted(
        (
            (entity.offset, entity.length)
            for entity, part in _entities(message).items()
            if _is_me(entity, part, me)
        ),
        reverse=True,
    )
    for offset, length in cuts:  # offsets count UTF-16 code units
        start, end = _index(text, offset), _index(text, offset + length)
        before, after = text[:start].rstrip(" "), text[end:].lstrip(" ")
        if not before:
            after = after.lstrip(",:").lstrip()
        space = " " if before and after and after[0] not in ",.;:!?" else ""
        text = before + space + after
    return text.strip()


def _index(text: str, units: int) -> int:
    count = 0
    for index, char in enumerate(text):
        if count >= units:
            return index
        count += 2 if char > "\uffff" else 1
    return len(text)


def sender_name(user: User) -> str:
    return user.first_name or user.username or str(user.id)


def pressed(query: CallbackQuery) -> InboundMessage | None:
    """A button press as a message from the one who pressed, in the chat (and topic) of the
    message the button is under: its text is the button's data, `press` the query's id.
    None when it is no such press (a button of an inline-mode message, which has no chat,
    or one without data)."""
    message = query.message
    if message is None or not query.data:
        return None
    # A message the bot can no longer read (deleted meanwhile) still names its chat.
    chat = (
        chat_ref(message)
        if isinstance(message, Message)
        else ChatRef(CHANNEL, str(message.chat.id))
    )
    return InboundMessage.from_press(
        chat,
        str(query.from_user.id),
        query.data,
        query.id,
        sender_name=sender_name(query.from_user),
        is_private=message.chat.type == ChatType.PRIVATE,
    )


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """A file attached to a message, not yet downloaded."""

    kind: FileKind
    file_id: str
    name: str
    mime_type: str | None
    size: int | None  # as Telegram announces it; None when it does not say
    duration: float | None = None  # seconds, of a voice note, audio or video

    def too_large(self, limit: int) -> str:
        size = f" ({self.size / MB:.1f} MB)" if self.size else ""
        return f"I can't take {self.name}{size}: files may be at most {limit / MB:.0f} MB."


def remote_files(message: Message) -> list[RemoteFile]:
    """The photo (its largest size), document, voice note, audio or video of `message`."""
    number = message.message_id
    files: list[RemoteFile] = []
    if message.photo:
        photo = max(message.photo, key=lambda p: (p.width * p.height, p.file_size or 0))
        name = f"photo_{number}.jpg"
        files.append(RemoteFile("photo", photo.file_id, name, "image/jpeg", photo.file_size))
    if (document := message.document) is not None:
        name = safe_filename(document.file_name, f"document_{number}")
        mime = document.mime_type
        files.append(RemoteFile("document", document.file_id, name, mime, document.file_size))
    if (voice := message.voice) is not None:
        mime = voice.mime_type or "audio/ogg"
        name = f"voice_{number}.ogg"
        files.append(
            RemoteFile("voice", voice.file_id, name, mime, voice.file_size, _seconds(voice))
        )
    if (audio := message.audio) is not None:
        name = safe_filename(audio.file_name, f"audio_{number}")
        size, seconds = audio.file_size, _seconds(audio)
        files.append(RemoteFile("audio", audio.file_id, name, audio.mime_type, size, seconds))
    if (video := message.video) is not None:
        name = safe_filename(video.file_name, f"video_{number}.mp4")
        mime, size = video.mime_type or "video/mp4", video.file_size
        files.append(RemoteFile("video", video.file_id, name, mime, size, _seconds(video)))
    if (note := message.video_note) is not None:  # a round video: spoken, like a voice note
        name, size = f"video_note_{number}.mp4", note.file_size
        files.append(
            RemoteFile("video_note", note.file_id, name, "video/mp4", size, _seconds(note))
        )
    return files


def _seconds(media: object) -> float | None:
    """A voice note's, audio's or video's length: PTB warns that `duration` becomes a
    timedelta, and gives either as the environment says."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = getattr(media, "duration", None)
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value) if isinstance(value, int | float) else None


async def download(bot: Bot, file: RemoteFile, policy: InboxPolicy, retry: Retry) -> bytes | str:
    """The file's bytes, or why the sender must be told it was not taken. A file larger
    than the policy allows is never fetched."""
    if file.size is not None and file.size > policy.max_bytes:
        return file.too_large(policy.max_bytes)
    try:
        remote = await attempt(lambda: bot.get_file(file.file_id), retry, what="getFile")
        data = await attempt(remote.download_as_bytearray, retry, what="file download")
    except BadRequest as exc:  # "file is too big": over the Bot API's download limit
        logger.info("telegram refused to hand over {}: {}", file.name, exc)
        return f"I can't take {file.name}: Telegram does not let bots download it ({exc})."
    except DeliveryError as exc:
        logger.warning("telegram: could not download {}: {}", file.name, exc)
        return f"I could not download {file.name}; please send it again."
    return bytes(data) if len(data) <= policy.max_bytes else file.too_large(policy.max_bytes)


@dataclass(slots=True)
class Received:
    """An update read: the message for intake (None: nothing to hand over) and what became
    of its files; for a button press, `press` is the query's id (to answer)."""

    message: InboundMessage | None
    source: Message | None
    addressed: bool = False
    refusals: list[str] = field(default_factory=list)  # lines for the sender
    saved: list[Path] = field(default_factory=list)
    press: str | None = None


async def read(
    update: Update, bot: Bot, inbox: InboxPolicy, intake: IntakePort, retry: Retry
) -> Received:
    """The update as an InboundMessage, its files downloaded and saved under the inbox if
    `intake` admits the sender (nothing of a stranger's is fetched; their message still goes
    to intake, which may send them a pairing code). Nothing is fetched for a press."""
    if (query := update.callback_query) is not None:
        return Received(pressed(query), None, addressed=True, press=query.id)
    message, me = update.message, bot.bot
    received = Received(None, message)
    if message is None or message.from_user is None or for_another_bot(message, me):
        return received
    received.addressed = addressed = is_addressed(message, me)
    private = message.chat.type == ChatType.PRIVATE
    sender_id = str(message.from_user.id)  # numeric: usernames can change hands
    # Nothing is fetched that the gate would not take. A stranger's private message is still
    # handed over, even if it was only files: the gate offers them pairing.
    admitted = await intake.admits(CHANNEL, sender_id, private=private, addressed=addressed)
    if not admitted and private:
        received.refusals = [not_fetched(remote.name) for remote in remote_files(message)]
    attachments = []
    try:
        for remote in remote_files(message) if admitted else []:
            data = await download(bot, remote, inbox, retry)
            if isinstance(data, str):
                received.refusals.append(data)
                continue
            try:
                path = await save_file(inbox.of(CHANNEL, sender_id), remote.name, data)
            except InboxError as exc:
                logger.warning("telegram: could not keep {}: {}", remote.name, exc.reason)
                received.refusals.append(exc.line())
                continue
            received.saved.append(path)
            attachments.append(
                Attachment(remote.kind, path, remote.mime_type, len(data), remote.duration)
            )
    except BaseException:  # a file could not be saved, or the take was cancelled
        discard_files(received.saved)
        raise
    text = text_without_mentions(message, me)
    notes = "\n".join(f"({line})" for line in received.refusals)
    if text or attachments or (received.refusals and not admitted):
        received.message = InboundMessage.from_chat(
            chat_ref(message),
            sender_id,
            f"{text}\n\n{notes}".strip() if notes else text,
            message_key(message),
            sender_name=sender_name(message.from_user),
            is_private=private,
            addressed=addressed,
            attachments=tuple(attachments),
            received_at=message.date,
        )
    return received
