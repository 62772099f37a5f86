"""Tests for the fake Telegram Bot API in ``tests.fakes.telegram``, driven by the real PTB."""

from __future__ import annotations

import asyncio
import base64
import datetime as dtm
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from telegram import (
    Bot,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    ReactionTypeEmoji,
    Update,
)
from telegram.error import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)
from telegram.ext import (
    Application,
    CallbackQueryHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from tests.fakes import audio
from tests.fakes._telegram_html import HtmlError, parse_html, utf16_len
from tests.fakes.telegram import (
    DEFAULT_TOKEN,
    ApiError,
    Disconnect,
    FakeTelegram,
    Garbled,
    Hang,
    RateLimited,
    Refusal200,
    ServerError,
    Slow,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
CHAT = 42


def make_bot(fake: FakeTelegram, token: str = DEFAULT_TOKEN) -> Bot:
    return Bot(token, base_url=f"{fake.base_url}/bot", base_file_url=f"{fake.base_url}/file/bot")


@pytest.fixture
def fake(fake_telegram: FakeTelegram) -> FakeTelegram:
    return fake_telegram


@pytest.fixture
async def bot(fake: FakeTelegram) -> AsyncIterator[Bot]:
    async with make_bot(fake) as client:
        yield client


async def next_message(bot: Bot) -> Message:
    """The next update's message, confirming it (and everything before it)."""
    [update] = await bot.get_updates(timeout=2)
    await bot.get_updates(offset=update.update_id + 1, timeout=0)
    assert update.message is not None
    return update.message


async def test_get_me_describes_the_bot(bot: Bot, fake: FakeTelegram) -> None:
    me = await bot.get_me()
    assert (me.id, me.username, me.is_bot) == (fake.bot.id, "nanobot_test_bot", True)
    assert fake.valid_token == DEFAULT_TOKEN


async def test_html_message_is_recorded_raw_and_visible(bot: Bot, fake: FakeTelegram) -> None:
    html = '<b>a &lt; b</b> &amp; <a href="https://example.org">link</a> 😀<i>x</i>'
    message = await bot.send_message(CHAT, html, parse_mode="HTML")
    assert message.text == "a < b & link 😀x"
    assert [(e.type, e.offset, e.length) for e in message.entities] == [
        ("bold", 0, 5),
        ("text_link", 8, 4),
        ("italic", 15, 1),  # after the emoji: two UTF-16 code units
    ]
    [sent] = fake.sent(CHAT)
    assert (sent.text, sent.visible, sent.parse_mode) == (html, message.text, "HTML")
    assert sent.message_id == message.message_id and message.from_user is not None
    assert message.from_user.id == fake.bot.id and message.chat.type == "private"


@pytest.mark.parametrize(
    ("html", "reason"),
    [
        ("a < b", 'unsupported start tag "" at byte offset 2'),
        ("<b>bold", 'can\'t find end tag corresponding to start tag "b"'),
        ("<b><i>x</b></i>", 'unmatched end tag at byte offset 7, expected "</i>", found "</b>"'),
        ("line<br>break", 'unsupported start tag "br" at byte offset 4'),
        ("<span>x</span>", 'tag "span" must have class "tg-spoiler" at byte offset 0'),
        ("Tom & Jerry", 'unescaped "&" at byte offset 4; write it as "&amp;"'),
    ],
)
async def test_invalid_html_is_rejected_like_telegram(
    bot: Bot, fake: FakeTelegram, html: str, reason: str
) -> None:
    with pytest.raises(BadRequest) as info:
        await bot.send_message(CHAT, html, parse_mode="HTML")
    # PTB strips "Bad Request: " and capitalize()s the rest (lower-casing it)
    assert str(info.value) == f"Can't parse entities: {reason}".capitalize()
    assert fake.sent() == []


async def test_length_limit_counts_visible_utf16_units(bot: Bot, fake: FakeTelegram) -> None:
    for text in ("x" * 4097, "😀" * 2048 + "x", "<b>" + "x" * 4097 + "</b>"):
        with pytest.raises(BadRequest, match="Message is too long"):
            await bot.send_message(CHAT, text, parse_mode="HTML")
    for text in ("<b>" + "x" * 4096 + "</b>", "&lt;" * 4096, "😀" * 2048):
        await bot.send_message(CHAT, text, parse_mode="HTML")
    assert [utf16_len(m.visible) for m in fake.sent()] == [4096, 4096, 4096]
    for empty in ("", "<b> </b>"):
        with pytest.raises(BadRequest, match="Message text is empty"):
            await bot.send_message(CHAT, empty, parse_mode="HTML")


async def test_edit_message_text(bot: Bot, fake: FakeTelegram) -> None:
    message = await bot.send_message(CHAT, "<b>one</b>", parse_mode="HTML")
    edited = await bot.edit_message_text("<i>two</i>", CHAT, message.message_id, parse_mode="HTML")
    assert isinstance(edited, Message) and edited.text == "two" and edited.edit_date is not None
    [sent] = fake.sent(CHAT)
    assert (sent.visible, sent.text, sent.edited) == ("two", "<i>two</i>", True)
    assert [r.visible for r in sent.history] == ["one"]
    with pytest.raises(BadRequest, match="Message is not modified"):  # same text and entities
        await bot.edit_message_text("<em>two</em>", CHAT, message.message_id, parse_mode="HTML")
    with pytest.raises(BadRequest, match="Message to edit not found"):
        await bot.edit_message_text("x", CHAT, 999)
    with pytest.raises(BadRequest, match="Can't parse entities"):
        await bot.edit_message_text("<b>", CHAT, message.message_id, parse_mode="HTML")
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("ok", callback_data="ok")]])
    await bot.edit_message_text("two", CHAT, message.message_id, reply_markup=keyboard)
    assert sent.reply_markup == keyboard.to_dict() and len(sent.history) == 2


