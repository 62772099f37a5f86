"""The Telegram channel: the real python-telegram-bot against the fake Bot API server."""

from __future__ import annotations

import asyncio
import datetime as dtm
import itertools
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from pydantic import SecretStr
from telegram import Chat, ForumTopicCreated, Message, MessageEntity, User

from nanobot.bus.events import (
    Button,
    ChatRef,
    InboundMessage,
    OutboundMessage,
    StreamUpdate,
    Typing,
)
from nanobot.bus.queue import MessageBus
from nanobot.bus.records import outbound_from, outbound_record
from nanobot.channels._telegram_inbound import is_addressed, text_without_mentions
from nanobot.channels._telegram_send import Retry
from nanobot.channels._typing import DELAY as TYPING_DELAY
from nanobot.channels.base import (
    DeliveryError,
    InboxPolicy,
    Intake,
    IntakePort,
    OutboxPort,
    Undeliverable,
)
from nanobot.channels.manager import ChannelManager
from nanobot.channels.render import plain_text, split_telegram, telegram_html, visible_length
from nanobot.channels.telegram import TelegramChannel
from nanobot.config import TelegramConfig
from nanobot.errors import ConfigError
from nanobot.gate import ChannelRules, Gate, GroupPolicy
from nanobot.media.speech import Speaker, SpeechSettings
from nanobot.providers.litellm_provider import LiteLLMTransport
from nanobot.store import Access, Database, Journal
from nanobot.workspace import Workspace
from tests.fakes import audio
from tests.fakes import llm as fake_llms
from tests.fakes._telegram_html import utf16_len
from tests.fakes.outbox import MemoryOutbox
from tests.fakes.telegram import (
    DEFAULT_TOKEN,
    ApiError,
    FakeTelegram,
    Garbled,
    Hang,
    Origin,
    RateLimited,
    Refusal200,
    ServerError,
    Slow,
)

USER = 42
GROUP = -1001234567890
BOT = "nanobot_test_bot"
FAST = Retry(backoff=(0.01, 0.02, 0.04))

pytestmark = pytest.mark.filterwarnings("ignore::telegram.warnings.PTBDeprecationWarning")


class Recorder:
    """An intake that records what it is given and answers `result` (or what `decide` says).

    It admits, as the gate would with the channel's `group_policy`, everyone but `strangers`.
    """

    def __init__(
        self, result: Intake = Intake.ACCEPTED, group_policy: GroupPolicy = "mention"
    ) -> None:
        self.result = result
        self.messages: list[InboundMessage] = []
        self.decide: Callable[[InboundMessage], Awaitable[Intake]] | None = None
        self.group_policy = group_policy
        self.strangers: set[str] = set()
        self._changed = asyncio.Event()

    async def admits(self, channel: str, sender_id: str, *, private: bool, addressed: bool) -> bool:
        policy = self.group_policy
        listens = private or policy == "open" or (policy == "mention" and addressed)
        return listens and sender_id not in self.strangers

    async def __call__(self, message: InboundMessage) -> Intake:
        self.messages.append(message)
        self._changed.set()
        return await self.decide(message) if self.decide else self.result

    async def wait(self, count: int = 1, seconds: float = 5.0) -> list[InboundMessage]:
        async with asyncio.timeout(seconds):
            while len(self.messages) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.messages


@pytest.fixture
def fake(fake_telegram: FakeTelegram) -> FakeTelegram:
    return fake_telegram


@pytest.fixture
def inbox(tmp_path: Path) -> InboxPolicy:
    return InboxPolicy(tmp_path / "inbox", max_bytes=1000)


def make_channel(
    fake: FakeTelegram,
    intake: IntakePort,
    inbox: InboxPolicy,
    *,
    group_policy: GroupPolicy = "mention",
    stream_interval: float = 0.2,
    outbox: OutboxPort | None = None,
) -> TelegramChannel:
    config = TelegramConfig(
        enabled=True,
        token=SecretStr(DEFAULT_TOKEN),
        api_base=fake.base_url,
        group_policy=group_policy,
    )
    return TelegramChannel(
        config,
        intake,
        inbox,
        retry=FAST,
        stream_interval=stream_interval,
        typing_interval=0.1,
        poll_timeout=5,
        outbox=outbox,
    )


