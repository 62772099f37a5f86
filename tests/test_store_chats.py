"""What a chat chose for itself (`chat_settings`), on both backends: unset until chosen, the
last choice kept, one row per chat for all its threads, reset to the channel's default."""

from __future__ import annotations

from datetime import UTC, datetime

from nanobot.bus.events import ChatRef
from nanobot.store import Database
from nanobot.store.chats import ChatSettings

AT = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


async def test_a_chats_voice_choice_is_kept_and_reset(db: Database) -> None:
    chats = ChatSettings(db, clock=lambda: AT)
    group, topic, other = (
        ChatRef("telegram", "-100"),
        ChatRef("telegram", "-100", "7"),
        ChatRef("discord", "-100"),
    )
    assert await chats.voice(group) is None
    await chats.set_voice(topic, "always", by="42")
    await chats.set_voice(group, "when_spoken", by="43")  # the last choice wins
    assert (await chats.voice(group), await chats.voice(topic)) == ("when_spoken", "when_spoken")
    assert await chats.voice(other) is None  # the same id on another channel is another chat
    rows = await db.fetchall("SELECT channel, chat_id, updated_at, updated_by FROM chat_settings")
    assert [tuple(r) for r in rows] == [
        ("telegram", "-100", "2025-06-01T12:00:00.000000+00:00", "43")
    ]
    await chats.set_voice(group, None, by="42")
    assert await chats.voice(group) is None