# PTB 22 warns when RetryAfter is built: retry_after will become a timedelta (PTB_TIMEDELTA=1)
@pytest.mark.filterwarnings("ignore::telegram.warnings.PTBDeprecationWarning")
async def test_rate_limit_raises_retry_after(bot: Bot, fake: FakeTelegram) -> None:
    fake.fail_next("sendMessage", RateLimited(retry_after=3))
    with pytest.raises(RetryAfter) as info:
        await bot.send_message(CHAT, "hi")
    retry_after = info.value.retry_after
    seconds = retry_after.total_seconds() if isinstance(retry_after, dtm.timedelta) else retry_after
    assert seconds == 3
    await bot.send_message(CHAT, "hi")  # the fault was used up
    assert [m.visible for m in fake.sent()] == ["hi"]
    assert [c.method for c in fake.calls("sendMessage")] == ["sendMessage", "sendMessage"]


async def test_error_bodies_are_telegrams(fake: FakeTelegram) -> None:
    fake.fail_next("*", RateLimited(retry_after=2))
    url = f"{fake.base_url}/bot{DEFAULT_TOKEN}"
    async with httpx.AsyncClient(trust_env=False) as client:
        limited = await client.post(f"{url}/sendMessage", json={"chat_id": 1, "text": "x"})
        bad = await client.post(
            f"{url}/sendMessage", data={"chat_id": "1", "text": "<x>"} | {"parse_mode": "HTML"}
        )
        unknown = await client.post(f"{url}/noSuchMethod")
        other_token = await client.post(f"{fake.base_url}/bot1:other/getMe")
    assert (limited.status_code, limited.json()) == (
        429,
        {
            "ok": False,
            "error_code": 429,
            "description": "Too Many Requests: retry after 2",
            "parameters": {"retry_after": 2},
        },
    )
    assert bad.json() == {
        "ok": False,
        "error_code": 400,
        "description": 'Bad Request: can\'t parse entities: Unsupported start tag "x" at byte '
        "offset 0",
    }
    assert unknown.json() == {"ok": False, "error_code": 404, "description": "Not Found"}
    assert other_token.json() == {"ok": False, "error_code": 401, "description": "Unauthorized"}


async def test_server_errors_and_dropped_connections(bot: Bot, fake: FakeTelegram) -> None:
    for fault in (ServerError(500), ServerError(502), Disconnect()):
        fake.fail_next("sendMessage", fault)
        with pytest.raises(NetworkError) as info:
            await bot.send_message(CHAT, "hi")
        assert type(info.value) is NetworkError  # not BadRequest, its subclass
    fake.fail_next("getMe", Hang())
    with pytest.raises(TimedOut):
        await bot.get_me(read_timeout=0.3)
    fake.offline = True
    with pytest.raises(NetworkError):
        await bot.send_message(CHAT, "lost")
    fake.offline = False
    fake.fail_next("sendMessage", ApiError(403, "Forbidden: bot was blocked by the user"))
    with pytest.raises(Forbidden, match="Forbidden: bot was blocked by the user"):
        await bot.send_message(CHAT, "blocked")
    await bot.send_message(CHAT, "back")
    assert [m.visible for m in fake.sent()] == ["back"]


async def test_slow_answer_times_out_after_sending(bot: Bot, fake: FakeTelegram) -> None:
    fake.fail_next("sendMessage", Slow(5))
    with pytest.raises(TimedOut):
        await bot.send_message(CHAT, "maybe", read_timeout=0.3)
    assert [m.visible for m in fake.sent()] == ["maybe"]  # a retry would duplicate it


