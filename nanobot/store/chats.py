"""What a chat chose for itself, kept with the chat: one row per chat (`channel`, `chat_id`;
a chat's threads and topics share it), each setting NULL until the chat sets it, when the
channel's config decides. Today: whether replies are also spoken (`/voice`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Final, Literal, cast

from nanobot.bus.events import ChatRef
from nanobot.store._times import to_text, wall_clock
from nanobot.store.database import Database

VoiceMode = Literal["off", "when_spoken", "always"]
VOICE_MODES: Final[frozenset[str]] = frozenset({"off", "when_spoken", "always"})


class ChatSettings:
    """The `chat_settings` table. Every method raises `StoreError` when the database fails."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = wall_clock) -> None:
        self._db = db
        self._clock = clock

    async def voice(self, chat: ChatRef) -> VoiceMode | None:
        """What `chat` chose for spoken replies; None: it never chose (or chose the default
        again)."""
        row = await self._db.fetchone(
            "SELECT voice_replies FROM chat_settings WHERE channel = ? AND chat_id = ?",
            (chat.channel, chat.chat_id),
        )
        value = row[0] if row is not None else None
        return cast(VoiceMode, value) if value in VOICE_MODES else None

    async def set_voice(self, chat: ChatRef, mode: VoiceMode | None, *, by: str | None) -> None:
        """Keep `mode` for `chat` (None: follow the channel's config again), as set by
        user `by`. The last writer wins."""
        await self._db.execute(
            "INSERT INTO chat_settings (channel, chat_id, voice_replies, updated_at, updated_by)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (channel, chat_id) DO UPDATE SET"
            " voice_replies = excluded.voice_replies, updated_at = excluded.updated_at,"
            " updated_by = excluded.updated_by",
            (chat.channel, chat.chat_id, mode, to_text(self._clock()), by),
        )
