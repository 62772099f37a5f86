"""The Discord channel: the real discord.py against the fake Discord (REST and gateway)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, cast

import discord
import discord.http
import pytest
from discord.gateway import DiscordWebSocket
from discord.http import Route
from loguru import logger
from pydantic import SecretStr

from nanobot.bus.events import (
    Button,
    ChatRef,
    InboundMessage,
    OutboundMessage,
    StreamUpdate,
    Typing,
)
from nanobot.bus.queue import MessageBus
from nanobot.channels import _discord_catch_up
from nanobot.channels._discord_inbound import is_addressed, text_for_agent
from nanobot.channels.base import (
    DeliveryError,
    InboxPolicy,
    Intake,
    IntakePort,
    OutboxPort,
    Undeliverable,
)
from nanobot.channels.discord import DiscordChannel
from nanobot.channels.manager import ChannelManager
from nanobot.channels.render import split_discord
from nanobot.config import DiscordConfig
from nanobot.errors import ConfigError
from nanobot.gate import ChannelRules, Gate
from nanobot.store import Access, Database, Journal
from tests.fakes import audio
from tests.fakes._discord_payloads import (
    channel_payload,
    form_error,
    interaction_payload,
    user_payload,
)
from tests.fakes.discord import (
    AttachmentFile,
    FakeDiscord,
    HttpError,
    RateLimited,
    RestRequest,
    ServerError,
)
from tests.fakes.outbox import MemoryOutbox

TOKEN = "fake-bot-token"
DISCORD_API = Route.BASE
DISCORD_GATEWAY = DiscordWebSocket.DEFAULT_GATEWAY


class Recorder:
    """An intake that records what it is given and answers `result`. It admits, as the gate
    would with `group_policy: mention`, everyone but `strangers`."""

    def __init__(self, result: Intake = Intake.ACCEPTED) -> None:
        self.result = result
        self.messages: list[InboundMessage] = []
        self.strangers: set[str] = set()
        self.seen: dict[str, str] = {}  # what `last_seen` answers
        self.until: datetime | None = None  # what `caught_up_until` answers
        self.recorded: list[datetime] = []  # what `caught_up` was told
        self._changed = asyncio.Event()

    async def last_seen(self, channel: str) -> dict[str, str]:
        assert channel == "discord"
        return self.seen

    async def caught_up_until(self, channel: str) -> datetime | None:
        assert channel == "discord"
        return self.until

    async def caught_up(self, channel: str, moment: datetime) -> None:
        assert channel == "discord"
        self.recorded.append(moment)
        self._changed.set()

    async def admits(self, channel: str, sender_id: str, *, private: bool, addressed: bool) -> bool:
        return (private or addressed) and sender_id not in self.strangers

    async def __call__(self, message: InboundMessage) -> Intake:
        self.messages.append(message)
        self._changed.set()
        return self.result

    async def wait(self, count: int = 1, seconds: float = 5.0) -> list[InboundMessage]:
        await self.wait_until(lambda: len(self.messages) >= count, seconds)
        return self.messages

    async def wait_until(self, done: Callable[[], bool], seconds: float = 5.0) -> None:
        """Wait until `done()` holds, checked after each message or record."""
        async with asyncio.timeout(seconds):
            while not done():
                self._changed.clear()
                await self._changed.wait()

    def texts(self) -> dict[str, list[str]]:
        """The texts taken, per chat id."""
        texts: dict[str, list[str]] = {}
        for message in self.messages:
            texts.setdefault(message.chat.chat_id, []).append(message.text)
        return texts


@dataclass(frozen=True)
class World:
    guild: int
    channel: int
    thread: int
    ada: int
    dm: int

    def chat(self, channel_id: int) -> ChatRef:
        return ChatRef("discord", str(channel_id))


@pytest.fixture(autouse=True)
def _endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever happens, discord.py's process-wide endpoints are put back after the test."""
    monkeypatch.setattr(Route, "BASE", Route.BASE)
    monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", DiscordWebSocket.DEFAULT_GATEWAY)


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(token=TOKEN, heartbeat_interval_ms=500) as server:
        yield server


@pytest.fixture
def world(fake: FakeDiscord) -> World:
    guild = fake.add_guild("home")
    channel = fake.add_channel(guild, "general")
    thread = fake.add_thread(channel, "side quest")
    ada = fake.add_user("ada")
    return World(guild, channel, thread, ada, fake.dm_channel(ada))


@pytest.fixture
def inbox(tmp_path: Path) -> InboxPolicy:
    return InboxPolicy(tmp_path / "inbox", max_bytes=1000)


@pytest.fixture
def intake() -> Recorder:
    return Recorder()


def make_channel(
    fake: FakeDiscord,
    intake: IntakePort,
    inbox: InboxPolicy,
    *,
    token: str = TOKEN,
    group_policy: Literal["mention", "open", "disabled"] = "mention",
    outbox: OutboxPort | None = None,
    allow_from: list[str] | None = None,
) -> DiscordChannel:
    config = DiscordConfig(
        enabled=True,
        token=SecretStr(token),
        api_base=fake.api_base,
        gateway_url=fake.gateway_url,
        group_policy=group_policy,
        allow_from=allow_from or [],
    )
    return DiscordChannel(
        config,
        intake,
        inbox,
        stream_interval=0.2,
        typing_interval=0.1,
        guild_ready_timeout=0.05,
        outbox=outbox,
    )