async def test_garbled_answer_is_ok_but_not_performed(bot: Bot, fake: FakeTelegram) -> None:
    fake.fail_next("sendMessage", Garbled({"odd": 1}))
    assert await bot.do_api_request("sendMessage", {"chat_id": CHAT, "text": "x"}) == {"odd": 1}
    assert fake.sent() == []


async def test_a_200_saying_ok_false_breaks_ptbs_own_request(bot: Bot, fake: FakeTelegram) -> None:
    # PTB takes any 2xx for a success and reads its "result": what the channel's own request
    # (`_telegram_http`) turns into the error the body reports.
    fake.fail_next("sendMessage", Refusal200({"ok": False, "error_code": 400}))
    with pytest.raises(KeyError, match="result"):
        await bot.do_api_request("sendMessage", {"chat_id": CHAT, "text": "x"})
    fake.fail_next("sendMessage", Refusal200("<html>bad gateway</html>"))
    with pytest.raises(TelegramError, match="Invalid server response"):
        await bot.do_api_request("sendMessage", {"chat_id": CHAT, "text": "x"})
    assert fake.sent() == []


async def test_a_token_other_than_the_first_is_unauthorized(bot: Bot, fake: FakeTelegram) -> None:
    await bot.get_me()
    with pytest.raises(InvalidToken, match="rejected by the server"):  # initialize: getMe
        async with make_bot(fake, "123:another-token"):
            pass
    fake.valid_token = "123:revoked"  # e.g. the token was revoked while the bot runs
    with pytest.raises(InvalidToken, match="Unauthorized"):
        await bot.get_me()


async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.message is not None and update.message.text is not None
    await update.message.reply_text(f"echo: {update.message.text}")


def echo_application(fake: FakeTelegram) -> Application[Any, Any, Any, Any, Any, Any]:
    application = (
        Application.builder()
        .token(DEFAULT_TOKEN)
        .base_url(f"{fake.base_url}/bot")
        .base_file_url(f"{fake.base_url}/file/bot")
        .build()
    )
    application.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, echo))
    return application


async def test_application_polls_and_replies(fake: FakeTelegram) -> None:
    async with echo_application(fake) as application:
        await application.start()
        assert application.updater is not None
        await application.updater.start_polling(poll_interval=0, timeout=1)
        fake.user_message(CHAT, "a < b", user_id=CHAT, username="ada")
        [reply] = await fake.wait_for_sent(1, chat_id=CHAT, seconds=5)
        await application.updater.stop()
        await application.stop()
    assert reply.visible == "echo: a < b" and reply.reply_to is None  # no quote in private
    assert fake.pending_updates == []  # PTB confirmed the update on stop
    assert fake.calls("deleteWebhook") and fake.calls("getMe")


async def test_polling_recovers_after_the_network_comes_back(fake: FakeTelegram) -> None:
    async with echo_application(fake) as application:
        await application.start()
        assert application.updater is not None
        await application.updater.start_polling(poll_interval=0, timeout=1)
        await fake.wait_for(lambda: fake.polling, 5)
        fake.offline = True  # drops the held long poll; PTB backs off 1 s, then 1.5 s...
        await asyncio.sleep(0.2)  # the outage itself (its length is the behaviour under test)
        fake.offline = False
        fake.user_message(CHAT, "still there?", user_id=CHAT)
        [reply] = await fake.wait_for_sent(1, chat_id=CHAT, seconds=5)
        await application.updater.stop()
        await application.stop()
    assert reply.visible == "echo: still there?"


async def test_confirmed_updates_are_not_delivered_again(bot: Bot, fake: FakeTelegram) -> None:
    first = fake.user_message(CHAT, "one", user_id=CHAT)
    second = fake.user_message(CHAT, "two", user_id=CHAT)
    assert [u.update_id for u in await bot.get_updates(timeout=0)] == [first, second]
    assert [u.update_id for u in await bot.get_updates(timeout=0, limit=1)] == [first]
    assert [u.update_id for u in await bot.get_updates(offset=second, timeout=0)] == [second]
    assert [u.update_id for u in await bot.get_updates(offset=first, timeout=0)] == [second]
    assert await bot.get_updates(offset=second + 1, timeout=0) == ()
    assert fake.pending_updates == []


async def test_long_poll_waits_and_a_newer_poll_terminates_it(fake: FakeTelegram) -> None:
    async with make_bot(fake) as one, make_bot(fake) as two:
        started = time.monotonic()
        first = asyncio.create_task(one.get_updates(timeout=5))
        await fake.wait_for(lambda: fake.polling, 2)
        second = asyncio.create_task(two.get_updates(timeout=5))
        with pytest.raises(Conflict, match="terminated by other getUpdates request"):
            await first
        update_id = fake.user_message(CHAT, "wake up", user_id=CHAT)
        assert [u.update_id for u in await second] == [update_id]
        assert time.monotonic() - started < 2