@asynccontextmanager
async def running(channel: TelegramChannel) -> AsyncIterator[asyncio.Task[None]]:
    connected = asyncio.Event()
    task = asyncio.create_task(channel.run(connected.set), name="telegram-under-test")
    waiter = asyncio.create_task(connected.wait())
    await asyncio.wait([task, waiter], timeout=10, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task.done():
        task.result()  # raises what run() raised
    assert connected.is_set()
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.wait([task], timeout=10)
        assert task.done()


@pytest.fixture
async def intake() -> Recorder:
    return Recorder()


@pytest.fixture
async def channel(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy
) -> AsyncIterator[TelegramChannel]:
    channel = make_channel(fake, intake, inbox)
    async with running(channel):
        yield channel


# ---- inbound ----------------------------------------------------------------------------


async def test_private_message_is_taken(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    fake.user_message(USER, "hello there", user_id=USER, first_name="Ada", username="ada")
    [message] = await intake.wait()
    assert message.chat == ChatRef("telegram", str(USER))
    assert (message.sender_id, message.sender_name, message.text) == ("42", "Ada", "hello there")
    assert message.is_private and message.addressed and message.attachments == ()
    assert message.message_id == f"{USER}:1" and message.received_at.tzinfo is not None


async def test_group_messages_are_addressed_by_mention_reply_or_command(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    await channel.deliver(OutboundMessage(ChatRef("telegram", str(GROUP)), "Which one?"))
    [question] = fake.sent(GROUP)
    group: Origin = {"user_id": 7, "chat_type": "supergroup", "first_name": "Bo"}
    fake.user_message(GROUP, "just chatting", **group)
    fake.user_message(GROUP, f"@{BOT} what time is it?", **group)
    fake.user_message(GROUP, f"hey @{BOT.upper()}, look", **group)
    answer: Origin = {**group, "reply_to": question.message_id}
    fake.user_message(GROUP, "the second", **answer)
    fake.user_message(GROUP, "/status", **group)
    fake.user_message(GROUP, f"/new@{BOT}", **group)
    fake.user_message(GROUP, "/new@some_other_bot", **group)  # never handed over
    fake.user_message(GROUP, "@someone_else hi", **group)
    messages = await intake.wait(7)
    await asyncio.sleep(0.1)
    assert [(m.text, m.addressed) for m in messages] == [
        ("just chatting", False),
        ("what time is it?", True),
        ("hey, look", True),
        ("the second", True),
        ("/status", True),
        (f"/new@{BOT}", True),
        ("@someone_else hi", False),
    ]
    assert {m.chat for m in messages} == {ChatRef("telegram", str(GROUP))}
    assert not any(m.is_private for m in messages) and messages[0].sender_id == "7"


async def test_forum_topic_is_its_own_chat_and_replies_go_there(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    fake.user_message(GROUP, f"@{BOT} hi", user_id=7, is_topic=True, thread_id=11)
    fake.user_message(GROUP, "not a topic", user_id=7, chat_type="supergroup", thread_id=3)
    topic, plain = await intake.wait(2)
    assert topic.chat == ChatRef("telegram", str(GROUP), "11") and topic.addressed
    assert plain.chat == ChatRef("telegram", str(GROUP))  # a reply thread, not a topic
    await channel.deliver(OutboundMessage(topic.chat, "in the topic", reply_to=topic.message_id))
    [sent] = fake.sent(GROUP)
    assert (sent.visible, sent.thread_id, sent.reply_to) == ("in the topic", 11, 1)


def test_topic_creation_pseudo_reply_does_not_address_the_bot() -> None:
    bot = User(1, "Nanobot", is_bot=True, username=BOT)
    user = User(7, "Bo", is_bot=False)
    chat = Chat(GROUP, "supergroup", is_forum=True)
    now = dtm.datetime.now(dtm.UTC)
    created = Message(
        11, now, chat, from_user=bot, forum_topic_created=ForumTopicCreated("Bot topic", 1)
    )
    in_topic = Message(
        12, now, chat, from_user=user, text="hello", message_thread_id=11,
        is_topic_message=True, reply_to_message=created,
    )  # fmt: skip
    assert not is_addressed(in_topic, bot)
    text = "Nanobot: hi 😀 @other"
    mention = MessageEntity("text_mention", 0, 7, user=bot)
    named = Message(13, now, chat, from_user=user, text=text, entities=[mention])
    assert is_addressed(named, bot) and text_without_mentions(named, bot) == "hi 😀 @other"


async def test_files_are_saved_under_the_inbox(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy
) -> None:
    fake.user_document(
        USER,
        filename="../../etc/pass wd.txt",
        content=b"secret notes",
        mime_type="text/plain",
        caption="read this",
        user_id=USER,
    )
    fake.user_photo(USER, content=b"\xff\xd8jpeg", user_id=USER)
    fake.user_voice(USER, content=b"OggS voice", user_id=USER)
    document, photo, voice = await intake.wait(3)
    assert document.text == "read this" and photo.text == voice.text == ""
    [doc] = document.attachments
    assert (doc.kind, doc.mime_type, doc.size) == ("document", "text/plain", 12)
    assert doc.path.parent == inbox.directory and doc.path.name == "etc_pass_wd.txt"
    assert doc.path.read_bytes() == b"secret notes"
    [image] = photo.attachments
    assert (image.kind, image.mime_type, image.path.read_bytes()) == (
        "photo",
        "image/jpeg",
        b"\xff\xd8jpeg",
    )
    [note] = voice.attachments
    assert (note.kind, note.mime_type, note.path.suffix) == ("voice", "audio/ogg", ".ogg")
    assert len(fake.calls("getFile")) == 3  # the photo's largest size only


async def test_oversize_files_are_refused_with_a_notice(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy
) -> None:
    fake.user_document(USER, filename="big.bin", content=b"x" * 2000, user_id=USER)
    [notice] = await fake.wait_for_sent(1, chat_id=USER)
    assert "big.bin" in notice.visible and "at most" in notice.visible
    fake.user_document(USER, filename="big2.bin", content=b"x" * 2000, caption="see", user_id=USER)
    [message] = await intake.wait(1)
    assert message.text.startswith("see\n\n(") and "big2.bin" in message.text
    assert message.attachments == ()
    await fake.wait_for_sent(2, chat_id=USER)
    assert fake.calls("getFile") == [] and not inbox.directory.exists()


async def test_an_inbox_that_is_a_symlink_is_moved_aside_and_the_file_kept(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy
) -> None:
    outside = inbox.directory.parent.parent
    inbox.directory.symlink_to(outside)  # as `exec` or write_file could leave it
    fake.user_document(USER, filename="a.txt", content=b"kept", caption="one", user_id=USER)
    [message] = await intake.wait(1)
    [doc] = message.attachments
    assert doc.path == inbox.directory / "a.txt" and doc.path.read_bytes() == b"kept"
    assert message.text == "one"
    assert (inbox.directory.parent / "inbox.not-a-folder").is_symlink()
    assert not (outside / "a.txt").exists()


async def test_a_file_that_cannot_be_kept_is_said_and_the_channel_goes_on(
    fake: FakeTelegram, intake: Recorder, tmp_path: Path
) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "people").symlink_to(tmp_path / "elsewhere")  # on the way to the inbox
    inbox = InboxPolicy(tmp_path / "people" / "42" / "inbox", max_bytes=1000, workspace=tmp_path)
    async with running(make_channel(fake, intake, inbox)) as task:
        fake.user_document(USER, filename="a.txt", content=b"a", caption="see", user_id=USER)
        fake.user_photo(USER, content=b"p", user_id=USER)
        fake.user_message(USER, "still there?", user_id=USER)
        notices = await fake.wait_for_sent(2, chat_id=USER)
        first, text = await intake.wait(2)  # a message that was only a file is not handed over
        assert not task.done()  # never failed, never restarted
    said = "I could not keep a.txt: the inbox folder has a symbolic link on its way ('people')"
    assert first.text.startswith(f"see\n\n({said}") and first.attachments == ()
    assert text.text == "still there?"
    assert notices[0].visible.startswith(said) and "Please send it again" in notices[0].visible
    assert "could not keep photo_" in notices[1].visible
    assert not fake.pending_updates  # each acknowledged once
    assert list((tmp_path / "elsewhere").iterdir()) == []


async def test_files_of_refused_messages_are_not_kept(
    fake: FakeTelegram, inbox: InboxPolicy
) -> None:
    intake = Recorder(Intake.REFUSED, group_policy="open")
    async with running(make_channel(fake, intake, inbox, group_policy="open")):
        fake.user_document(USER, filename="a.txt", content=b"a", user_id=USER)
        fake.user_photo(GROUP, content=b"p", user_id=7, chat_type="supergroup")
        await intake.wait(2)
        await fake.wait_for(lambda: not fake.pending_updates)
    assert list(inbox.directory.iterdir()) == []


async def test_a_strangers_files_are_never_downloaded_yet_they_get_a_pairing_code(
    fake: FakeTelegram, inbox: InboxPolicy, tmp_path: Path
) -> None:
    stranger = 666
    async with await Database.open(tmp_path / "state.db") as db:
        bus = MessageBus()
        rules = {"telegram": ChannelRules(frozenset({str(USER)}), "open")}
        gate = Gate(rules, Access(db), Journal(db), bus)
        async with running(make_channel(fake, gate, inbox, group_policy="open")):
            fake.user_photo(stranger, content=b"\xff\xd8private", user_id=stranger)
            fake.user_document(stranger, filename="a.txt", content=b"a", user_id=stranger)
            fake.user_photo(GROUP, content=b"p", user_id=stranger, chat_type="supergroup")
            await fake.wait_for(lambda: not fake.pending_updates)
            assert fake.calls("getFile") == [] and fake.downloads == []
            assert not inbox.directory.exists()
            [request] = await Access(db).pending()  # one code, though two private messages
            assert request.user_id == str(stranger)
            async with asyncio.timeout(5):
                notice = await anext(bus.outbound("telegram"))
            assert isinstance(notice, OutboundMessage) and request.code in notice.text
            assert await Journal(db).pending_inbound() == []
            fake.user_photo(USER, content=b"\xff\xd8mine", user_id=USER)
            async with asyncio.timeout(5):
                message = await anext(bus.inbound())
        [photo] = message.attachments
        assert photo.path.read_bytes() == b"\xff\xd8mine"
        assert len(fake.calls("getFile")) == len(fake.downloads) == 1


async def test_a_file_sent_before_approval_is_asked_for_again(
    fake: FakeTelegram, inbox: InboxPolicy
) -> None:
    # Approved between the check and the hand-over: the message is taken, without the file.
    intake = Recorder()
    intake.strangers.add(str(USER))
    async with running(make_channel(fake, intake, inbox)):
        fake.user_photo(USER, content=b"\xff\xd8jpeg", user_id=USER)
        [message] = await intake.wait()
        [notice] = await fake.wait_for_sent(1, chat_id=USER)
    assert message.attachments == () and "photo_" in message.text
    assert "send it again" in notice.visible
    assert fake.downloads == [] and not inbox.directory.exists()


# ---- acknowledgement ----------------------------------------------------------------------


async def test_update_is_confirmed_only_after_intake_returned(
    fake: FakeTelegram, inbox: InboxPolicy
) -> None:
    intake, release = Recorder(), asyncio.Event()

    async def slow(message: InboundMessage) -> Intake:
        await release.wait()
        return Intake.ACCEPTED

    intake.decide = slow
    async with running(make_channel(fake, intake, inbox)):
        update_id = fake.user_message(USER, "journal me first", user_id=USER)
        await intake.wait()
        await asyncio.sleep(0.3)
        assert [u["update_id"] for u in fake.pending_updates] == [update_id]
        offsets = [int(c.params.get("offset") or 0) for c in fake.calls("getUpdates")]
        assert max(offsets) <= update_id
        release.set()
        await fake.wait_for(lambda: not fake.pending_updates)


async def test_closed_intake_leaves_the_update_for_the_next_start(
    fake: FakeTelegram, inbox: InboxPolicy
) -> None:
    closed = Recorder(Intake.CLOSED)
    async with running(make_channel(fake, closed, inbox)):
        update_id = fake.user_message(USER, "too late", user_id=USER)
        await closed.wait()
    assert [u["update_id"] for u in fake.pending_updates] == [update_id]
    again = Recorder()
    async with running(make_channel(fake, again, inbox)):
        [message] = await again.wait()
        await fake.wait_for(lambda: not fake.pending_updates)
    assert message.text == "too late"


async def test_failing_intake_ends_run_and_the_update_comes_again(
    fake: FakeTelegram, inbox: InboxPolicy
) -> None:
    intake = Recorder()

    async def broken(message: InboundMessage) -> Intake:
        raise OSError("disk full")

    intake.decide = broken
    channel = make_channel(fake, intake, inbox)
    async with running(channel) as task:
        fake.user_message(USER, "keep me", user_id=USER)
        with pytest.raises(OSError, match="disk full"):
            await asyncio.wait_for(task, 5)
    assert len(fake.pending_updates) == 1
    intake.decide = None
    async with running(channel):  # the manager restarts the same channel
        await intake.wait(2)
        await fake.wait_for(lambda: not fake.pending_updates)


async def test_run_stops_cleanly(fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy) -> None:
    before = asyncio.all_tasks()
    channel = make_channel(fake, intake, inbox)
    async with running(channel) as task:
        await fake.wait_for(lambda: fake.polling)
        await channel.deliver(Typing(ChatRef("telegram", str(USER)), active=True))
    assert task.done() and task.cancelled()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - before == set()
    assert not fake.polling


async def test_a_rejected_token_is_a_config_error(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy
) -> None:
    fake.valid_token = "1:another-token"
    with pytest.raises(ConfigError, match=r"channels\.telegram\.token") as info:
        await make_channel(fake, intake, inbox).run(lambda: None)
    assert DEFAULT_TOKEN not in str(info.value) and info.value.__cause__ is None


# ---- outbound -----------------------------------------------------------------------------

CHAT = ChatRef("telegram", str(USER))


async def test_markup_arrives_intact(channel: TelegramChannel, fake: FakeTelegram) -> None:
    text = "a < b, mail <email@example.com>, AT&T & co, 2 * 3 *unbalanced, **bold**"
    await channel.deliver(OutboundMessage(CHAT, text, reply_to=f"{USER}:5"))
    [sent] = fake.sent(USER)
    assert sent.parse_mode == "HTML" and sent.reply_to is None  # no message 5: sent anyway
    for part in ("a < b", "email@example.com", "AT&T & co", "2 * 3 *unbalanced", "bold"):
        assert part in sent.visible
    assert "**" not in sent.visible


async def test_long_reply_is_split_in_order(channel: TelegramChannel, fake: FakeTelegram) -> None:
    words = [f"w{index:04d}" for index in range(2000)]  # 12,000 characters
    await channel.deliver(OutboundMessage(CHAT, " ".join(words)))
    sent = fake.sent(USER)
    assert len(sent) >= 3 and all(utf16_len(m.visible) <= 4096 for m in sent)
    assert " ".join(m.visible for m in sent).split() == words


async def test_unparsable_chunk_goes_out_as_plain_text(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    fake.fail_next("sendMessage", ApiError(400, "Bad Request: can't parse entities: Unsupported"))
    await channel.deliver(OutboundMessage(CHAT, "**bold** and a < b"))
    [sent] = fake.sent(USER)
    assert (sent.visible, sent.parse_mode) == ("bold and a < b", None)


def voice_file(inbox: InboxPolicy, seconds: float = 2.0) -> Path:
    """A spoken reply's audio where the speaker keeps it, under the channel's workspace."""
    path = inbox.directory.parent / "outbox" / "voice" / "a1b2.ogg"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(audio.ogg_opus(seconds))
    return path


def spoken(text: str, voice: Path | None) -> OutboundMessage:
    return OutboundMessage(CHAT, text, reply_to=f"{USER}:5", outbox_id=3, speak=True, voice=voice)


async def test_a_spoken_reply_is_a_voice_note_with_its_text_as_caption(
    channel: TelegramChannel, fake: FakeTelegram, inbox: InboxPolicy
) -> None:
    path = voice_file(inbox)
    await channel.deliver(spoken("It is **sunny** at 20°C.", path))
    [sent] = fake.sent(USER)
    assert sent.method == "sendVoice" and sent.file is not None
    assert sent.file.content == path.read_bytes()
    assert (sent.visible, sent.parse_mode) == ("It is sunny at 20°C.", "HTML")
    assert "<b>sunny</b>" in sent.text


async def test_a_reply_too_long_for_a_caption_follows_its_voice_note(
    channel: TelegramChannel, fake: FakeTelegram, inbox: InboxPolicy
) -> None:
    words = " ".join(f"word{n}" for n in range(300))  # about 2,400 characters: one message
    await channel.deliver(spoken(words, voice_file(inbox)))
    voice, text = fake.sent(USER)
    assert (voice.method, voice.visible) == ("sendVoice", "")
    assert (text.method, text.visible) == ("sendMessage", words)


@pytest.mark.parametrize(
    ("refusal", "methods"),
    [
        ("Bad Request: can't parse entities: unsupported start tag", ["sendVoice"]),
        ("Bad Request: message caption is too long", ["sendVoice", "sendMessage"]),
        ("Bad Request: VOICE_MESSAGES_FORBIDDEN", ["sendMessage"]),
    ],
    ids=["markup", "caption-too-long", "no-voice-notes"],
)
async def test_a_refused_voice_note_loses_none_of_the_text(
    channel: TelegramChannel,
    fake: FakeTelegram,
    inbox: InboxPolicy,
    refusal: str,
    methods: list[str],
) -> None:
    fake.fail_next("sendVoice", ApiError(400, refusal))
    await channel.deliver(spoken("It is **sunny**.", voice_file(inbox)))
    sent = fake.sent(USER)
    assert [m.method for m in sent] == methods
    assert "It is sunny." in [m.visible for m in sent]
    # Tried again in the other form (plain, or without its caption), or not at all.
    assert len(fake.calls("sendVoice")) == (1 if "FORBIDDEN" in refusal else 2)


async def test_a_voice_file_that_leads_outside_the_workspace_is_not_sent(
    channel: TelegramChannel, fake: FakeTelegram, inbox: InboxPolicy, tmp_path: Path
) -> None:
    # The model's shell may leave a symlink in the audio's place: what it leads to (a
    # secret outside the workspace) never goes out; the text does.
    secret = tmp_path.parent / f"{tmp_path.name}-secret.ogg"
    secret.write_bytes(audio.ogg_opus(1))
    path = voice_file(inbox)
    path.unlink()
    path.symlink_to(secret)
    try:
        await channel.deliver(spoken("Hello.", path))
    finally:
        secret.unlink()
    [sent] = fake.sent(USER)
    assert (sent.method, sent.visible) == ("sendMessage", "Hello.")


async def test_rate_limit_is_waited_out(channel: TelegramChannel, fake: FakeTelegram) -> None:
    fake.fail_next("sendMessage", RateLimited(retry_after=1))
    await channel.deliver(OutboundMessage(CHAT, "patience"))
    first, second = fake.calls("sendMessage")
    assert second.at - first.at >= 0.9 and [m.visible for m in fake.sent(USER)] == ["patience"]


async def test_server_errors_are_retried_then_given_up(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    fake.fail_next("sendMessage", ServerError(500), times=2)
    await channel.deliver(OutboundMessage(CHAT, "made it"))
    assert [m.visible for m in fake.sent(USER)] == ["made it"]
    fake.fail_next("sendMessage", ServerError(502), times=4)
    with pytest.raises(DeliveryError):
        await channel.deliver(OutboundMessage(CHAT, "lost for now"))
    assert len(fake.calls("sendMessage")) == 3 + 4
    fake.fail_next("sendMessage", ApiError(403, "Forbidden: bot was blocked by the user"))
    with pytest.raises(DeliveryError, match="blocked"):
        await channel.deliver(OutboundMessage(CHAT, "blocked"))
    assert len(fake.calls("sendMessage")) == 3 + 4 + 1  # no retry


REFUSALS = [  # as Telegram words them; True: the chat is closed to the bot
    (ApiError(403, "Forbidden: bot was blocked by the user"), True),
    (ApiError(403, "Forbidden: bot was kicked from the supergroup chat"), True),
    (ApiError(403, "Forbidden: user is deactivated"), True),
    (ApiError(403, "Forbidden: bot can't initiate conversation with a user"), True),
    (ApiError(400, "Bad Request: chat not found"), True),
    (
        ApiError(
            400,
            "Bad Request: group chat was upgraded to a supergroup chat",
            {"migrate_to_chat_id": -1001234567890},
        ),
        True,
    ),
    (ApiError(400, "Bad Request: message text is empty"), False),
    (ApiError(400, "Bad Request: message thread not found"), False),
    (ApiError(400, "Bad Request: not enough rights to send text messages to the chat"), False),
    (ApiError(400, "Bad Request: TOPIC_CLOSED"), False),
]


@pytest.mark.parametrize(("refusal", "closed"), REFUSALS)
async def test_a_refusal_is_given_up_at_once(
    channel: TelegramChannel, fake: FakeTelegram, refusal: ApiError, closed: bool
) -> None:
    fake.fail_next("sendMessage", refusal)
    with pytest.raises(Undeliverable) as raised:
        await channel.deliver(OutboundMessage(CHAT, "hello"))
    assert raised.value.chat_closed is closed
    assert len(fake.calls("sendMessage")) == 1  # neither retried nor tried in another form


async def test_a_rejected_token_is_not_the_replys_fault(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    fake.fail_next("sendMessage", ApiError(401, "Unauthorized"))
    with pytest.raises(DeliveryError) as raised:
        await channel.deliver(OutboundMessage(CHAT, "kept for later"))
    assert not isinstance(raised.value, Undeliverable)  # the reply stays in the outbox


async def test_too_many_entities_go_out_in_shorter_parts_then_as_plain_text(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    links = " ".join(f"[link {n}](https://example.com/{n})" for n in range(200))
    fake.fail_next("sendMessage", ApiError(400, "Bad Request: ENTITIES_TOO_LONG"))
    await channel.deliver(OutboundMessage(CHAT, links))
    words = plain_text(telegram_html(links)).split()
    parts = fake.sent(USER)
    assert len(parts) >= 2 and {m.parse_mode for m in parts} == {"HTML"}
    assert " ".join(m.visible for m in parts).split() == words
    assert all(m.entities for m in parts)  # the links are still links
    # Still too long after every halving (the first part of the first part of ...): that
    # piece goes as plain text, the rest as HTML.
    fake.fail_next("sendMessage", ApiError(400, "Bad Request: message is too long"), times=4)
    await channel.deliver(OutboundMessage(CHAT, links))
    pieces = fake.sent(USER)[len(parts) :]
    assert pieces[0].parse_mode is None and {m.parse_mode for m in pieces[1:]} == {"HTML"}
    assert len(pieces) >= 4 and " ".join(m.visible for m in pieces).split() == words


async def test_a_send_answered_with_no_message_is_a_clear_delivery_error(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    for answer in (True, {"chat": {"id": USER}}, {"message_id": "7"}):
        fake.fail_next("sendMessage", Garbled(answer))
        with pytest.raises(DeliveryError, match=r"sendMessage: Telegram answered .*not a message"):
            await channel.deliver(OutboundMessage(CHAT, "hello"))
    await channel.deliver(OutboundMessage(CHAT, "hello again"))
    assert [m.visible for m in fake.sent(USER)] == ["hello again"]


async def test_a_200_that_says_ok_false_is_the_refusal_it_reports(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    # PTB reads any 200 as a success and looks up its `result`: a KeyError nobody caught.
    empty = {"ok": False, "error_code": 400, "description": "Bad Request: message text is empty"}
    fake.fail_next("sendMessage", Refusal200(empty))
    with pytest.raises(Undeliverable, match="Message text is empty") as raised:
        await channel.deliver(OutboundMessage(CHAT, "hello"))
    assert raised.value.chat_closed is False
    blocked = {"ok": False, "error_code": 403, "description": "Forbidden: bot was blocked"}
    fake.fail_next("sendMessage", Refusal200(blocked))
    with pytest.raises(Undeliverable) as raised:
        await channel.deliver(OutboundMessage(CHAT, "hello"))
    assert raised.value.chat_closed is True
    assert len(fake.calls("sendMessage")) == 2  # neither retried
    assert fake.sent(USER) == []


@pytest.mark.parametrize(
    "body",
    [{"ok": False}, {"ok": False, "error_code": "x"}, "<html>502 Bad Gateway</html>", ""],
    ids=["no-fields", "bad-code", "html", "empty"],
)
async def test_a_200_that_says_nothing_useful_is_a_passing_failure(
    channel: TelegramChannel, fake: FakeTelegram, body: object
) -> None:
    fake.fail_next("sendMessage", Refusal200(body))
    await channel.deliver(OutboundMessage(CHAT, "made it"))  # retried at once, like a 502
    assert [m.visible for m in fake.sent(USER)] == ["made it"]
    fake.fail_next("sendMessage", Refusal200(body), times=4)
    with pytest.raises(DeliveryError) as raised:
        await channel.deliver(OutboundMessage(CHAT, "kept for later"))
    assert not isinstance(raised.value, Undeliverable)  # the outbox tries it again later
    assert "Bad Gateway" in str(raised.value)


async def test_a_200_with_ok_false_is_recorded_and_retried_in_order(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy
) -> None:
    fake.fail_next("sendMessage", Refusal200({"ok": False}), times=4)  # one delivery's tries
    outbox = MemoryOutbox()
    async with delivering(make_channel(fake, intake, inbox, outbox=outbox), outbox) as bus:
        await bus.publish(OutboundMessage(CHAT, "first", outbox_id=1))
        await bus.publish(OutboundMessage(CHAT, "second", outbox_id=2))
        sent = await fake.wait_for_sent(2, chat_id=USER)
        assert [m.visible for m in sent] == ["first", "second"]
        async with asyncio.timeout(10):
            while outbox.confirmed != [1, 2]:  # noqa: ASYNC110 - confirmed after the send
                await asyncio.sleep(0.01)
    [(row, error)] = outbox.failed  # the failed attempt is counted, with Telegram's word
    assert row == 1 and "Bad Gateway" in error


async def test_a_retried_delivery_resumes_after_the_sent_chunks(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    message = OutboundMessage(CHAT, "x" * 3500 + "\n\n" + "y" * 3500, outbox_id=9)
    fake.fail_next("sendMessage", Slow(0.3))  # the first chunk arrives, its answer lags
    delivery = asyncio.create_task(channel.deliver(message))
    await fake.wait_for_sent(1, chat_id=USER)
    fake.fail_next("sendMessage", ServerError(500), times=4)
    with pytest.raises(DeliveryError):
        await delivery
    await channel.deliver(message)  # the manager's retry
    assert [m.visible for m in fake.sent(USER)] == ["x" * 3500, "y" * 3500]


@asynccontextmanager
async def delivering(channel: TelegramChannel, outbox: MemoryOutbox) -> AsyncIterator[MessageBus]:
    """`channel` run and delivered to by a ChannelManager, as in the gateway."""
    bus = MessageBus()
    manager = asyncio.create_task(ChannelManager([channel], bus, outbox).run())
    try:
        yield bus
    finally:
        manager.cancel()
        await asyncio.wait([manager], timeout=10)


async def test_a_chat_failing_for_a_while_holds_up_no_other(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy
) -> None:
    # Telegram answers 500 to every send to one forum group: each of its 40 topics has a
    # reply waiting to be tried again, and another chat's reply goes out meanwhile.
    fake.fail_next("*", ServerError(500), times=None, chat_id=GROUP)
    outbox = MemoryOutbox()
    async with delivering(make_channel(fake, intake, inbox, outbox=outbox), outbox) as bus:
        for topic in range(1, 41):
            chat = ChatRef("telegram", str(GROUP), str(topic))
            await bus.publish(OutboundMessage(chat, f"topic {topic}", outbox_id=topic))
        tries = 1 + len(FAST.backoff)
        await fake.wait_for(lambda: len(fake.calls("sendMessage")) >= 40 * tries)
        await bus.publish(OutboundMessage(CHAT, "not held up", outbox_id=100))
        [sent] = await fake.wait_for_sent(1, chat_id=USER)
        assert sent.visible == "not held up"
        assert sorted(i for i, _ in outbox.failed) == list(range(1, 41))  # waiting to retry
        assert fake.sent(GROUP) == []


async def test_a_blocked_bot_sends_nothing_more_there_until_the_chat_writes_again(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy, warnings: list[str]
) -> None:
    blocked = "Forbidden: bot was blocked by the user"
    fake.fail_next("*", ApiError(403, blocked), times=None, chat_id=USER)
    outbox = MemoryOutbox()
    other = ChatRef("telegram", str(USER + 1))
    async with delivering(make_channel(fake, intake, inbox, outbox=outbox), outbox) as bus:
        await bus.publish(OutboundMessage(CHAT, "an answer", reply_to=f"{USER}:1", outbox_id=1))
        await bus.publish(OutboundMessage(CHAT, "a reminder", outbox_id=2))  # answers no one
        await bus.publish(OutboundMessage(other, "elsewhere", outbox_id=3))
        await fake.wait_for_sent(1, chat_id=USER + 1)
        await fake.wait_for(lambda: len(outbox.given_up) == 2)
        assert [i for i, _ in outbox.given_up] == [1, 2] and blocked in outbox.given_up[1][1]
        assert len(fake.calls("sendMessage")) == 2  # one try for the blocked chat, at once
        assert len([w for w in warnings if blocked in w]) == 1
        fake.clear_faults(USER)  # unblocked; the user writes again and is answered
        await bus.publish(OutboundMessage(CHAT, "welcome back", reply_to=f"{USER}:2", outbox_id=4))
        [back] = await fake.wait_for_sent(1, chat_id=USER)
        assert back.visible == "welcome back"


async def test_a_long_reply_reports_its_parts_and_resumes_from_them(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy
) -> None:
    outbox = MemoryOutbox()
    channel = make_channel(fake, intake, inbox, outbox=outbox)
    text = "\n\n".join(["x" * 3500, "y" * 3500, "z" * 3500])
    async with running(channel):
        await channel.deliver(OutboundMessage(ChatRef("telegram", str(USER)), text, outbox_id=7))
        # Not the last part: the manager confirms the whole reply.
        assert outbox.progressed == [(7, 1), (7, 2)]
        # After a restart the outbox row says two parts were out: only the third is sent.
        again = OutboundMessage(ChatRef("telegram", str(USER)), text, outbox_id=7, parts_sent=2)
        await channel.deliver(again)
    assert [m.visible for m in fake.sent(USER)] == ["x" * 3500, "y" * 3500, "z" * 3500, "z" * 3500]


async def test_a_spoken_reply_cut_off_by_a_crash_is_sent_once_after_the_restart(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy, fake_llm: fake_llms.FakeLLM
) -> None:
    # The gateway's delivery path on the real outbox: the manager makes the speech (litellm
    # against the fake /audio/speech), the channel sends it. A crash (everything cancelled,
    # nothing confirmed) while the speech is made, and another between the voice note and
    # the text: after each restart, what was missing goes out, and nothing twice.
    # litellm loaded first (seconds on a busy machine): the waits below are for delivery.
    await asyncio.to_thread(LiteLLMTransport("openai/tts-1").prepare)
    settings = SpeechSettings("openai/tts-1", api_base=fake_llm.base_url, api_key="k")
    speaker = Speaker(settings, Workspace(inbox.directory.parent))
    short, long = "Said once.", " ".join(f"Point {n} is worth making." for n in range(60))
    async with await Database.open(inbox.directory.parent / "state.db") as db:
        journal = Journal(db)
        for reply in (short, long):
            spoken = OutboundMessage(CHAT, reply, reply_to=f"{USER}:5", speak=True)
            await journal.enqueue("telegram", outbound_record(spoken))

        async def start_until(done: Callable[[], bool], *, drain: bool = False) -> None:
            """A gateway's start: what the outbox holds delivered, until `done()` (and, with
            `drain`, until all of it is)."""
            bus = MessageBus()
            channel = make_channel(fake, intake, inbox, outbox=journal)
            manager = ChannelManager([channel], bus, journal, voices=speaker)
            running = asyncio.create_task(manager.run())
            for row in await journal.pending_outbox():
                await bus.publish(outbound_from(row.message, row.id, row.parts_sent))
            try:
                await fake.wait_for(done, seconds=30)
                if drain:
                    await asyncio.wait_for(manager.drain(), 10)
            finally:
                running.cancel()  # a crash: nothing more is confirmed
                await asyncio.wait([running], timeout=10)

        # The speech of the first reply hangs; the crash comes while it is made.
        fake_llm.script_for("tts-1", fake_llms.Hang())
        await start_until(lambda: len(fake_llm.speech_requests) == 1)
        assert fake.sent(USER) == []
        # The first reply goes out whole; the second's text hangs after its voice note.
        fake.fail_next("sendMessage", Hang())
        await start_until(lambda: len(fake.calls("sendMessage")) == 1)
        [remaining] = await journal.pending_outbox()
        assert remaining.parts_sent == 1  # its voice note is out
        # Only the second reply's text is left to send.
        await start_until(lambda: len(fake.sent(USER)) == 3, drain=True)
        assert await journal.pending_outbox() == []
    first, voice, text = fake.sent(USER)
    assert (first.method, first.visible) == ("sendVoice", short)
    assert (voice.method, voice.visible) == ("sendVoice", "")
    assert (text.method, text.visible) == ("sendMessage", long)
    # Made once each (the first also cut off once); the second not again after its note.
    asked = [r.input for r in fake_llm.speech_requests]
    assert asked[:2] == [short, short] and len(asked) == 3 and long.startswith(asked[2])


async def test_typing_is_shown_while_a_turn_runs(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    topic = ChatRef("telegram", str(GROUP), "11")
    await channel.deliver(Typing(topic, active=True))
    await fake.wait_for(lambda: len(fake.actions) >= 3, 5)
    await channel.deliver(Typing(topic, active=False))
    count = len(fake.actions)
    await asyncio.sleep(0.3)
    assert len(fake.actions) == count
    assert {(a.chat_id, a.action, a.thread_id) for a in fake.actions} == {(GROUP, "typing", 11)}


async def test_a_quick_turn_shows_no_typing(channel: TelegramChannel, fake: FakeTelegram) -> None:
    # Telegram: send a chat action only when the answer takes a noticeable time.
    chat = ChatRef("telegram", str(USER))
    await channel.deliver(Typing(chat, active=True))
    await asyncio.sleep(TYPING_DELAY / 3)
    await channel.deliver(Typing(chat, active=False))
    await asyncio.sleep(TYPING_DELAY)
    assert fake.actions == []


async def test_streamed_reply_is_edited_in_place(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    fake.user_message(USER, "tell me a story", user_id=USER)
    [question] = await intake.wait()
    text = ""
    for index in range(30):
        text += f"part {index} "
        await channel.deliver(StreamUpdate(CHAT, "s1", text, reply_to=question.message_id))
        await asyncio.sleep(0.03)
    final = text + "\n\n" + "z" * 5000
    await channel.deliver(
        OutboundMessage(CHAT, final, reply_to=question.message_id, stream_id="s1")
    )
    await channel.deliver(StreamUpdate(CHAT, "s1", "late"))  # after the final: ignored
    first, *rest = fake.sent(USER)
    expected = [plain_text(chunk) for chunk in split_telegram(telegram_html(final))]
    # The paragraph break splits first (a word is never cut), then the long run of z is cut.
    assert [first.visible] + [m.visible for m in rest] == expected and len(rest) == 2
    assert first.reply_to == 1 and rest[0].reply_to is None
    assert len(first.history) >= 2 and first.history[0].visible == "part 0"
    edits = [c.at for c in fake.calls("editMessageText")]
    # Stream edits are spaced; the final, exact edit goes out at once (a wait would hold up
    # every other chat's delivery on this channel).
    assert all(b - a >= 0.19 for a, b in itertools.pairwise(edits[:-1]))
    assert len(edits) < 10  # 30 updates, at most one edit per 0.2 s


async def test_stream_falls_back_to_new_messages_when_the_edit_fails(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    await channel.deliver(StreamUpdate(CHAT, "s2", "draft"))
    fake.fail_next("editMessageText", ApiError(400, "Bad Request: message to edit not found"))
    await channel.deliver(OutboundMessage(CHAT, "final answer", stream_id="s2"))
    assert [m.visible for m in fake.sent(USER)] == ["draft", "final answer"]


async def test_stream_updates_never_raise(channel: TelegramChannel, fake: FakeTelegram) -> None:
    fake.fail_next("sendMessage", ServerError(500))
    await channel.deliver(StreamUpdate(CHAT, "s3", "lost"))
    await channel.deliver(StreamUpdate(CHAT, "s3", "shown"))
    assert [m.visible for m in fake.sent(USER)] == ["shown"]
    assert visible_length("shown") == 5


async def test_a_file_that_cannot_be_downloaded_is_reported(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    fake.fail_next("file", ServerError(500), times=4)  # the first try and three retries
    fake.user_photo(USER, content=b"jpeg", caption="what is this?", user_id=USER)
    [message] = await intake.wait()
    assert message.attachments == () and message.text.startswith("what is this?\n\n(")
    [notice] = await fake.wait_for_sent(1, chat_id=USER)
    assert "could not download photo_1.jpg" in notice.visible and notice.reply_to == 1


async def test_files_in_unaddressed_group_messages_are_not_downloaded(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    fake.user_photo(GROUP, content=b"jpeg", caption="our trip", user_id=7, chat_type="supergroup")
    fake.user_photo(GROUP, content=b"jpeg", caption=f"@{BOT} and this?", user_id=7)
    unaddressed, addressed = await intake.wait(2)
    assert (unaddressed.addressed, unaddressed.attachments) == (False, ())
    assert addressed.addressed and addressed.text == "and this?"
    assert [a.kind for a in addressed.attachments] == ["photo"]
    assert len(fake.calls("getFile")) == 1


def slow_intake() -> tuple[Recorder, asyncio.Event]:
    """An intake that holds the message "slow" until the event is set."""
    intake, release = Recorder(), asyncio.Event()

    async def decide(message: InboundMessage) -> Intake:
        if message.text == "slow":
            await release.wait()
        return Intake.ACCEPTED

    intake.decide = decide
    return intake, release


async def test_one_chats_slow_intake_does_not_hold_up_another_nor_is_confirmed_early(
    fake: FakeTelegram, inbox: InboxPolicy
) -> None:
    other = USER + 1
    intake, release = slow_intake()
    # Queued before the channel polls, so they come in one getUpdates batch.
    fake.user_message(USER, "slow", user_id=USER)
    fake.user_message(USER, "after slow, same chat", user_id=USER)
    fake.user_message(other, "another chat", user_id=other)
    async with running(make_channel(fake, intake, inbox)):
        await intake.wait(2)
        assert [m.text for m in intake.messages] == ["slow", "another chat"]
        await asyncio.sleep(0.3)
        assert len(intake.messages) == 2  # the same chat waits its turn
        assert len(fake.pending_updates) == 3  # nothing confirmed while one is being taken
        release.set()
        await intake.wait(3)
        assert intake.messages[2].text == "after slow, same chat"
        await fake.wait_for(lambda: not fake.pending_updates)


async def test_new_messages_of_other_chats_come_in_while_one_is_being_taken(
    fake: FakeTelegram, inbox: InboxPolicy
) -> None:
    other = USER + 1
    intake, release = slow_intake()
    async with running(make_channel(fake, intake, inbox)):
        slow = fake.user_message(USER, "slow", user_id=USER)
        await intake.wait(1)
        meanwhile = fake.user_message(other, "meanwhile", user_id=other)  # a later poll's
        await intake.wait(2)
        # Polls repeat both updates (nothing from the slow one on is confirmed yet), and
        # neither is taken twice.
        await fake.wait_for(lambda: len(fake.calls("getUpdates")) >= 4)
        assert [u["update_id"] for u in fake.pending_updates] == [slow, meanwhile]
        release.set()
        await fake.wait_for(lambda: not fake.pending_updates)
    assert [m.text for m in intake.messages] == ["slow", "meanwhile"]


# ---- buttons: cards, edits of them, presses ------------------------------------------------

APPROVE = (
    Button("Allow once", "/approve a1 once"),
    Button("Always allow this command", "/approve a1 always"),
    Button("Deny", "/deny a1"),
)


def card(
    chat: ChatRef = CHAT, text: str = "Run `ls -la`?", *, outbox_id: int | None = None
) -> OutboundMessage:
    return OutboundMessage(chat, text, kind="card", buttons=APPROVE, outbox_id=outbox_id)


async def test_a_card_goes_out_with_its_keyboard_and_deliver_returns_its_id(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    sent_id = await channel.deliver(card())
    [message] = fake.sent(USER)
    assert sent_id == str(message.message_id)
    assert message.visible == "Run ls -la?" and message.parse_mode == "HTML"
    # One button a row: the labels are read in full on a phone.
    assert [[(b["text"], b["callback_data"]) for b in row] for row in message.keyboard] == [
        [(b.label, b.data)] for b in APPROVE
    ]


async def test_a_long_card_has_its_keyboard_under_its_last_part(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    command = "\n".join(f"echo {index} {'y' * 70}" for index in range(80))
    sent_id = await channel.deliver(card(text=f"Run this?\n\n```\n{command}\n```"))
    *parts, last = fake.sent(USER)
    assert parts and all(part.keyboard == [] for part in parts)
    assert sent_id == str(last.message_id) and len(last.buttons) == len(APPROVE)
    assert "".join(m.visible for m in [*parts, last]).count("echo") == 80


async def test_a_card_to_a_users_private_chat_goes_to_their_id(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    chat = ChatRef.direct("telegram", str(USER + 1))
    sent_id = await channel.deliver(card(chat))
    await channel.deliver(OutboundMessage(chat, "Decided.", replaces=sent_id))
    [message] = fake.sent(USER + 1)
    assert (message.visible, message.keyboard) == ("Decided.", [])
    await channel.deliver(Typing(chat, active=True))
    await fake.wait_for(lambda: bool(fake.actions))
    await channel.deliver(Typing(chat, active=False))
    assert fake.actions[0].chat_id == USER + 1


async def test_button_data_over_64_bytes_is_refused_saying_why(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    buttons = (Button("Allow once", "/approve " + "a" * 60),)
    item = OutboundMessage(CHAT, "Run it?", kind="card", buttons=buttons, outbox_id=3)
    with pytest.raises(
        Undeliverable, match="'Allow once' carries 69 bytes of data; Telegram takes 1 to 64"
    ):
        await channel.deliver(item)
    assert fake.sent() == [] and fake.calls("sendMessage") == []


async def test_an_edit_replaces_the_text_and_removes_the_keyboard(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    sent_id = await channel.deliver(card())
    edited = await channel.deliver(
        OutboundMessage(CHAT, "**Allowed once** by Ada", replaces=sent_id)
    )
    [message] = fake.sent(USER)
    assert edited == sent_id
    assert (message.visible, message.keyboard) == ("Allowed once by Ada", [])
    assert message.history[0].visible == "Run ls -la?" and message.history[0].reply_markup
    # An edit with buttons shows exactly those.
    again = OutboundMessage(CHAT, "Still waiting", replaces=sent_id, buttons=APPROVE[2:])
    assert await channel.deliver(again) == sent_id
    assert [b["text"] for b in message.buttons] == ["Deny"]


async def test_an_edit_to_what_the_message_shows_already_is_done(
    channel: TelegramChannel, fake: FakeTelegram
) -> None:
    sent_id = await channel.deliver(card())
    for _ in range(2):  # the second: "message is not modified"
        assert await channel.deliver(OutboundMessage(CHAT, "Denied.", replaces=sent_id)) == sent_id
    assert len(fake.calls("editMessageText")) == 2
    assert [(m.visible, len(m.history)) for m in fake.sent(USER)] == [("Denied.", 1)]


@pytest.mark.parametrize("gone", ["message to edit not found", "message can't be edited"])
async def test_an_edit_of_a_message_that_cannot_be_edited_is_posted_anew(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder, gone: str
) -> None:
    sent_id = await channel.deliver(card())
    if gone == "message can't be edited":
        fake.user_message(USER, "not the bot's", user_id=USER)
        [theirs] = await intake.wait()
        sent_id = theirs.message_id.rsplit(":", 1)[1]
    else:
        fake.fail_next("editMessageText", ApiError(400, f"Bad Request: {gone}"))
    new_id = await channel.deliver(OutboundMessage(CHAT, "Expired.", replaces=sent_id))
    *_, posted = fake.sent(USER)
    assert new_id == str(posted.message_id) != sent_id and posted.visible == "Expired."


async def test_cards_and_their_edits_through_the_manager_and_the_outbox(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy
) -> None:
    outbox = MemoryOutbox()
    async with delivering(make_channel(fake, intake, inbox, outbox=outbox), outbox) as bus:
        await bus.publish(card(outbox_id=1))
        await fake.wait_for(lambda: 1 in outbox.confirmed)
        [message] = fake.sent(USER)
        assert outbox.sent[1] == str(message.message_id)
        await bus.publish(OutboundMessage(CHAT, "Allowed once.", edits=1, outbox_id=2))
        await fake.wait_for(lambda: 2 in outbox.confirmed)
    assert (message.visible, message.keyboard, outbox.sent[2]) == (
        "Allowed once.",
        [],
        outbox.sent[1],
    )
    assert len(fake.sent(USER)) == 1


async def test_a_press_reaches_intake_as_a_message(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    sent_id = await channel.deliver(card())
    query = fake.press_button(
        USER, int(sent_id or 0), user_id=USER, text="Allow once", first_name="Ada"
    )
    [press] = await intake.wait()
    assert press == InboundMessage.from_press(
        CHAT,
        str(USER),
        "/approve a1 once",
        query.id,
        sender_name="Ada",
        is_private=True,
        received_at=press.received_at,
    )
    assert press.message_id == f"press:{query.id}"
    assert press.command == "approve"
    await fake.wait_for(lambda: not fake.pending_updates)
    assert not query.answered  # the agent's side answers an accepted press
    await channel.deliver(OutboundMessage(CHAT, "Allowed once.", kind="answer", reply_to=query.id))
    assert (await fake.wait_for_answer(query)).text == "Allowed once."


async def test_a_press_in_a_forum_topic_comes_from_that_topic(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    fake.user_message(GROUP, f"@{BOT} hi", user_id=7, is_topic=True, thread_id=11)
    await intake.wait()
    topic = ChatRef("telegram", str(GROUP), "11")
    sent_id = await channel.deliver(card(topic))
    fake.press_button(GROUP, int(sent_id or 0), user_id=7, text="Deny")
    _, press = await intake.wait(2)
    assert (press.chat, press.is_private, press.addressed) == (topic, False, True)
    assert press.text == "/deny a1"


async def test_an_answer_is_made_once_and_never_raises(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    sent_id = int(await channel.deliver(card()) or 0)
    first = fake.press_button(USER, sent_id, user_id=USER, text="Deny")
    answer = OutboundMessage(CHAT, "x" * 300, kind="answer", reply_to=first.id)
    await channel.deliver(answer)
    await channel.deliver(answer)  # a second answer is refused by Telegram: only logged
    assert first.answer is not None and first.answer.text == "x" * 200
    assert first.refusals == 1
    late = fake.press_button(USER, sent_id, user_id=USER, text="Deny")
    fake.advance_clock(60)  # past Telegram's window
    await channel.deliver(OutboundMessage(CHAT, "too late", kind="answer", reply_to=late.id))
    failing = fake.press_button(USER, sent_id, user_id=USER, text="Deny")
    fake.fail_next("answerCallbackQuery", ServerError(500))
    await channel.deliver(OutboundMessage(CHAT, "lost", kind="answer", reply_to=failing.id))
    assert (late.answered, late.refusals, failing.answered) == (False, 1, False)
    assert len(fake.calls("answerCallbackQuery")) == 4  # each tried once, never again


@pytest.mark.parametrize(
    ("outcome", "said"),
    [
        (Intake.REFUSED, "Only an approver can decide this."),
        (Intake.PAIRING, "You are not allowed to use this bot yet."),
        (Intake.CLOSED, "Only an approver can decide this."),
    ],
)
async def test_a_press_the_gate_does_not_take_is_answered_at_once(
    fake: FakeTelegram, inbox: InboxPolicy, outcome: Intake, said: str
) -> None:
    intake = Recorder(outcome)
    channel = make_channel(fake, intake, inbox)
    async with running(channel):
        sent_id = int(await channel.deliver(card()) or 0)
        query = fake.press_button(USER, sent_id, user_id=USER + 5, text="Allow once")
        answer = await fake.wait_for_answer(query)
        if outcome is not Intake.CLOSED:
            await fake.wait_for(lambda: not fake.pending_updates)
    assert answer.text == said
    left = [u["update_id"] for u in fake.pending_updates]
    assert left == ([query.update_id] if outcome is Intake.CLOSED else [])  # stopping: kept


async def test_a_press_of_no_button_we_know_is_answered_with_nothing(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    sent_id = int(await channel.deliver(card()) or 0)
    update_id = fake.user_callback(USER, sent_id, "", user_id=USER)  # no data
    [query] = [q for q in fake.callback_queries if q.update_id == update_id]
    answer = await fake.wait_for_answer(query)
    await fake.wait_for(lambda: not fake.pending_updates)
    assert answer.text is None and intake.messages == []


async def test_presses_through_the_gate_only_an_allowed_user_is_journaled(
    fake: FakeTelegram, inbox: InboxPolicy, tmp_path: Path
) -> None:
    stranger = 666
    async with await Database.open(tmp_path / "state.db") as db:
        bus = MessageBus()
        rules = {"telegram": ChannelRules(frozenset({str(USER)}), "open")}
        gate = Gate(rules, Access(db), Journal(db), bus)
        channel = make_channel(fake, gate, inbox, group_policy="open")
        async with running(channel):
            sent_id = int(await channel.deliver(card(ChatRef("telegram", str(GROUP)))) or 0)
            foreign = fake.press_button(GROUP, sent_id, user_id=stranger, text="Allow once")
            assert (await fake.wait_for_answer(foreign)).text == "Only an approver can decide this."
            await fake.wait_for(lambda: not fake.pending_updates)
            assert await Journal(db).pending_inbound() == []
            mine = fake.press_button(GROUP, sent_id, user_id=USER, text="Deny")
            async with asyncio.timeout(5):
                message = await anext(bus.inbound())
            [row] = await Journal(db).pending_inbound()
        assert (message.press, message.text, message.sender_id) == (mine.id, "/deny a1", "42")
        assert row.message["press"] == mine.id and not mine.answered


async def test_a_press_is_acknowledged_only_after_intake_returned_and_comes_again_if_cut_off(
    fake: FakeTelegram, inbox: InboxPolicy
) -> None:
    intake, never = Recorder(), asyncio.Event()

    async def hang(message: InboundMessage) -> Intake:
        await never.wait()  # the gateway is killed while the press is being journaled
        return Intake.ACCEPTED

    intake.decide = hang
    channel = make_channel(fake, intake, inbox)
    async with running(channel):
        sent_id = int(await channel.deliver(card()) or 0)
        query = fake.press_button(USER, sent_id, user_id=USER, text="Allow once")
        [cut_off] = await intake.wait()
        await asyncio.sleep(0.3)
        assert [u["update_id"] for u in fake.pending_updates] == [query.update_id]
    assert [u["update_id"] for u in fake.pending_updates] == [query.update_id]
    again = Recorder()
    async with running(make_channel(fake, again, inbox)):
        [press] = await again.wait()
        await fake.wait_for(lambda: not fake.pending_updates)
    assert (
        (press.press, press.message_id)
        == (cut_off.press, cut_off.message_id)
        == (
            query.id,
            f"press:{query.id}",
        )
    )


async def test_a_press_does_not_wait_behind_its_chats_slow_message(
    fake: FakeTelegram, inbox: InboxPolicy
) -> None:
    intake, release = slow_intake()
    channel = make_channel(fake, intake, inbox)
    async with running(channel):
        sent_id = int(await channel.deliver(card()) or 0)
        fake.user_message(USER, "slow", user_id=USER)
        await intake.wait(1)
        fake.press_button(USER, sent_id, user_id=USER, text="Deny")
        slow, press = await intake.wait(2)
        assert (slow.text, press.press is not None) == ("slow", True)
        release.set()
        await fake.wait_for(lambda: not fake.pending_updates)


@pytest.mark.process
def test_the_raw_send_does_not_warn_outside_tests() -> None:
    # pytest resets warning filters for every test, so the module's filter is checked in a
    # fresh interpreter, where every other warning would be an error.
    code = (
        "import warnings\n"
        "from telegram.warnings import PTBUserWarning\n"
        "import nanobot.channels._telegram_send\n"
        "for method in ('sendMessage', 'editMessageText'):\n"
        "    warnings.warn(f\"Please use 'Bot.{method}' instead of 'Bot.do_api_request(...)'\","
        " PTBUserWarning)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