@asynccontextmanager
async def running(channel: DiscordChannel) -> AsyncIterator[asyncio.Task[None]]:
    connected = asyncio.Event()
    task = asyncio.create_task(channel.run(connected.set), name="discord-under-test")
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
async def channel(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> AsyncIterator[DiscordChannel]:
    channel = make_channel(fake, intake, inbox)
    async with running(channel):
        yield channel


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the attachments discord.py was asked to download."""
    names: list[str] = []
    read = discord.Attachment.read

    async def spy(self: discord.Attachment, **options: Any) -> bytes:
        names.append(self.filename)
        return await read(self, **options)

    monkeypatch.setattr(discord.Attachment, "read", spy)
    return names


def posts(fake: FakeDiscord) -> list[str | None]:
    """The fault (or None) of every message POST the fake answered."""
    return [r.fault for r in fake.requests if r.method == "POST" and r.path.endswith("/messages")]


# ---- inbound ----------------------------------------------------------------------------


async def test_dm_is_private_and_addressed(
    channel: DiscordChannel, fake: FakeDiscord, world: World, intake: Recorder
) -> None:
    message_id = fake.user_message(world.dm, "hello there", user_id=world.ada)
    [message] = await intake.wait()
    assert message.chat == world.chat(world.dm) and message.chat.thread_id is None
    assert (message.sender_id, message.sender_name, message.text) == (
        str(world.ada),
        "ada",
        "hello there",
    )
    assert message.is_private and message.addressed and message.attachments == ()
    assert message.message_id == str(message_id) and message.received_at.tzinfo is not None


async def test_guild_messages_addressed_by_mention_or_reply(
    channel: DiscordChannel,
    fake: FakeDiscord,
    world: World,
    intake: Recorder,
    downloads: list[str],
) -> None:
    bot = fake.bot_user.id
    await channel.deliver(OutboundMessage(world.chat(world.channel), "Which one?"))
    [question] = fake.sent(world.channel)
    files = [AttachmentFile("notes.txt", b"not for us")]
    fake.user_message(world.channel, "just chatting", attachments=files)
    fake.user_message(world.channel, "what time is it?", mentions_bot=True)
    fake.user_message(world.channel, f"hey <@!{bot}>, look  here")
    fake.user_message(world.channel, "the second", reply_to=question.id, reply_ping=False)
    fake.user_message(world.channel, f"<@{world.ada}> and <@{bot}> /status")
    messages = await intake.wait(5)
    await asyncio.sleep(0.1)
    assert [(m.text, m.addressed) for m in messages] == [
        ("just chatting", False),
        ("what time is it?", True),
        ("hey, look  here", True),
        ("the second", True),
        ("@ada and /status", True),
    ]
    assert {m.chat for m in messages} == {world.chat(world.channel)}
    assert not any(m.is_private for m in messages)
    assert messages[0].attachments == () and downloads == []  # nobody would read it


async def test_thread_is_its_own_session(
    channel: DiscordChannel, fake: FakeDiscord, world: World, intake: Recorder
) -> None:
    fake.user_message(world.thread, "in the thread", mentions_bot=True)
    fake.user_message(world.channel, "in the channel", mentions_bot=True)
    in_thread, in_channel = await intake.wait(2)
    assert in_thread.chat == world.chat(world.thread)
    assert in_thread.chat.session_key != in_channel.chat.session_key
    await channel.deliver(
        OutboundMessage(in_thread.chat, "thread answer", reply_to=in_thread.message_id)
    )
    [sent] = fake.sent(world.thread)
    assert (sent.content, sent.reply_to) == ("thread answer", int(in_thread.message_id))
    assert fake.sent(world.channel) == []


async def test_own_and_other_bots_messages_are_ignored(
    channel: DiscordChannel, fake: FakeDiscord, world: World, intake: Recorder
) -> None:
    await channel.deliver(OutboundMessage(world.chat(world.channel), f"<@{fake.bot_user.id}>"))
    other = fake.add_user("helper-bot", bot=True)
    fake.user_message(world.channel, "beep", user_id=other, mentions_bot=True)
    fake.user_message(world.channel, "from a person", mentions_bot=True)
    [message] = await intake.wait()
    await asyncio.sleep(0.1)
    assert message.text == "from a person" and len(intake.messages) == 1


@pytest.mark.usefixtures("channel")
async def test_attachments_saved_and_oversize_refused(
    fake: FakeDiscord,
    world: World,
    intake: Recorder,
    inbox: InboxPolicy,
    downloads: list[str],
) -> None:
    files = [
        AttachmentFile("résumé notes.txt", b"hello file"),
        AttachmentFile("photo.png", b"\x89PNG small"),
        AttachmentFile("huge.bin", b"x" * 5000),
    ]
    message_id = fake.user_message(world.dm, "see files", user_id=world.ada, attachments=files)
    [message] = await intake.wait()
    notes, photo = message.attachments
    assert (notes.kind, notes.path.name, notes.mime_type, notes.size) == (
        "document",
        "resume_notes.txt",
        "text/plain",
        10,
    )
    assert notes.path.parent == inbox.directory and notes.path.read_bytes() == b"hello file"
    assert (photo.kind, photo.path.read_bytes()) == ("photo", b"\x89PNG small")
    assert downloads == ["résumé notes.txt", "photo.png"]  # never the big one
    assert message.text.startswith("see files\n\n(I can't take huge.bin")
    [notice] = await fake.wait_for_sent(1, world.dm)
    assert notice.reply_to == message_id
    assert notice.content == "I can't take huge.bin (4.88 KB): files may be at most 1000 bytes."


async def test_an_inbox_in_the_way_is_moved_aside_or_the_file_said_not_kept(
    fake: FakeDiscord, world: World, intake: Recorder, tmp_path: Path
) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "inbox").write_text("not a folder")  # as `exec` could leave it
    (tmp_path / "people").symlink_to(tmp_path / "elsewhere")
    kept = InboxPolicy(tmp_path / "inbox", max_bytes=1000, workspace=tmp_path)
    async with running(make_channel(fake, intake, kept)) as task:
        files = [AttachmentFile("a.txt", b"data")]
        fake.user_message(world.dm, "one", user_id=world.ada, attachments=files)
        [message] = await intake.wait()
        assert [a.path.read_bytes() for a in message.attachments] == [b"data"]
        assert (tmp_path / "inbox.not-a-folder").read_text() == "not a folder"
        assert not task.done()
    lost = InboxPolicy(tmp_path / "people" / "ada" / "inbox", max_bytes=1000, workspace=tmp_path)
    async with running(make_channel(fake, intake, lost)) as task:
        fake.user_message(world.dm, "two", user_id=world.ada, attachments=files)
        [_, message] = await intake.wait(2)
        [notice] = await fake.wait_for_sent(1, world.dm)
        assert not task.done()
    said = "I could not keep a.txt: the inbox folder has a symbolic link on its way ('people')"
    assert message.attachments == () and message.text.startswith(f"two\n\n({said}")
    assert notice.content.startswith(said)
    assert list((tmp_path / "elsewhere").iterdir()) == []


async def test_a_strangers_files_are_never_downloaded_yet_they_get_a_pairing_code(
    fake: FakeDiscord, world: World, inbox: InboxPolicy, tmp_path: Path
) -> None:
    stranger = fake.add_user("mallory")
    secret = [AttachmentFile("payload.exe", b"MZ...")]
    async with await Database.open(tmp_path / "state.db") as db:
        bus = MessageBus()
        rules = {"discord": ChannelRules(frozenset({str(world.ada)}), "open")}
        gate = Gate(rules, Access(db), Journal(db), bus)
        async with running(make_channel(fake, gate, inbox, group_policy="open")):
            fake.user_message(fake.dm_channel(stranger), "", user_id=stranger, attachments=secret)
            fake.user_message(world.channel, "look", user_id=stranger, attachments=secret)
            async with asyncio.timeout(5):
                notice = await anext(bus.outbound("discord"))
            [request] = await Access(db).pending()
            assert request.user_id == str(stranger)
            assert isinstance(notice, OutboundMessage) and request.code in notice.text
            mine = [AttachmentFile("notes.txt", b"for you")]
            fake.user_message(world.dm, "here", user_id=world.ada, attachments=mine)
            async with asyncio.timeout(5):
                message = await anext(bus.inbound())
        assert [a.path.read_bytes() for a in message.attachments] == [b"for you"]
        assert [path.rsplit("/", 1)[-1] for path in fake.downloads] == ["notes.txt"]
        assert [p.name for p in inbox.directory.iterdir()] == ["notes.txt"]


async def test_a_file_sent_before_approval_is_asked_for_again(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    # Approved between the check and the hand-over: the message is taken, without the file.
    intake.strangers.add(str(world.ada))
    async with running(make_channel(fake, intake, inbox)):
        files = [AttachmentFile("a.txt", b"data")]
        fake.user_message(world.dm, "", user_id=world.ada, attachments=files)
        [message] = await intake.wait()
        [notice] = await fake.wait_for_sent(1, world.dm)
    assert message.attachments == () and "a.txt" in message.text
    assert "send it again" in notice.content
    assert fake.downloads == [] and not inbox.directory.exists()


async def test_closed_intake_drops_the_message_and_its_files(
    channel: DiscordChannel,
    fake: FakeDiscord,
    world: World,
    intake: Recorder,
    inbox: InboxPolicy,
) -> None:
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING", format="{message}")
    try:
        intake.result = Intake.CLOSED
        files = [AttachmentFile("a.txt", b"data")]
        fake.user_message(world.dm, "too late", user_id=world.ada, attachments=files)
        [message] = await intake.wait()
        await asyncio.sleep(0.1)
    finally:
        logger.remove(sink)
    assert not message.attachments[0].path.exists()
    assert any("arrived while stopping" in line for line in warnings)


class SlowRecorder(Recorder):
    """A Recorder whose intake takes a while (a journal write on a busy disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()

    async def __call__(self, message: InboundMessage) -> Intake:
        self.started.set()
        await asyncio.sleep(0.3)
        return await super().__call__(message)


async def test_stopping_lets_a_message_being_taken_finish(
    fake: FakeDiscord, world: World, inbox: InboxPolicy
) -> None:
    # Discord does not deliver it again: stopping must not cut its intake short.
    intake = SlowRecorder()
    async with running(make_channel(fake, intake, inbox)):
        fake.user_message(world.dm, "just in time", user_id=world.ada)
        await asyncio.wait_for(intake.started.wait(), 5)
    assert [m.text for m in intake.messages] == ["just in time"]


def stub(**fields: Any) -> discord.Message:
    base: dict[str, Any] = {
        "guild": SimpleNamespace(self_role=None),
        "mentions": [],
        "role_mentions": [],
        "reference": None,
        "mention_everyone": False,
        "content": "",
    }
    return cast(discord.Message, SimpleNamespace(**(base | fields)))


def test_everyone_is_not_a_mention_but_the_bots_role_is() -> None:
    me = SimpleNamespace(id=1)
    role = SimpleNamespace(id=7, mention="<@&7>")
    guild = SimpleNamespace(self_role=role)
    everyone = stub(mention_everyone=True, content="@everyone @here hi")
    assert not is_addressed(everyone, cast(discord.abc.Snowflake, me))
    by_role = stub(guild=guild, role_mentions=[role], content="<@&7> what's up")
    assert is_addressed(by_role, cast(discord.abc.Snowflake, me))
    assert text_for_agent(by_role, cast(discord.abc.Snowflake, me)) == "what's up"


# ---- outbound ---------------------------------------------------------------------------


def fences_balance(part: str) -> bool:
    return sum(1 for line in part.split("\n") if line.lstrip().startswith("```")) % 2 == 0


async def test_long_reply_is_split_with_balanced_fences(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    code = "\n".join(f"    value_{i} = compute({i})  # step {i}" for i in range(60))
    text = (
        "Intro paragraph. " * 90 + "\n\n```python\n" + code + "\n```\n\n" + "Closing words. " * 80
    )
    assert 4800 < len(text) < 5400
    asked = fake.user_message(world.channel, "long one?", mentions_bot=True)
    await channel.deliver(
        OutboundMessage(world.chat(world.channel), text, reply_to=str(asked), outbox_id=3)
    )
    sent = fake.sent(world.channel)
    assert [m.content for m in sent] == split_discord(text) and len(sent) >= 3
    assert all(len(m.content) <= 2000 and fences_balance(m.content) for m in sent)
    assert any(m.content.startswith("```python\n") for m in sent[1:])  # reopened
    joined = "\n".join(m.content for m in sent)
    assert [joined.index(f"value_{i} =") for i in range(60)] == sorted(
        joined.index(f"value_{i} =") for i in range(60)
    )
    assert sent[0].reply_to == asked and sent[0].message_reference is not None
    assert sent[0].message_reference["fail_if_not_exists"] is False
    assert all(m.reply_to is None for m in sent[1:])


async def test_nobody_is_pinged_but_the_replied_user(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    role = fake.add_role(world.guild, "ops")
    grace = fake.add_user("grace")
    loud = f"@everyone @here <@&{role}> <@{grace}> look!"
    asked = fake.user_message(world.channel, "ping test", mentions_bot=True)
    chat = world.chat(world.channel)
    await channel.deliver(OutboundMessage(chat, loud))
    await channel.deliver(OutboundMessage(chat, loud, reply_to=str(asked)))
    plain, reply = fake.sent(world.channel)
    assert plain.allowed_mentions == {"parse": []}
    assert (plain.mentions, plain.mention_everyone) == ([], False)
    assert fake.message(plain.id)["mention_roles"] == []
    assert reply.allowed_mentions == {"parse": [], "replied_user": True}
    assert (reply.mentions, reply.mention_everyone) == ([world.ada], False)  # the asker only
    assert grace not in plain.mentions + reply.mentions
    assert fake.message(reply.id)["mention_roles"] == []


async def test_reply_to_a_deleted_message_is_posted_plainly(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    await channel.deliver(OutboundMessage(world.chat(world.channel), "answer", reply_to="12345"))
    [sent] = fake.sent(world.channel)
    assert sent.content == "answer" and sent.reply_to == 12345  # asked for, but
    assert fake.message(sent.id).get("message_reference") is None  # posted plainly


def voice_file(inbox: InboxPolicy) -> Path:
    path = inbox.directory.parent / "outbox" / "voice" / "c3d4.ogg"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(audio.ogg_opus(2))
    return path


async def test_a_spoken_reply_is_an_audio_attachment_with_its_text(
    channel: DiscordChannel, fake: FakeDiscord, world: World, inbox: InboxPolicy
) -> None:
    asked = fake.user_message(world.dm, "say it", user_id=world.ada)
    path, chat = voice_file(inbox), world.chat(world.dm)
    await channel.deliver(
        OutboundMessage(chat, "It is **sunny**.", reply_to=str(asked), speak=True, voice=path)
    )
    [sent] = fake.sent(world.dm)
    assert sent.content == "It is **sunny**." and sent.reply_to == asked
    [attached] = sent.attachments
    assert (attached.filename, attached.data) == ("reply.ogg", path.read_bytes())
    assert attached.content_type in ("audio/ogg", "application/ogg")

    # A text of more than one message: the audio first, alone, then the text.
    long = "\n\n".join(f"Paragraph {n}. " + "word " * 60 for n in range(10))
    await channel.deliver(OutboundMessage(chat, long, speak=True, voice=path))
    voice, *parts = fake.sent(world.dm)[1:]
    assert voice.content == "" and [a.filename for a in voice.attachments] == ["reply.ogg"]
    assert len(parts) >= 2 and all(not p.attachments for p in parts)
    assert "".join(p.content for p in parts).split() == long.split()


async def test_an_audio_attachment_refused_loses_none_of_the_text(
    channel: DiscordChannel, fake: FakeDiscord, world: World, inbox: InboxPolicy
) -> None:
    fake.max_upload_bytes = 100  # the server takes no file this large: 413
    chat = world.chat(world.dm)
    await channel.deliver(OutboundMessage(chat, "Hi.", speak=True, voice=voice_file(inbox)))
    [sent] = fake.sent(world.dm)
    assert (sent.content, sent.attachments) == ("Hi.", [])


async def test_rate_limit_is_waited_out(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    fake.fail_next("POST /channels/*/messages", RateLimited(retry_after=0.2))
    await channel.deliver(OutboundMessage(world.chat(world.channel), "after the limit"))
    assert posts(fake) == ["RateLimited", None]
    assert [m.content for m in fake.sent()] == ["after the limit"]


class _QuickSleep:
    """`discord.http`'s view of asyncio with its 5xx back-off (1, 3, 5, 7, 9 s) cut short."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def sleep(delay: float) -> None:
        await asyncio.sleep(min(delay, 0.01))


async def test_persistent_server_error_and_refusals_raise(
    channel: DiscordChannel, fake: FakeDiscord, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(discord.http, "asyncio", _QuickSleep())
    chat = world.chat(world.channel)
    fake.fail_next("POST /channels/*/messages", ServerError(500), times=5)
    with pytest.raises(DeliveryError, match="after retries"):
        await channel.deliver(OutboundMessage(chat, "never"))
    assert posts(fake) == ["ServerError"] * 5
    fake.fail_next("POST /channels/*/messages", HttpError(403, 50013, "Missing Permissions"))
    with pytest.raises(DeliveryError, match="refused"):
        await channel.deliver(OutboundMessage(chat, "forbidden"))
    with pytest.raises(DeliveryError, match="refused"):
        await channel.deliver(OutboundMessage(ChatRef("discord", "4242"), "nowhere"))
    assert len(posts(fake)) == 7 and fake.sent() == []  # neither refusal was retried


async def test_retry_resumes_after_the_parts_already_sent(
    channel: DiscordChannel, fake: FakeDiscord, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "\n\n".join(f"Paragraph {i}. " + "words " * 300 for i in range(3))
    item = OutboundMessage(world.chat(world.channel), text, outbox_id=9)
    parts = split_discord(text)
    assert len(parts) == 3
    send = discord.PartialMessageable.send
    calls = 0

    async def limited_second(self: discord.PartialMessageable, *args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:  # discord.py tries five times, then gives up
            fake.fail_next("POST /channels/*/messages", RateLimited(retry_after=0.01), times=5)
        return await send(self, *args, **kw)

    monkeypatch.setattr(discord.PartialMessageable, "send", limited_second)
    with pytest.raises(DeliveryError, match="after retries"):
        await channel.deliver(item)
    assert [m.content for m in fake.sent()] == parts[:1]
    await channel.deliver(item)  # the manager's retry
    assert [m.content for m in fake.sent()] == parts
    assert posts(fake) == [None, *["RateLimited"] * 5, None, None]


REFUSALS = [  # as Discord words them; True: the chat is closed to the bot
    (HttpError(403, 50007, "Cannot send messages to this user"), True),
    (HttpError(403, 50001, "Missing Access"), True),
    (HttpError(404, 10003, "Unknown Channel"), True),
    (HttpError(403, 50013, "Missing Permissions"), False),
    (HttpError(400, 50006, "Cannot send an empty message"), False),
    (HttpError(400, 50083, "Operation cannot be performed on an archived thread"), False),
]


@pytest.mark.parametrize(("refusal", "closed"), REFUSALS)
async def test_a_refusal_is_given_up_at_once(
    channel: DiscordChannel, fake: FakeDiscord, world: World, refusal: HttpError, closed: bool
) -> None:
    fake.fail_next("POST /channels/*/messages", refusal)
    with pytest.raises(Undeliverable) as raised:
        await channel.deliver(OutboundMessage(world.chat(world.channel), "hello"))
    assert raised.value.chat_closed is closed
    assert len(posts(fake)) == 1  # neither retried nor tried in another form


async def test_content_discord_finds_too_long_goes_out_in_shorter_parts(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    errors = form_error("content", "BASE_TYPE_MAX_LENGTH", "Must be 2000 or fewer in length.")
    fake.fail_next(
        "POST /channels/*/messages", HttpError(400, 50035, "Invalid Form Body", errors["errors"])
    )
    text = "words " * 300
    await channel.deliver(OutboundMessage(world.chat(world.channel), text))
    parts = [m.content for m in fake.sent(world.channel)]
    assert len(parts) >= 2 and " ".join(parts).split() == text.split()


async def test_a_reply_that_may_not_quote_its_message_is_posted_plainly(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    asked = str(fake.user_message(world.channel, "hello?", mentions_bot=True))
    no_history = HttpError(400, 160002, "Cannot reply without permission to read message history")
    fake.fail_next("POST /channels/*/messages", no_history)
    await channel.deliver(OutboundMessage(world.chat(world.channel), "hi", reply_to=asked))
    [sent] = fake.sent(world.channel)
    assert sent.content == "hi" and sent.reply_to is None
    assert posts(fake) == ["HttpError", None]


@asynccontextmanager
async def delivering(channel: DiscordChannel, outbox: MemoryOutbox) -> AsyncIterator[MessageBus]:
    """`channel` run and delivered to by a ChannelManager, as in the gateway."""
    bus = MessageBus()
    manager = asyncio.create_task(ChannelManager([channel], bus, outbox).run())
    try:
        yield bus
    finally:
        manager.cancel()
        await asyncio.wait([manager], timeout=10)


async def test_chats_failing_for_a_while_hold_up_no_other(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    # Discord answers 500 in 40 channels: discord.py backs off in each (1, 3, 5, 7, 9 s)
    # while another channel's reply goes out.
    failing = [fake.add_channel(world.guild, f"busy-{n}") for n in range(40)]
    for channel_id in failing:
        fake.fail_next(f"/channels/{channel_id}/*", ServerError(500), times=None)
    outbox = MemoryOutbox()
    async with delivering(make_channel(fake, intake, inbox, outbox=outbox), outbox) as bus:
        for n, channel_id in enumerate(failing, 1):
            await bus.publish(OutboundMessage(world.chat(channel_id), "busy", outbox_id=n))
        await fake.wait_until(lambda: len(posts(fake)) >= 40, 10, "a try in every channel")
        await bus.publish(OutboundMessage(world.chat(world.channel), "not held up", outbox_id=99))
        [sent] = await fake.wait_for_sent(1, world.channel)
        assert sent.content == "not held up"
        assert all(not fake.sent(channel_id) for channel_id in failing)


async def test_typing_while_active(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    chat = world.chat(world.dm)
    await channel.deliver(Typing(chat, active=True))
    await channel.deliver(Typing(chat, active=True))  # a second turn in the same chat
    await fake.wait_until(lambda: fake.typing.count(world.dm) >= 3, 3, "typing")
    await channel.deliver(Typing(chat, active=False))
    await asyncio.sleep(0.15)
    assert fake.typing.count(world.dm) >= 4  # still typing for the other turn
    await channel.deliver(Typing(chat, active=False))
    stopped = len(fake.typing)
    await asyncio.sleep(0.3)
    assert len(fake.typing) == stopped


async def test_streaming_edits_then_exact_final(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    chat = world.chat(world.channel)
    asked = str(fake.user_message(world.channel, "tell me", mentions_bot=True))
    stream = "s-1"
    await channel.deliver(StreamUpdate(chat, stream, "Once", reply_to=asked))
    await channel.deliver(StreamUpdate(chat, stream, "Once upon", reply_to=asked))  # too soon
    [shown] = fake.sent(world.channel)
    assert (shown.content, shown.edits, shown.reply_to) == ("Once", [], int(asked))
    await asyncio.sleep(0.25)
    await channel.deliver(StreamUpdate(chat, stream, "Once upon a time", reply_to=asked))
    assert shown.edits == ["Once upon a time"]
    final = "Once upon a time there was a **fence**.\n\n" + "more words " * 250
    parts = split_discord(final)
    assert len(parts) == 2
    await channel.deliver(OutboundMessage(chat, final, reply_to=asked, stream_id=stream))
    first, rest = fake.sent(world.channel)
    assert first.id == shown.id and first.content == parts[0] and first.edits[-1] == parts[0]
    assert rest.content == parts[1] and rest.reply_to is None
    # neither the updates nor the final edit touch the message's components
    assert [("components" in body) for body in first.edit_payloads] == [False, False]
    await channel.deliver(StreamUpdate(chat, stream, "late", reply_to=asked))
    assert len(fake.sent()) == 2 and first.content == parts[0]


async def test_a_stream_open_before_a_restart_is_taken_over_and_finished_in_place(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    chat = world.chat(world.channel)
    asked = str(fake.user_message(world.channel, "tell me", mentions_bot=True))
    outbox = MemoryOutbox()
    first = make_channel(fake, intake, inbox, outbox=outbox)
    async with running(first):
        await first.deliver(StreamUpdate(chat, "s-9", "Once", reply_to=asked))
    [shown] = fake.sent(world.channel)
    assert outbox.streams == {"s-9": shown.id}  # the process dies here, before the final one

    again = make_channel(fake, intake, inbox, outbox=outbox)
    async with running(again):
        await again.deliver(StreamUpdate(chat, "s-9", "Once upon", reply_to=asked))
        await again.deliver(OutboundMessage(chat, "Once upon a time.", stream_id="s-9"))
    [final] = fake.sent(world.channel)
    assert (final.id, final.content, final.edits) == (
        shown.id,
        "Once upon a time.",
        ["Once upon", "Once upon a time."],
    )
    assert outbox.streams == {}


async def test_stream_updates_never_raise(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    fake.fail_next("POST /channels/*/messages", HttpError(403, 50013, "Missing Permissions"))
    await channel.deliver(StreamUpdate(world.chat(world.channel), "s-2", "hello"))
    await channel.deliver(StreamUpdate(ChatRef("discord", "4242"), "s-3", "hello"))
    await channel.deliver(OutboundMessage(world.chat(world.channel), "hello", stream_id="s-2"))
    assert [m.content for m in fake.sent()] == ["hello"]


# ---- connection -------------------------------------------------------------------------


async def test_message_during_outage_arrives_once_after_resume(
    channel: DiscordChannel, fake: FakeDiscord, world: World, intake: Recorder
) -> None:
    fake.user_message(world.dm, "before", user_id=world.ada)
    await intake.wait(1)
    async with fake.outage():
        fake.user_message(world.dm, "while you were away", user_id=world.ada)
        await asyncio.sleep(0.1)
        assert len(intake.messages) == 1
    await fake.wait_for_resume()
    fake.user_message(world.dm, "after", user_id=world.ada)
    await intake.wait(3)
    await asyncio.sleep(0.2)
    assert [m.text for m in intake.messages] == ["before", "while you were away", "after"]
    assert len(fake.sessions) == 1 and fake.ready_count == 1  # resumed, not re-identified
    await channel.deliver(OutboundMessage(world.chat(world.dm), "still here"))
    assert [m.content for m in fake.sent(world.dm)] == ["still here"]


async def test_cancel_disconnects_cleanly_and_restores_endpoints(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    channel = make_channel(fake, intake, inbox)
    async with running(channel) as task:
        assert fake.api_base == Route.BASE
        await channel.deliver(Typing(world.chat(world.dm), active=True))
        await fake.wait_until(lambda: bool(fake.typing), 3, "typing")
    assert task.cancelled()
    await fake.wait_until(lambda: all(c.closed for c in fake.connections), 3, "socket closed")
    assert (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY) == (DISCORD_API, DISCORD_GATEWAY)
    typed = len(fake.typing)
    await asyncio.sleep(0.3)
    assert len(fake.typing) == typed  # the typing task went with it
    with pytest.raises(DeliveryError, match="not connected"):
        await channel.deliver(OutboundMessage(world.chat(world.dm), "too late"))


async def start(channel: DiscordChannel) -> None:
    async with asyncio.timeout(10):
        await channel.run(lambda: None)


async def test_rejected_token_and_missing_intent_are_config_errors(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    with pytest.raises(ConfigError, match="token was rejected"):
        await start(make_channel(fake, intake, inbox, token="wrong-token"))
    with pytest.raises(ConfigError, match="empty"):
        await start(make_channel(fake, intake, inbox, token=""))
    async with FakeDiscord(privileged_intents=False) as strict:
        with pytest.raises(ConfigError, match="Message Content"):
            await start(make_channel(strict, intake, inbox))
    assert (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY) == (DISCORD_API, DISCORD_GATEWAY)


# ---- approvals: cards, edits, presses and their answers -----------------------------------

ALLOW = Button("Allow once", "/approve 7 once")
DENY = Button("Deny", "/deny 7")


def card(chat: ChatRef, text: str = "Run `ls -la`?", **fields: Any) -> OutboundMessage:
    return OutboundMessage(chat, text, kind="card", buttons=(ALLOW, DENY), **fields)


def requests(fake: FakeDiscord, method: str, suffix: str) -> list[RestRequest]:
    return [r for r in fake.requests if r.method == method and r.path.endswith(suffix)]


class Holding(Recorder):
    """A Recorder whose intake waits until `release` is set (a journal write stuck on disk)."""

    def __init__(self, result: Intake = Intake.ACCEPTED) -> None:
        super().__init__(result)
        self.release = asyncio.Event()

    async def __call__(self, message: InboundMessage) -> Intake:
        await self.release.wait()
        return await super().__call__(message)


async def test_a_card_goes_out_with_its_buttons_and_its_id(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    sent_id = await channel.deliver(card(world.chat(world.channel), outbox_id=5))
    [sent] = fake.sent(world.channel)
    assert sent_id == str(sent.id) and sent.content == "Run `ls -la`?"
    assert [row["type"] for row in sent.components] == [1]  # one action row
    assert [(b["label"], b["custom_id"], b["style"]) for b in sent.buttons] == [
        ("Allow once", "/approve 7 once", 2),  # secondary
        ("Deny", "/deny 7", 4),  # danger
    ]
    assert sent.allowed_mentions == {"parse": []}

    # A card too long for one message: its buttons go under the last part, whose id it is.
    long = "Run this?\n\n```sh\n" + "echo step\n" * 300 + "```"
    sent_id = await channel.deliver(card(world.chat(world.thread), long, outbox_id=6))
    parts = fake.sent(world.thread)
    assert [m.content for m in parts] == split_discord(long) and len(parts) == 2
    assert (parts[0].buttons, len(parts[1].buttons)) == ([], 2)
    assert sent_id == str(parts[1].id)


async def test_a_card_that_failed_part_way_resumes_with_the_part_that_failed(
    fake: FakeDiscord,
    world: World,
    intake: Recorder,
    inbox: InboxPolicy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(discord.http, "asyncio", _QuickSleep())
    outbox = MemoryOutbox()
    channel = make_channel(fake, intake, inbox, outbox=outbox)
    long = "Run this?\n\n```sh\n" + "echo step\n" * 300 + "```"
    item = card(world.chat(world.channel), long, outbox_id=4)
    send = discord.PartialMessageable.send
    calls = 0

    async def failing_second(self: discord.PartialMessageable, *args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:  # discord.py tries five times, then gives up
            fake.fail_next("POST /channels/*/messages", ServerError(500), times=5)
        return await send(self, *args, **kw)

    monkeypatch.setattr(discord.PartialMessageable, "send", failing_second)
    async with running(channel):
        with pytest.raises(DeliveryError, match="after retries"):
            await channel.deliver(item)
        assert outbox.progressed == [(4, 1)] and len(fake.sent(world.channel)) == 1
        sent_id = await channel.deliver(item)  # the manager's retry
    first, last = fake.sent(world.channel)
    assert [first.content, last.content] == split_discord(long)
    assert (first.buttons, len(last.buttons), sent_id) == ([], 2, str(last.id))


async def test_an_edit_replaces_the_text_and_takes_the_buttons_away(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    # Through the manager, as in the gateway: the card's id is kept in the outbox, and the
    # record that edits it is given that id.
    outbox = MemoryOutbox()
    chat = world.chat(world.channel)
    async with delivering(make_channel(fake, intake, inbox, outbox=outbox), outbox) as bus:
        await bus.publish(card(chat, outbox_id=1))
        [shown] = await fake.wait_for_sent(1, world.channel)
        await fake.wait_until(lambda: 1 in outbox.confirmed, 5, "the card confirmed")
        assert outbox.sent[1] == str(shown.id)
        await bus.publish(OutboundMessage(chat, "Allowed once by ada.", edits=1, outbox_id=2))
        await fake.wait_until(lambda: 2 in outbox.confirmed, 5, "the edit confirmed")
    assert fake.sent(world.channel) == [shown]  # nothing posted: edited in place
    assert (shown.content, shown.buttons, shown.edit_payloads[-1]["components"]) == (
        "Allowed once by ada.",
        [],
        [],
    )
    assert outbox.sent[2] == str(shown.id)


async def test_a_card_shown_again_with_other_buttons_keeps_its_message(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    chat = world.chat(world.channel)
    first = await channel.deliver(card(chat))
    again = OutboundMessage(chat, "Still waiting", kind="card", buttons=(DENY,), replaces=first)
    assert await channel.deliver(again) == first
    [shown] = fake.sent(world.channel)
    assert shown.content == "Still waiting" and [b["label"] for b in shown.buttons] == ["Deny"]


async def test_a_vanished_message_is_posted_anew(
    channel: DiscordChannel, fake: FakeDiscord, world: World
) -> None:
    chat = world.chat(world.channel)
    gone = fake.user_message(world.channel, "not ours to edit")  # 50005
    for replaces in ("123456789", str(gone)):  # unknown: 10008
        edit = OutboundMessage(chat, f"Denied ({replaces})", edits=1, replaces=replaces)
        sent_id = await channel.deliver(edit)
        assert sent_id == str(fake.sent(world.channel)[-1].id)
        assert fake.sent(world.channel)[-1].content == f"Denied ({replaces})"
    patches = requests(fake, "PATCH", "/messages/123456789")
    assert [r.fault for r in patches] == [None] and len(fake.sent(world.channel)) == 2


async def test_a_press_is_acknowledged_at_once_and_reaches_intake(
    fake: FakeDiscord, world: World, inbox: InboxPolicy
) -> None:
    intake = Holding()  # the journal is slow: the press is acknowledged all the same
    channel = make_channel(fake, intake, inbox)
    async with running(channel):
        chat = world.chat(world.channel)
        shown = int(await channel.deliver(card(chat)) or 0)
        click = fake.click(shown, ALLOW.data, user_id=world.ada)
        await fake.wait_for_response(click, 5)
        assert click.response_type == 6  # DEFERRED_UPDATE_MESSAGE: nothing changes on screen
        assert click.responded_at is not None
        assert click.responded_at - click.created_at < fake.interaction_timeout
        assert not intake.messages and click.refusals == []
        intake.release.set()
        [press] = await intake.wait()
    assert press.press == str(click.id) and press.message_id == f"press:{click.id}"
    assert (press.chat, press.text, press.sender_id) == (chat, ALLOW.data, str(world.ada))
    assert (press.is_private, press.addressed, press.sender_name) == (False, True, "ada")
    [still] = fake.sent(world.channel)
    assert still.content == "Run `ls -la`?" and len(still.buttons) == 2 and not still.edits
    assert not click.followups  # accepted: the agent answers it


async def test_presses_in_a_thread_and_a_dm_come_from_those_chats(
    channel: DiscordChannel, fake: FakeDiscord, world: World, intake: Recorder
) -> None:
    in_thread = int(await channel.deliver(card(world.chat(world.thread))) or 0)
    in_dm = int(await channel.deliver(card(world.chat(world.dm))) or 0)
    fake.click(in_thread, DENY.data, user_id=world.ada)
    fake.click(in_dm, ALLOW.data, user_id=world.ada)
    thread, dm = await intake.wait(2)
    assert (thread.chat, thread.is_private, thread.text) == (
        world.chat(world.thread),
        False,
        DENY.data,
    )
    assert (dm.chat, dm.is_private, dm.text) == (world.chat(world.dm), True, ALLOW.data)


async def test_the_answer_is_an_ephemeral_follow_up_shown_once(
    channel: DiscordChannel, fake: FakeDiscord, world: World, intake: Recorder
) -> None:
    chat = world.chat(world.channel)
    shown = int(await channel.deliver(card(chat)) or 0)
    click = fake.click(shown, ALLOW.data, user_id=world.ada)
    [press] = await intake.wait()
    answer = OutboundMessage(chat, "Allowed once.", kind="answer", reply_to=press.press)
    assert await channel.deliver(answer) is None
    card_message, follow_up = fake.sent(world.channel)
    assert (follow_up.content, follow_up.ephemeral, follow_up.interaction_id) == (
        "Allowed once.",
        True,
        click.id,
    )
    assert click.followups == [follow_up.id] and click.refusals == []
    assert follow_up.allowed_mentions == {"parse": []}
    assert card_message.content == "Run `ls -la`?" and not card_message.edits


async def test_an_answer_to_an_unknown_or_expired_press_never_raises(
    channel: DiscordChannel, fake: FakeDiscord, world: World, intake: Recorder
) -> None:
    chat = world.chat(world.channel)
    await channel.deliver(OutboundMessage(chat, "hm", kind="answer", reply_to="424242"))
    shown = int(await channel.deliver(card(chat)) or 0)
    click = fake.click(shown, DENY.data, user_id=world.ada)
    [press] = await intake.wait()
    fake.advance_clock(15 * 60 + 1)  # its token is gone
    await channel.deliver(OutboundMessage(chat, "Denied.", kind="answer", reply_to=press.press))
    assert click.followups == [] and len(fake.sent(world.channel)) == 1
    assert requests(fake, "POST", click.token)  # tried, refused (50027), let go


async def test_a_press_the_gate_refuses_is_told_so_and_goes_no_further(
    fake: FakeDiscord, world: World, inbox: InboxPolicy, tmp_path: Path
) -> None:
    mallory = fake.add_user("mallory")
    async with await Database.open(tmp_path / "state.db") as db:
        bus = MessageBus()
        rules = {"discord": ChannelRules(frozenset({str(world.ada)}), "mention")}
        channel = make_channel(fake, Gate(rules, Access(db), Journal(db), bus), inbox)
        async with running(channel):
            shown = int(await channel.deliver(card(world.chat(world.channel))) or 0)
            click = fake.click(shown, ALLOW.data, user_id=mallory)
            await fake.wait_until(lambda: bool(click.followups), 5, "the refusal")
            # a stranger's press in their own DM: the gate offers pairing
            private = await channel.deliver(card(ChatRef.direct("discord", str(mallory))))
            paired = fake.click(int(private or 0), DENY.data, user_id=mallory)
            await fake.wait_until(lambda: bool(paired.followups), 5, "the pairing answer")
            async with asyncio.timeout(5):
                notice = await anext(bus.outbound("discord"))
        assert await Journal(db).pending_inbound() == []
    refusal = fake.sent(world.channel)[-1]
    assert (refusal.content, refusal.ephemeral, click.response_type) == (
        "Only an approver can decide this.",
        True,
        6,
    )
    told = fake.sent(fake.dm_channel(mallory))[-1]
    assert (told.content, told.ephemeral) == ("You are not allowed to use this bot yet.", True)
    assert isinstance(notice, OutboundMessage) and notice.kind == "notice"  # the pairing code


async def test_a_dm_card_to_a_user_opens_the_dm_once(
    channel: DiscordChannel, fake: FakeDiscord, world: World, intake: Recorder
) -> None:
    grace = fake.add_user("grace")
    direct = ChatRef.direct("discord", str(grace))
    first = await channel.deliver(card(direct))
    second = await channel.deliver(card(direct, "And `pwd`?"))
    edited = await channel.deliver(OutboundMessage(direct, "Denied.", edits=1, replaces=first))
    await channel.deliver(OutboundMessage(direct, "Done."))
    dm = fake.dm_channel(grace)
    assert [m.content for m in fake.sent(dm)] == ["Denied.", "And `pwd`?", "Done."]
    assert edited == first and second == str(fake.sent(dm)[1].id)
    assert len(requests(fake, "POST", "/users/@me/channels")) == 1
    fake.click(int(second or 0), ALLOW.data, user_id=grace)
    [press] = await intake.wait()
    assert (press.chat, press.is_private) == (world.chat(dm), True)  # the DM's own id
    with pytest.raises(Undeliverable):
        await channel.deliver(card(ChatRef.direct("discord", "not-a-user")))


async def test_other_interactions_are_left_alone(
    channel: DiscordChannel, fake: FakeDiscord, world: World, intake: Recorder
) -> None:
    users = {world.ada: fake.user(world.ada)}
    slash = interaction_payload(
        interaction_id=777,
        token="slash-token",
        application_id=fake.bot_user.id,
        custom_id="",
        component_type=0,
        channel=channel_payload(fake.channel(world.dm), users),
        message={},
        guild_id=None,
        member=None,
        user=user_payload(users[world.ada]),
        app_permissions=0,
        attachment_size_limit=fake.max_upload_bytes,
    )
    del slash["message"]
    slash |= {"type": 2, "data": {"id": "1", "name": "ping", "type": 1}}  # a slash command
    for session in fake.sessions:
        session.push("INTERACTION_CREATE", slash)
    shown = int(await channel.deliver(card(world.chat(world.dm))) or 0)
    fake.click(shown, DENY.data, user_id=world.ada)
    [press] = await intake.wait()  # the slash command came first and was passed over
    assert press.text == DENY.data
    assert not requests(fake, "POST", "/interactions/777/slash-token/callback")


async def test_on_start_what_each_chat_received_since_the_last_message_taken_is_taken(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    # Discord delivers nothing again: what came while nanobot was away is fetched.
    taken = fake.user_message(world.dm, "answered before the stop", user_id=world.ada)
    fake.user_message(world.dm, "while away, one", user_id=world.ada)
    fake.user_message(world.thread, "thread, old", user_id=world.ada, mentions_bot=True)
    last_in_thread = fake.user_message(world.thread, "thread, taken", user_id=world.ada)
    fake.user_message(world.dm, "while away, two", user_id=world.ada)
    fake.user_message(world.thread, "while away, here", user_id=world.ada, mentions_bot=True)
    fake.user_message(world.channel, "a chat never taken from", user_id=world.ada)
    intake.seen = {
        str(world.dm): str(taken),
        str(world.thread): str(last_in_thread),
        "999999": "1",  # a chat that is gone: logged, nothing else
    }
    async with running(make_channel(fake, intake, inbox)):
        messages = await intake.wait(3)
        await asyncio.sleep(0.3)  # nothing more comes
    texts: dict[str, list[str]] = {}
    for m in messages:
        texts.setdefault(m.chat.chat_id, []).append(m.text)
    assert texts == {
        str(world.dm): ["while away, one", "while away, two"],
        str(world.thread): ["while away, here"],
    }
    assert all(m.message_id.isdigit() and int(m.message_id) > taken for m in messages)


@pytest.fixture
def no_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Discord's clock is this one: the catch-up reaches back exactly to the moment."""
    monkeypatch.setattr(_discord_catch_up, "CLOCK_MARGIN", timedelta(0))


async def a_moment_later() -> datetime:
    """Now, on a later millisecond than every message id so far, and before the next."""
    await asyncio.sleep(0.005)
    now = datetime.now(UTC)
    await asyncio.sleep(0.005)
    return now


@pytest.mark.usefixtures("no_margin")
async def test_chats_without_messages_taken_lately_are_read_from_when_all_was_had(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    # An allowed user's first DM ever, a server channel quiet for a month: nothing was taken
    # there lately, so nanobot finds them (it opens the DM) and reads what came since the
    # moment it last had everything.
    quiet = fake.add_channel(world.guild, "quiet")
    bob = fake.add_user("bob")
    fake.user_message(quiet, "long ago", user_id=world.ada, mentions_bot=True)
    intake.until = await a_moment_later()
    fake.user_message(world.dm, "my first DM ever", user_id=world.ada)
    fake.user_message(quiet, "while away, to you", user_id=world.ada, mentions_bot=True)
    fake.user_message(quiet, "while away, among us", user_id=world.ada)
    fake.user_message(fake.dm_channel(bob), "bob is not allowed", user_id=bob)
    started = datetime.now(UTC)
    channel = make_channel(fake, intake, inbox, allow_from=[str(world.ada), "*"])
    async with running(channel):
        await intake.wait_until(lambda: bool(intake.recorded))
        [caught_up] = intake.recorded
    assert intake.texts() == {
        str(world.dm): ["my first DM ever"],
        str(quiet): ["while away, to you", "while away, among us"],  # the gate decides
    }
    addressed = {m.text: m.addressed for m in intake.messages}
    assert addressed == {
        "my first DM ever": True,
        "while away, to you": True,
        "while away, among us": False,
    }
    # Recorded: the session's start once all was taken, then the stop.
    assert started <= caught_up <= intake.recorded[1]


async def test_at_the_first_start_only_chats_with_messages_taken_are_read(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    fake.user_message(world.dm, "before nanobot ever ran", user_id=world.ada)
    async with running(make_channel(fake, intake, inbox, allow_from=[str(world.ada)])):
        await intake.wait_until(lambda: bool(intake.recorded))
    assert intake.messages == []
    assert len(intake.recorded) == 2  # from now on, what came after is fetched
    assert not requests(fake, "GET", f"/channels/{world.dm}/messages")


@pytest.mark.usefixtures("no_margin")
async def test_with_groups_disabled_only_the_allowed_users_dms_are_read(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    intake.until = await a_moment_later()
    fake.user_message(world.channel, "while away, to you", user_id=world.ada, mentions_bot=True)
    fake.user_message(world.dm, "while away, in private", user_id=world.ada)
    channel = make_channel(
        fake, intake, inbox, group_policy="disabled", allow_from=[str(world.ada)]
    )
    async with running(channel):
        await intake.wait_until(lambda: bool(intake.recorded))
    assert intake.texts() == {str(world.dm): ["while away, in private"]}
    assert not requests(fake, "GET", f"/channels/{world.channel}/messages")


@pytest.fixture
def two_chats(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most two chats without messages taken lately are read."""
    monkeypatch.setattr(_discord_catch_up, "MAX_CHATS", 2)


@pytest.mark.usefixtures("no_margin", "two_chats")
async def test_only_the_chats_with_the_newest_messages_are_read(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy, warnings: list[str]
) -> None:
    intake.until = await a_moment_later()
    for chat in (world.channel, world.thread):
        fake.user_message(chat, "older", user_id=world.ada, mentions_bot=True)
    newest = fake.add_channel(world.guild, "busy")
    fake.user_message(newest, "newest", user_id=world.ada, mentions_bot=True)
    async with running(make_channel(fake, intake, inbox)):
        await intake.wait_until(lambda: bool(intake.recorded))
    assert intake.texts() == {str(world.thread): ["older"], str(newest): ["newest"]}
    assert any("3 server channels may have messages" in w and "only the 2" in w for w in warnings)


@pytest.mark.usefixtures("no_margin")
async def test_a_dm_that_could_not_be_opened_is_looked_at_again_next_time(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy, warnings: list[str]
) -> None:
    intake.until = moment = await a_moment_later()
    fake.user_message(world.channel, "while away", user_id=world.ada, mentions_bot=True)
    fake.fail_next("POST /users/@me/channels", HttpError(403, 50007, "Cannot send messages"))
    async with running(make_channel(fake, intake, inbox, allow_from=[str(world.ada)])):
        await intake.wait(1)
        await asyncio.sleep(0.3)  # nothing is recorded while the catch-up is incomplete
        assert intake.recorded == []
    assert intake.texts() == {str(world.channel): ["while away"]}
    assert intake.recorded == [moment]  # the next start reaches back as far again
    assert any(f"could not open the DM with allowed user {world.ada}" in w for w in warnings)


async def test_after_a_new_gateway_session_what_came_in_between_is_read(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    intake.until = datetime.now(UTC)
    async with running(make_channel(fake, intake, inbox, allow_from=[str(world.ada)])):
        await intake.wait_until(lambda: bool(intake.recorded))
        assert intake.messages == []
        async with fake.outage(forget=True):  # too long to resume: Discord replays nothing
            fake.user_message(world.dm, "while the session was lost", user_id=world.ada)
            fake.user_message(world.channel, "and here", user_id=world.ada, mentions_bot=True)
        await intake.wait_until(lambda: len(intake.recorded) == 2, seconds=10)
        assert fake.ready_count == 2
    assert intake.texts() == {
        str(world.dm): ["while the session was lost"],
        str(world.channel): ["and here"],
    }


@pytest.mark.usefixtures("no_margin")
async def test_a_chat_with_messages_taken_is_read_from_its_last_one_or_the_moment_if_later(
    fake: FakeDiscord, world: World, intake: Recorder, inbox: InboxPolicy
) -> None:
    # What came before the moment was had: taken, or seen and refused (chatter, here).
    taken = fake.user_message(world.channel, "taken", user_id=world.ada, mentions_bot=True)
    fake.user_message(world.channel, "chatter, seen and refused", user_id=world.ada)
    intake.seen = {str(world.channel): str(taken)}
    intake.until = await a_moment_later()
    fake.user_message(world.channel, "while away", user_id=world.ada, mentions_bot=True)
    async with running(make_channel(fake, intake, inbox)):
        await intake.wait_until(lambda: bool(intake.recorded))
    assert intake.texts() == {str(world.channel): ["while away"]}