async def test_user_files_download_through_get_file(bot: Bot, fake: FakeTelegram) -> None:
    fake.user_document(
        CHAT, filename="notes.txt", content=b"hello", mime_type="text/plain", user_id=CHAT
    )
    document = (await next_message(bot)).document
    assert document is not None and document.file_name == "notes.txt"
    assert await (await bot.get_file(document.file_id)).download_as_bytearray() == b"hello"
    fake.user_photo(CHAT, content=b"\xff\xd8jpeg", caption="look", user_id=CHAT)
    photo = await next_message(bot)
    assert photo.caption == "look" and photo.photo[-1].width > photo.photo[0].width
    assert await (await bot.get_file(photo.photo[-1].file_id)).download_as_bytearray() == (
        b"\xff\xd8jpeg"
    )
    fake.user_voice(CHAT, content=b"OggS", duration=3, user_id=CHAT)
    voice = (await next_message(bot)).voice
    assert voice is not None and voice.mime_type == "audio/ogg"
    assert await (await bot.get_file(voice.file_id)).download_as_bytearray() == b"OggS"
    with pytest.raises(BadRequest, match="Invalid file_id"):
        await bot.get_file("nope")


async def test_voice_audio_and_video_notes_as_clients_send_them(
    bot: Bot, fake: FakeTelegram, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")  # durations as timedelta, without a warning
    note, song = audio.ogg_opus(2.0), audio.mp3(1.0)
    fake.user_voice(CHAT, content=note, duration=2, caption="listen /now", user_id=CHAT)
    [update] = await bot.get_updates(timeout=2)
    assert filters.VOICE.check_update(update) and not filters.AUDIO.check_update(update)
    assert filters.CAPTION.check_update(update)
    voice = update.effective_message.voice if update.effective_message else None
    assert voice is not None and update.effective_message is not None
    assert (voice.duration, voice.mime_type, voice.file_size) == (
        dtm.timedelta(seconds=2),
        "audio/ogg",
        len(note),
    )
    assert update.effective_message.caption == "listen /now"
    assert [e.type for e in update.effective_message.caption_entities] == ["bot_command"]
    voice_file = await bot.get_file(voice.file_id)
    assert str(voice_file.file_path).endswith("/voice/file_0.oga")  # PTB: the whole URL
    assert await voice_file.download_as_bytearray() == note
    await bot.get_updates(offset=update.update_id + 1, timeout=0)

    fake.user_audio(
        CHAT,
        content=song,
        filename="tune.mp3",
        duration=1,
        performer="Ada",
        title="Tune",
        caption="a song",
        user_id=CHAT,
    )
    message = await next_message(bot)
    track = message.audio
    assert track is not None and message.voice is None
    assert (track.file_name, track.mime_type, track.performer, track.title) == (
        "tune.mp3",
        "audio/mpeg",
        "Ada",
        "Tune",
    )
    assert (track.duration, track.file_size, message.caption) == (
        dtm.timedelta(seconds=1),
        len(song),
        "a song",
    )
    track_file = await bot.get_file(track.file_id)
    assert str(track_file.file_path).endswith("/music/file_1.mp3")
    assert await track_file.download_as_bytearray() == song

    clip = b"\x00\x00\x00\x18ftypmp42 a round video"
    fake.user_video_note(CHAT, content=clip, duration=3, length=240, user_id=CHAT)
    [update] = await bot.get_updates(timeout=2)
    assert filters.VIDEO_NOTE.check_update(update)
    assert update.message is not None
    video_note = update.message.video_note
    assert video_note is not None and update.message.caption is None
    assert (video_note.length, video_note.duration, video_note.file_size) == (
        240,
        dtm.timedelta(seconds=3),
        len(clip),
    )
    note_file = await bot.get_file(video_note.file_id)
    assert str(note_file.file_path).endswith("/video_notes/file_2.mp4")
    assert await note_file.download_as_bytearray() == clip
    assert len({voice.file_id, track.file_id, video_note.file_id}) == 3


async def test_get_file_refuses_a_file_telegram_declares_over_20_mb(
    bot: Bot, fake: FakeTelegram
) -> None:
    limit = 20 * 1024 * 1024
    fake.user_document(
        CHAT, filename="huge.pdf", content=b"%PDF-1.7", file_size=limit + 1, user_id=CHAT
    )
    document = (await next_message(bot)).document
    assert document is not None and document.file_size == limit + 1
    with pytest.raises(BadRequest, match="File is too big"):
        await bot.get_file(document.file_id)
    fake.user_voice(CHAT, content=audio.ogg_opus(1.0), file_size=limit, user_id=CHAT)
    voice = (await next_message(bot)).voice
    assert voice is not None and voice.file_size == limit
    at_limit = await bot.get_file(voice.file_id)  # 20 MB itself is given
    assert at_limit.file_size == limit
    assert [c.method for c in fake.requests].count("getFile") == 2


async def test_send_voice_reads_the_duration_of_an_ogg_opus_file(
    bot: Bot, fake: FakeTelegram, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")
    spoken = audio.ogg_opus(3.0)
    read = await bot.send_voice(CHAT, voice=spoken, caption="<i>said</i>", parse_mode="HTML")
    told = await bot.send_voice(CHAT, voice=spoken, duration=7)
    unknown = await bot.send_voice(CHAT, voice=b"not audio")
    assert read.voice is not None and told.voice is not None and unknown.voice is not None
    assert read.voice.duration == dtm.timedelta(seconds=3)
    assert told.voice.duration == dtm.timedelta(seconds=7)
    assert unknown.voice.duration == dtm.timedelta(seconds=1)
    first, *_ = fake.sent(CHAT)
    assert first.method == "sendVoice" and first.visible == "said"
    assert first.file is not None and first.file.content == spoken


async def test_control_api_injects_audio_and_video_notes(fake: FakeTelegram, bot: Bot) -> None:
    song = audio.mp3(0.5)
    async with httpx.AsyncClient(trust_env=False, base_url=fake.base_url) as control:
        injected = await control.post(
            "/_fake/user_audio",
            json={
                "chat_id": CHAT,
                "content_base64": base64.b64encode(song).decode(),
                "filename": "clip.mp3",
                "user_id": CHAT,
            },
        )
        await control.post(
            "/_fake/user_video_note",
            json={"chat_id": CHAT, "content_base64": "AAAA", "length": 100, "user_id": CHAT},
        )
    first, second = await bot.get_updates(timeout=2)
    assert first.update_id == injected.json()["update_id"]
    assert first.message is not None and first.message.audio is not None
    assert await (await bot.get_file(first.message.audio.file_id)).download_as_bytearray() == song
    assert second.message is not None and second.message.video_note is not None
    assert second.message.video_note.length == 100


async def test_uploads_are_recorded(bot: Bot, fake: FakeTelegram) -> None:
    sent = await bot.send_document(
        CHAT, document=b"data", filename="report.txt", caption="<b>done</b>", parse_mode="HTML"
    )
    assert sent.document is not None and sent.caption == "done"
    await bot.send_photo(CHAT, photo=b"\x89PNG", filename="chart.png")
    document, photo = fake.sent(CHAT)
    assert document.file is not None and photo.file is not None
    assert (document.file.filename, document.file.content, document.visible) == (
        "report.txt",
        b"data",
        "done",
    )
    assert (photo.method, photo.file.kind, photo.file.content) == ("sendPhoto", "photo", b"\x89PNG")
    with pytest.raises(BadRequest, match="Message caption is too long"):
        await bot.send_document(CHAT, document=b"x", filename="x.txt", caption="x" * 1025)


async def test_forum_topic_messages_carry_the_thread(bot: Bot, fake: FakeTelegram) -> None:
    group = -1001234567890
    fake.user_message(group, "hi", user_id=CHAT, is_topic=True, thread_id=7, chat_title="Team")
    message = await next_message(bot)
    assert (message.message_thread_id, message.is_topic_message) == (7, True)
    assert message.chat.is_forum and message.chat.type == "supergroup"
    assert message.chat.title == "Team"
    assert message.reply_to_message is not None  # Telegram: the topic's creation message
    assert message.reply_to_message.forum_topic_created is not None
    await message.reply_text("in topic")  # PTB fills message_thread_id for topic messages
    [sent] = fake.sent(group)
    assert (sent.thread_id, sent.reply_to) == (7, message.message_id)  # PTB quotes in groups


async def test_reply_to_a_bot_message_includes_it(bot: Bot, fake: FakeTelegram) -> None:
    question = await bot.send_message(CHAT, "Which one?")
    fake.user_message(
        CHAT, "/pick@nanobot_test_bot the @first", user_id=CHAT, reply_to=question.message_id
    )
    message = await next_message(bot)
    original = message.reply_to_message
    assert original is not None and original.from_user is not None
    assert (original.from_user.id, original.text) == (fake.bot.id, "Which one?")
    assert [(e.type, e.offset, e.length) for e in message.entities] == [
        ("bot_command", 0, 22),
        ("mention", 27, 6),
    ]
    assert message.message_id > question.message_id  # one id sequence per chat


async def test_actions_commands_callbacks_reactions_and_deletes(
    bot: Bot, fake: FakeTelegram
) -> None:
    await bot.send_chat_action(CHAT, "typing")
    assert [(a.chat_id, a.action) for a in fake.actions] == [(CHAT, "typing")]
    await bot.set_my_commands([("new", "Start a new session")])
    assert [(c.command, c.description) for c in await bot.get_my_commands()] == [
        ("new", "Start a new session")
    ]
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("Yes", callback_data="yes")]])
    asked = await bot.send_message(CHAT, "Sure?", reply_markup=keyboard)
    fake.user_callback(CHAT, asked.message_id, "yes", user_id=CHAT)
    [update] = await bot.get_updates(timeout=1)
    assert update.callback_query is not None and update.callback_query.data == "yes"
    assert await update.callback_query.answer("noted")
    await bot.set_message_reaction(CHAT, asked.message_id, [ReactionTypeEmoji("👍")])
    reaction = fake.calls("setMessageReaction")[0].params["reaction"]
    assert json.loads(reaction) == [{"type": "emoji", "emoji": "👍"}]  # a JSON string in a form
    assert await bot.delete_message(CHAT, asked.message_id)
    assert fake.sent(CHAT)[0].deleted
    with pytest.raises(BadRequest, match="Message to delete not found"):
        await bot.delete_message(CHAT, asked.message_id)


async def test_stop_is_prompt_with_held_requests() -> None:
    fake = FakeTelegram()
    await fake.start()
    async with make_bot(fake) as bot:
        poll = asyncio.create_task(bot.get_updates(timeout=30))
        fake.fail_next("getWebhookInfo", Hang())
        hang = asyncio.create_task(bot.get_webhook_info(read_timeout=30))
        await fake.wait_for(lambda: fake.polling and bool(fake.calls("getWebhookInfo")), 2)
        started = time.monotonic()
        await fake.stop()
        assert time.monotonic() - started < 2
        for task in (poll, hang):
            with pytest.raises(NetworkError):
                await task


def test_html_parser_matches_tdlib_cases() -> None:
    parsed = parse_html(
        '<pre><code class="language-python">x = 1</code></pre><blockquote expandable>q</blockquote>'
    )
    assert parsed.text == "x = 1q"
    assert parsed.entities == [
        {"type": "pre", "offset": 0, "length": 5, "language": "python"},
        {"type": "expandable_blockquote", "offset": 5, "length": 1},
    ]
    assert parse_html("&lt;&gt;&amp;&quot;&#128512;&#x41;", strict=True).text == '<>&"😀A'
    assert parse_html("Tom & Jerry &nbsp;", strict=False).text == "Tom & Jerry &nbsp;"
    for html, error in [
        ("🏟 🏟&lt;<abacaba", "Unclosed start tag at byte offset 13"),
        (
            "🏟 🏟&lt;<i    aba>",
            'Expected equal sign in declaration of an attribute of the tag "i" at byte offset 13',
        ),
        ("🏟 🏟&lt;<b></b></", "Unexpected end tag at byte offset 20"),
        ("🏟 🏟&lt;<i>a</i   ", "Unclosed end tag at byte offset 17"),
    ]:
        with pytest.raises(HtmlError) as info:
            parse_html(html)
        assert str(info.value) == error


async def test_standalone_process_with_http_control_api() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.telegram",
        "--token",
        DEFAULT_TOKEN,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        base = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().strip()
        assert base.startswith("http://127.0.0.1:")
        bot = Bot(DEFAULT_TOKEN, base_url=f"{base}/bot", base_file_url=f"{base}/file/bot")
        async with httpx.AsyncClient(trust_env=False, base_url=base) as control, bot:
            injected = await control.post(
                "/_fake/user_message", json={"chat_id": 5, "text": "hi", "user_id": 5}
            )
            [update] = await bot.get_updates(timeout=1)
            assert update.update_id == injected.json()["update_id"]
            fault = {"method": "sendMessage", "fault": {"type": "ServerError", "status": 502}}
            await control.post("/_fake/fail_next", json=fault)
            with pytest.raises(NetworkError):
                await bot.send_message(5, "x")
            await bot.send_message(5, "<b>ok</b>", parse_mode="HTML")
            sent = (await control.get("/_fake/sent", params={"chat_id": 5})).json()
            assert [(m["visible"], m["text"]) for m in sent] == [("ok", "<b>ok</b>")]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 30) == 0


# ---- approvals in chat: inline keyboards, button presses, answers, edits ----------------

CARD = InlineKeyboardMarkup(
    [
        [
            InlineKeyboardButton("Allow once", callback_data="ap:7:once"),
            InlineKeyboardButton("Deny", callback_data="ap:7:deny"),
        ],
        [InlineKeyboardButton("Docs", url="https://example.org/approvals")],
    ]
)
QUERY_TOO_OLD = "Query is too old"  # PTB capitalize()s Telegram's description


async def test_press_answer_once_and_edit_the_card(bot: Bot, fake: FakeTelegram) -> None:
    card = await bot.send_message(
        CHAT, "Run <code>ls</code>?", parse_mode="HTML", reply_markup=CARD
    )
    [sent] = fake.sent(CHAT)
    assert [b["text"] for b in sent.buttons] == ["Allow once", "Deny", "Docs"]
    assert card.reply_markup == CARD  # Telegram echoes the keyboard back

    pressed = fake.press_button(CHAT, card.message_id, text="Allow once", user_id=CHAT)
    [update] = await bot.get_updates(timeout=1)
    query = update.callback_query
    assert query is not None and query.message is not None and query.from_user.id == CHAT
    assert (query.id, query.data, update.update_id) == (pressed.id, "ap:7:once", pressed.update_id)
    assert query.message.message_id == card.message_id and query.message.chat.id == CHAT
    assert isinstance(query.message, Message) and query.message.reply_markup == CARD

    assert await query.answer("Allowed once", show_alert=True)
    with pytest.raises(BadRequest, match=QUERY_TOO_OLD):  # a second answer
        await query.answer("again")
    assert pressed.answer is not None and pressed.refusals == 1
    assert (pressed.answer.text, pressed.answer.show_alert) == ("Allowed once", True)
    assert await fake.wait_for_answer(pressed, 1) is pressed.answer

    edited = await query.edit_message_text("Allowed once by Ada")  # no reply_markup: removed
    assert isinstance(edited, Message) and edited.reply_markup is None
    assert (sent.visible, sent.buttons, sent.reply_markup) == ("Allowed once by Ada", [], None)
    assert sent.history[-1].reply_markup == CARD.to_dict()
    with pytest.raises(LookupError):  # the buttons are gone: nothing to press
        fake.press_button(CHAT, card.message_id, text="Deny", user_id=CHAT)


async def test_edit_reply_markup_swaps_and_removes_the_keyboard(
    bot: Bot, fake: FakeTelegram
) -> None:
    card = await bot.send_message(CHAT, "Run ls?", reply_markup=CARD)
    waiting = InlineKeyboardMarkup([[InlineKeyboardButton("…", callback_data="noop")]])
    edited = await bot.edit_message_reply_markup(CHAT, card.message_id, reply_markup=waiting)
    assert isinstance(edited, Message) and edited.reply_markup == waiting
    [sent] = fake.sent(CHAT)
    assert sent.keyboard == [[{"text": "…", "callback_data": "noop"}]] and sent.visible == "Run ls?"
    await bot.edit_message_reply_markup(CHAT, card.message_id, reply_markup=None)
    assert sent.reply_markup is None and len(sent.history) == 2
    assert [r.reply_markup for r in sent.history] == [CARD.to_dict(), waiting.to_dict()]
    for nothing in (None, InlineKeyboardMarkup([])):  # an empty keyboard is no keyboard
        with pytest.raises(BadRequest, match="Message is not modified"):
            await bot.edit_message_reply_markup(CHAT, card.message_id, reply_markup=nothing)
    with pytest.raises(BadRequest, match="Message to edit not found"):
        await bot.edit_message_reply_markup(CHAT, 999, reply_markup=CARD)
    # editMessageText with the same keyboard keeps it; without, drops it
    await bot.edit_message_text("Run ls? (2)", CHAT, card.message_id, reply_markup=CARD)
    assert sent.reply_markup == CARD.to_dict()


BUTTON = "Bad Request: can't parse inline keyboard button: "


@pytest.mark.parametrize(
    ("button", "description"),
    [
        ({"text": "x", "callback_data": "é" * 33}, "Bad Request: BUTTON_DATA_INVALID"),  # 66 bytes
        (
            {"text": "x", "callback_data": ""},
            BUTTON + "Text buttons are unallowed in the inline keyboard",
        ),
        ({"text": "x"}, BUTTON + "Text buttons are unallowed in the inline keyboard"),
        ({"callback_data": "x"}, BUTTON + 'Can\'t find field "text"'),
        ({"text": 5, "callback_data": "x"}, BUTTON + 'Field "text" must be of type String'),
    ],
)
async def test_inline_keyboards_are_validated_like_telegram(
    fake: FakeTelegram, button: dict[str, Any], description: str
) -> None:
    async with httpx.AsyncClient(
        trust_env=False, base_url=f"{fake.base_url}/bot{DEFAULT_TOKEN}"
    ) as api:
        first = (await api.post("/sendMessage", json={"chat_id": CHAT, "text": "ok"})).json()
        message_id = first["result"]["message_id"]
        markup = {"inline_keyboard": [[button]]}
        message = {"chat_id": CHAT, "message_id": message_id}
        attempts = [
            ("sendMessage", {"chat_id": CHAT, "text": "card", "reply_markup": markup}),
            ("editMessageText", message | {"text": "new", "reply_markup": markup}),
            # a form sends the markup as a JSON string
            ("editMessageReplyMarkup", message | {"reply_markup": json.dumps(markup)}),
        ]
        for method, params in attempts:
            answer = await api.post(f"/{method}", json=params)
            assert (answer.status_code, answer.json()["description"]) == (400, description)
        not_rows = {"chat_id": CHAT, "text": "x", "reply_markup": {"inline_keyboard": {}}}
        refused = (await api.post("/sendMessage", json=not_rows)).json()["description"]
        assert refused == 'Bad Request: field "inline_keyboard" must be of type Array'
    [only] = fake.sent(CHAT)  # nothing refused was recorded or edited
    assert (only.visible, only.edited) == ("ok", False)
    longest = InlineKeyboardButton("x", callback_data="é" * 32)  # 64 bytes
    async with make_bot(fake) as bot:
        ok = await bot.send_message(CHAT, "x", reply_markup=InlineKeyboardMarkup([[longest]]))
    assert ok.message_id == message_id + 1  # a refused message took no id


async def test_late_unknown_and_too_long_answers_are_refused(fake: FakeTelegram) -> None:
    now = [1000.0]
    fake.clock = lambda: now[0]
    async with make_bot(fake) as bot:
        card = await bot.send_message(CHAT, "Run ls?", reply_markup=CARD)
        late = fake.press_button(CHAT, card.message_id, data="ap:7:deny", user_id=CHAT)
        in_time = fake.press_button(CHAT, card.message_id, text="Allow once", user_id=CHAT)
        with pytest.raises(BadRequest, match="Message_too_long"):
            await bot.answer_callback_query(in_time.id, "x" * 201)
        now[0] += 15.0  # the window's last moment still counts
        assert await bot.answer_callback_query(in_time.id, "x" * 200)
        fake.advance_clock(0.5)
        with pytest.raises(BadRequest, match=QUERY_TOO_OLD):
            await bot.answer_callback_query(late.id)
        with pytest.raises(BadRequest, match=QUERY_TOO_OLD):
            await bot.answer_callback_query("123456789")
    assert (late.answered, late.refusals) == (False, 1)
    assert in_time.answer is not None and in_time.answer.at == 1015.0
    assert [q.id for q in fake.callback_queries] == [late.id, in_time.id]
    with pytest.raises(ValueError):
        fake.press_button(CHAT, card.message_id, user_id=CHAT)  # neither text nor data


async def test_application_callback_handler_round_trip(fake: FakeTelegram) -> None:
    async def decide(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        query = update.callback_query
        assert query is not None and query.from_user is not None
        await query.answer(f"{query.data} noted")
        await query.edit_message_text(f"Decided: {query.data} by {query.from_user.first_name}")

    application = (
        Application.builder()
        .token(DEFAULT_TOKEN)
        .base_url(f"{fake.base_url}/bot")
        .base_file_url(f"{fake.base_url}/file/bot")
        .build()
    )
    application.add_handler(CallbackQueryHandler(decide))
    async with application:
        await application.start()
        assert application.updater is not None
        await application.updater.start_polling(poll_interval=0, timeout=1)
        group = -1009876543210
        card = await application.bot.send_message(group, "Run ls?", reply_markup=CARD)
        pressed = fake.press_button(
            group, card.message_id, text="Deny", user_id=77, first_name="Bo"
        )
        answer = await fake.wait_for_answer(pressed, 5)
        [sent] = fake.sent(group)
        await fake.wait_for(lambda: sent.edited, 5)
        await application.updater.stop()
        await application.stop()
    assert answer.text == "ap:7:deny noted" and not answer.show_alert
    assert (sent.visible, sent.buttons) == ("Decided: ap:7:deny by Bo", [])


async def test_button_press_over_the_control_api(fake: FakeTelegram) -> None:
    async with (
        make_bot(fake) as bot,
        httpx.AsyncClient(trust_env=False, base_url=fake.base_url) as control,
    ):
        card = await bot.send_message(CHAT, "Run ls?", reply_markup=CARD)
        body = {"chat_id": CHAT, "message_id": card.message_id, "text": "Deny", "user_id": CHAT}
        pressed = (await control.post("/_fake/press_button", json=body)).json()
        [update] = await bot.get_updates(timeout=1)
        assert update.callback_query is not None and update.callback_query.id == pressed["id"]
        await control.post("/_fake/advance_clock", json={"seconds": 60})
        with pytest.raises(BadRequest, match=QUERY_TOO_OLD):
            await update.callback_query.answer()
        [listed] = (await control.get("/_fake/callbacks")).json()
    assert (listed["id"], listed["data"], listed["answer"], listed["refusals"]) == (
        pressed["id"],
        "ap:7:deny",
        None,
        1,
    )
