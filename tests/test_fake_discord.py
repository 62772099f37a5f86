"""The real discord.py client against ``tests.fakes.discord``: login, gateway, REST, faults."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import sys
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import discord
import httpx
import pytest
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from tests.fakes import audio
from tests.fakes.discord import (
    IS_VOICE_MESSAGE,
    VOICE_MESSAGE_FILENAME,
    AttachmentFile,
    FakeDiscord,
    Hang,
    HttpError,
    InteractionRecord,
    RateLimited,
    ServerError,
)

TOKEN = "fake-bot-token"
REPO_ROOT = Path(__file__).resolve().parent.parent


class Bot(discord.Client):
    """A client that records what it receives."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.received: list[discord.Message] = []
        self.clicks: list[discord.Interaction] = []
        self.ready_count = 0
        self.resumed_count = 0
        self._changed = asyncio.Event()

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        """discord.py sleeps 5 s before every IDENTIFY but the first; not worth it here."""

    async def on_ready(self) -> None:
        self.ready_count += 1
        self._poke()

    async def on_resumed(self) -> None:
        self.resumed_count += 1
        self._poke()

    async def on_message(self, message: discord.Message) -> None:
        self.received.append(message)
        self._poke()

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        self.clicks.append(interaction)
        self._poke()

    async def next_click(self, seconds: float = 5.0) -> discord.Interaction:
        count = len(self.clicks)
        await self.until(lambda: len(self.clicks) > count, seconds)
        return self.clicks[count]

    def _poke(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def from_users(self) -> list[discord.Message]:
        """Received messages not written by the bot itself (Discord echoes its own)."""
        assert self.user is not None
        return [m for m in self.received if m.author.id != self.user.id]

    async def until(self, predicate: Callable[[], bool], seconds: float = 5.0) -> None:
        """Wait for ``predicate``: re-checked on each handled event, else every 20 ms."""
        async with asyncio.timeout(seconds):
            while not predicate():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 0.02)

    async def next_from_user(self, seconds: float = 5.0) -> discord.Message:
        count = len(self.from_users())
        await self.until(lambda: len(self.from_users()) > count, seconds)
        return self.from_users()[count]


@dataclass(frozen=True)
class World:
    guild: int
    channel: int
    thread: int
    ada: int
    dm: int


Connect = Callable[..., Awaitable[Bot]]


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


def point_discord_at(monkeypatch: pytest.MonkeyPatch, server: FakeDiscord) -> None:
    """The two process-wide knobs that send discord.py to the fake."""
    monkeypatch.setattr(Route, "BASE", server.api_base)
    monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(server.gateway_url))


def intents(message_content: bool = True) -> discord.Intents:
    chosen = discord.Intents.default()
    chosen.message_content = message_content
    return chosen


async def start_bot(
    token: str, message_content: bool = True, members: bool = False
) -> tuple[Bot, asyncio.Task[None]]:
    """``client.start(token)`` in a task; returns once on_ready fired (or raises its error)."""
    chosen = intents(message_content)
    chosen.members = members
    bot = Bot(intents=chosen, guild_ready_timeout=0.05)
    task = asyncio.create_task(bot.start(token))
    ready = asyncio.create_task(bot.until(lambda: bot.ready_count > 0, 10))
    await asyncio.wait([ready, task], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        ready.cancel()
        await bot.close()
        await task  # raises the client's error
        raise AssertionError("client.start returned before on_ready")
    await ready
    return bot, task


async def stop_bot(bot: Bot, task: asyncio.Task[None]) -> None:
    await bot.close()
    async with asyncio.timeout(5):
        await task


@pytest.fixture
async def connect(
    fake: FakeDiscord, world: World, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Connect]:
    """Start ``Bot``s on the fake; closes them afterwards."""
    point_discord_at(monkeypatch, fake)
    running: list[tuple[Bot, asyncio.Task[None]]] = []

    async def start(message_content: bool = True, token: str = TOKEN, members: bool = False) -> Bot:
        bot, task = await start_bot(token, message_content, members)
        running.append((bot, task))
        return bot

    yield start
    for bot, task in running:
        await stop_bot(bot, task)


def text_channel(bot: Bot, channel_id: int) -> discord.TextChannel:
    channel = bot.get_channel(channel_id)
    assert isinstance(channel, discord.TextChannel)
    return channel


async def test_login_connect_ready(fake: FakeDiscord, world: World, connect: Connect) -> None:
    bot = await connect()
    assert bot.user is not None and bot.user.id == fake.bot_user.id and bot.user.bot
    guild = bot.get_guild(world.guild)
    assert guild is not None and guild.name == "home"
    assert guild.me.id == fake.bot_user.id
    assert guild.member_count == 2  # bot and ada; without GUILD_MEMBERS only the bot is sent
    assert text_channel(bot, world.channel).name == "general"
    assert isinstance(guild.get_thread(world.thread), discord.Thread)
    assert guild.get_channel(world.channel) is not None
    assert text_channel(bot, world.channel).permissions_for(guild.me).send_messages
    [session] = fake.sessions
    assert session.intents == intents().value
    [conn] = fake.connections
    assert conn.query == {"v": "10", "encoding": "json", "compress": "zlib-stream"}
    assert conn.compression == "zlib-stream"
    assert conn.ops[:2] == [1, 2]  # discord.py heartbeats at once on HELLO, then IDENTIFY
    await fake.wait_until(lambda: fake.heartbeats >= 2, 3, "periodic heartbeat")
    assert bot.latency < 1.0
    assert [r.path for r in fake.requests] == ["/users/@me", "/oauth2/applications/@me"]
    assert fake.requests[0].headers["Authorization"] == f"Bot {TOKEN}"
    assert fake.unhandled == []


async def test_members_intent_chunks_the_guild(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    started = time.monotonic()
    bot = await connect(members=True)
    assert time.monotonic() - started < 2
    guild = bot.get_guild(world.guild)
    assert guild is not None and guild.chunked  # GUILD_CREATE listed every member
    assert guild.get_member(world.ada) is not None
    [found] = await guild.query_members("ad")  # REQUEST_MEMBERS -> GUILD_MEMBERS_CHUNK
    assert found.id == world.ada and 8 in fake.connections[0].ops
    newcomer = fake.add_user("linus")
    fake.user_message(world.channel, "hello all", user_id=newcomer)  # GUILD_MEMBER_ADD first
    await bot.next_from_user()
    assert guild.get_member(newcomer) is not None


async def test_guild_message_reaches_on_message(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    assert bot.user is not None
    message_id = fake.user_message(world.channel, "hello there", mentions_bot=True)
    message = await bot.next_from_user()
    assert message.id == message_id
    assert message.content == f"<@{fake.bot_user.id}> hello there"
    assert isinstance(message.author, discord.Member)
    assert (message.author.id, message.author.name) == (world.ada, "ada")
    assert message.channel.id == world.channel and isinstance(message.channel, discord.TextChannel)
    assert message.guild is not None and message.guild.id == world.guild
    assert bot.user.mentioned_in(message)
    assert message.type is discord.MessageType.default
    role = fake.add_role(world.guild, "ops")
    fake.user_message(world.channel, f"<@&{role}> just chatting", user_id=4242, username="grace")
    other = await bot.next_from_user()
    assert other.content == f"<@&{role}> just chatting" and other.author.name == "grace"
    assert [r.name for r in other.role_mentions] == ["ops"]
    assert not bot.user.mentioned_in(other)


async def test_without_message_content_intent_content_is_empty(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect(message_content=False)
    fake.user_message(world.channel, "secret")
    assert (await bot.next_from_user()).content == ""
    fake.user_message(world.channel, "to you", mentions_bot=True)
    assert (await bot.next_from_user()).content.endswith("to you")
    fake.user_message(world.dm, "dm text", user_id=world.ada)
    assert (await bot.next_from_user()).content == "dm text"


async def test_dm_message_and_reply(fake: FakeDiscord, world: World, connect: Connect) -> None:
    bot = await connect()
    fake.user_message(world.dm, "psst", user_id=world.ada)
    message = await bot.next_from_user()
    assert isinstance(message.channel, discord.DMChannel)
    assert message.guild is None and message.content == "psst"
    assert isinstance(message.author, discord.User) and message.author.id == world.ada
    await message.channel.send("pong")
    await message.author.send("via create_dm")  # POST /users/@me/channels, then send
    sent = await fake.wait_for_sent(2, world.dm)
    assert [m.content for m in sent] == ["pong", "via create_dm"]
    fetched = await bot.fetch_channel(world.dm)
    assert isinstance(fetched, discord.DMChannel) and fetched.recipient is not None
    assert fetched.recipient.id == world.ada


async def test_thread_message(fake: FakeDiscord, world: World, connect: Connect) -> None:
    bot = await connect()
    fake.user_message(world.thread, "in the thread")
    message = await bot.next_from_user()
    assert isinstance(message.channel, discord.Thread)
    assert message.channel.id == world.thread and message.channel.parent_id == world.channel
    await message.channel.send("thread reply")
    [sent] = await fake.wait_for_sent(1, world.thread)
    assert sent.content == "thread reply"
    fetched = await bot.fetch_channel(world.thread)
    assert isinstance(fetched, discord.Thread) and fetched.name == "side quest"
    new_thread = fake.add_thread(world.channel, "created later")
    await bot.until(lambda: bot.get_channel(new_thread) is not None)


async def test_too_long_message_is_400(fake: FakeDiscord, world: World, connect: Connect) -> None:
    bot = await connect()
    channel = text_channel(bot, world.channel)
    with pytest.raises(discord.HTTPException) as caught:
        await channel.send("x" * 2001)
    assert caught.value.status == 400 and caught.value.code == 50035
    assert "content: Must be 2000 or fewer in length." in caught.value.text
    assert fake.sent() == []
    await channel.send("x" * 2000)
    assert len(fake.sent()[0].content) == 2000
    with pytest.raises(discord.HTTPException) as empty:
        await channel.send(embeds=[])
    assert empty.value.code == 50006


async def test_allowed_mentions_and_replies_recorded(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    channel = text_channel(bot, world.channel)
    await channel.send(f"hi <@{world.ada}>", allowed_mentions=discord.AllowedMentions.none())
    await channel.send(f"hi <@{world.ada}>")
    quiet, loud = fake.sent(world.channel)
    assert quiet.allowed_mentions == {"parse": []} and quiet.mentions == []
    assert loud.allowed_mentions is None and loud.mentions == [world.ada]
    fake.user_message(world.channel, "question?")
    question = await bot.next_from_user()
    await question.reply("answer", mention_author=False)
    [*_, reply] = await fake.wait_for_sent(3, world.channel)
    assert reply.reply_to == question.id
    assert reply.message_reference is not None
    assert reply.message_reference["channel_id"] == world.channel
    assert reply.allowed_mentions is not None and not reply.allowed_mentions["replied_user"]
    assert reply.mentions == []
    assert fake.message(reply.id)["type"] == 19


async def test_user_reply_to_bot_mentions_it(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    assert bot.user is not None
    mine = await text_channel(bot, world.channel).send("I said this")
    fake.user_message(world.channel, "and I reply", reply_to=mine.id)
    reply = await bot.next_from_user()
    assert reply.type is discord.MessageType.reply
    assert reply.reference is not None and reply.reference.message_id == mine.id
    assert isinstance(reply.reference.resolved, discord.Message)
    assert reply.reference.resolved.content == "I said this"
    assert bot.user.mentioned_in(reply)


async def test_own_messages_echo_edit_delete(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    assert bot.user is not None
    message = await text_channel(bot, world.channel).send("draft")
    await bot.until(lambda: any(m.id == message.id for m in bot.received))
    edited = await message.edit(content="final")
    assert edited.content == "final" and edited.edited_at is not None
    [sent] = fake.sent()
    assert (sent.content, sent.edits) == ("final", ["final"])
    await message.add_reaction("👍")
    assert [(r.message_id, r.emoji, r.added) for r in fake.reactions] == [(message.id, "👍", True)]
    await message.delete()
    assert sent.deleted
    with pytest.raises(discord.NotFound):
        await message.edit(content="gone")


async def test_typing(fake: FakeDiscord, world: World, connect: Connect) -> None:
    bot = await connect()
    async with text_channel(bot, world.channel).typing():
        pass
    await text_channel(bot, world.channel).typing()
    assert fake.typing == [world.channel, world.channel]


async def test_attachments_both_ways(fake: FakeDiscord, world: World, connect: Connect) -> None:
    bot = await connect()
    fake.user_message(
        world.channel, "see file", attachments=[AttachmentFile("notes.txt", b"hello file")]
    )
    message = await bot.next_from_user()
    [attachment] = message.attachments
    assert attachment.filename == "notes.txt" and attachment.size == 10
    assert attachment.content_type == "text/plain"
    assert attachment.url.startswith(f"{fake.base_url}/attachments/")
    assert await attachment.read() == b"hello file"
    upload = discord.File(io.BytesIO(b"\x89PNG fake"), filename="chart.png")
    sent_message = await message.channel.send("here", file=upload)
    [sent] = fake.sent()
    [stored] = sent.attachments
    assert (stored.filename, stored.data, stored.content_type) == (
        "chart.png",
        b"\x89PNG fake",
        "image/png",
    )
    assert sent.payload["attachments"] == [{"id": 0, "filename": "chart.png"}]
    assert await sent_message.attachments[0].read() == b"\x89PNG fake"


async def test_a_voice_message_is_one_as_discord_py_sees_it(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    note = audio.ogg_opus(2.5)
    message_id = fake.user_voice_message(world.dm, note, user_id=world.ada)
    message = await bot.next_from_user()
    assert message.id == message_id and message.content == ""
    assert message.flags.voice and message.flags.value == IS_VOICE_MESSAGE
    [attachment] = message.attachments
    assert attachment.is_voice_message()
    assert (attachment.filename, attachment.content_type, attachment.size) == (
        VOICE_MESSAGE_FILENAME,
        "audio/ogg",
        len(note),
    )
    assert attachment.duration == 2.5  # read from the OGG/Opus file
    assert attachment.waveform == bytes(25)
    assert await attachment.read() == note
    assert fake.downloads[-1].endswith(f"/{attachment.id}/voice-message.ogg")

    fake.user_voice_message(
        world.channel, b"OggS not parsed", duration_secs=1.5, waveform="AP8A/w=="
    )
    told = await bot.next_from_user()
    [voice] = told.attachments
    assert (voice.duration, voice.waveform) == (1.5, b"\x00\xff\x00\xff")
    assert told.guild is not None and voice.is_voice_message()
    with pytest.raises(ValueError, match="duration_secs is needed"):
        fake.user_voice_message(world.dm, audio.mp3(1.0), user_id=world.ada)


async def test_audio_attachments_are_files_not_voice_messages(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    memo, recording = audio.mp3(1.0), audio.ogg_opus(1.0)
    fake.user_message(
        world.channel,
        "two recordings",
        attachments=[
            AttachmentFile("memo.mp3", memo),
            AttachmentFile("take 2.ogg", recording, "audio/ogg; codecs=opus"),
        ],
    )
    message = await bot.next_from_user()
    first, second = message.attachments
    assert not message.flags.voice
    assert (first.content_type, second.content_type) == ("audio/mpeg", "audio/ogg; codecs=opus")
    assert not first.is_voice_message() and first.duration is None and first.waveform is None
    assert (await first.read(), await second.read()) == (memo, recording)
    assert second.filename == "take 2.ogg"
    fake.expire_attachment(first.id)
    with pytest.raises(discord.NotFound):
        await first.read()


async def test_control_api_injects_a_voice_message(fake: FakeDiscord, world: World) -> None:
    note = audio.ogg_opus(0.6)
    async with httpx.AsyncClient(trust_env=False, base_url=fake.base_url) as control:
        answer = await control.post(
            "/_fake/user_voice_message",
            json={
                "channel_id": world.dm,
                "content_base64": base64.b64encode(note).decode(),
                "user_id": world.ada,
            },
        )
    payload = fake.message(int(answer.json()["id"]))
    assert payload["flags"] == IS_VOICE_MESSAGE
    [attachment] = payload["attachments"]
    assert (attachment["duration_secs"], attachment["filename"]) == (0.6, "voice-message.ogg")
    async with httpx.AsyncClient(trust_env=False) as client:
        assert (await client.get(attachment["url"])).content == note


async def test_429_on_send_is_retried(fake: FakeDiscord, world: World, connect: Connect) -> None:
    bot = await connect()
    fake.fail_next("POST /channels/*/messages", RateLimited(retry_after=0.3))
    started = time.monotonic()
    await text_channel(bot, world.channel).send("after the limit")
    assert time.monotonic() - started >= 0.3
    posts = [r for r in fake.requests if r.method == "POST" and r.path.endswith("/messages")]
    assert [r.fault for r in posts] == ["RateLimited", None]
    assert [m.content for m in fake.sent()] == ["after the limit"]


async def test_5xx_retried_and_4xx_raised(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    channel = text_channel(bot, world.channel)
    fake.fail_next("/channels/*/messages", ServerError(502))
    await channel.send("after a 502")  # discord.py waits 1 s before its retry
    assert [m.content for m in fake.sent()] == ["after a 502"]
    fake.fail_next("POST /channels/*/messages", HttpError(403, 50013, "Missing Permissions"))
    with pytest.raises(discord.Forbidden) as caught:
        await channel.send("nope")
    assert caught.value.code == 50013


async def test_resume_replays_messages_missed_while_disconnected(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    fake.user_message(world.channel, "before")
    await bot.until(lambda: len(bot.from_users()) == 1)
    async with fake.outage():
        missed = fake.user_message(world.channel, "while you were away")
        assert not fake.sessions[0].connected
    await fake.wait_for_resume()
    await bot.until(lambda: len(bot.from_users()) == 2)
    fake.user_message(world.channel, "after")
    await bot.until(lambda: len(bot.from_users()) == 3)
    await asyncio.sleep(0.1)  # a "nothing more comes" check: a replayed duplicate shows here
    contents = [m.content for m in bot.from_users()]
    assert contents == ["before", "while you were away", "after"]  # exactly once, in order
    assert bot.from_users()[1].id == missed
    assert len(fake.sessions) == 1 and fake.sessions[0].resumes == 1
    assert 6 in fake.connections[-1].ops and 2 not in fake.connections[-1].ops
    await bot.until(lambda: bot.resumed_count == 1)
    assert bot.ready_count == 1


@pytest.mark.parametrize("code", [1000, 4000, None])
async def test_server_close_or_drop_is_resumed(
    fake: FakeDiscord, world: World, connect: Connect, code: int | None
) -> None:
    bot = await connect()
    await fake.disconnect_all(code or 4000, abort=code is None)
    fake.user_message(world.channel, "delivered either way")
    await fake.wait_for_resume()
    await bot.until(lambda: len(bot.from_users()) == 1)
    assert (fake.connections[0].closed_by, fake.connections[0].close_code) == ("server", code)
    await asyncio.sleep(0.05)  # a "nothing more comes" check: no duplicate after the resume
    assert len(bot.from_users()) == 1


async def test_reconnect_request_and_invalid_session(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    fake.request_reconnect()
    await fake.wait_for_resume()
    await fake.invalidate_sessions()
    await fake.wait_for_ready(2)  # a new IDENTIFY, a new session
    await bot.until(lambda: bot.ready_count == 2)
    fake.user_message(world.channel, "on the new session")
    assert (await bot.next_from_user()).content == "on the new session"


async def test_clean_close(fake: FakeDiscord, world: World, connect: Connect) -> None:
    bot = await connect()
    await bot.close()
    await fake.wait_until(lambda: fake.connections[0].closed, 3, "socket closed")
    assert bot.is_closed()
    # Client.close() asks for 1000, but its poll loop wins the race and closes with 4000,
    # which leaves the session resumable on Discord (and here).
    assert (fake.connections[0].closed_by, fake.connections[0].close_code) == ("client", 4000)
    [session] = fake.sessions
    assert not session.connected


async def test_plain_text_frames_when_compression_declined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with FakeDiscord(compress=False) as server:
        point_discord_at(monkeypatch, server)
        channel = server.add_channel(server.add_guild("g"), "c")
        bot, task = await start_bot("any-token")
        server.user_message(channel, "uncompressed")
        assert (await bot.next_from_user()).content == "uncompressed"
        assert server.connections[0].compression is None
        await stop_bot(bot, task)


async def test_bad_token_and_disallowed_intents(
    fake: FakeDiscord, world: World, connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(discord.LoginFailure):
        await connect(token="wrong-token")
    async with FakeDiscord(privileged_intents=False) as strict:
        point_discord_at(monkeypatch, strict)
        bot = Bot(intents=intents(), guild_ready_timeout=0.05)
        with pytest.raises(discord.PrivilegedIntentsRequired):
            async with asyncio.timeout(10):
                await bot.start(TOKEN)
        await bot.close()


async def _raw_gateway(
    server: FakeDiscord, query: str = "v=10&encoding=json"
) -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
    session = aiohttp.ClientSession()
    ws = await session.ws_connect(f"{server.gateway_url}?{query}")
    return session, ws


async def test_raw_gateway_protocol(fake: FakeDiscord, world: World) -> None:
    """The wire itself: zlib-stream frames, seq numbers, RESUME replay, bad RESUME."""
    http, ws = await _raw_gateway(fake, "v=10&encoding=json&compress=zlib-stream")
    inflate = zlib.decompressobj()

    async def receive() -> dict[str, Any]:
        data = await ws.receive_bytes(timeout=5)
        assert data.endswith(b"\x00\x00\xff\xff")
        frame: dict[str, Any] = json.loads(inflate.decompress(data))
        return frame

    try:
        hello = await receive()
        assert hello["op"] == 10 and hello["d"]["heartbeat_interval"] == 500
        await ws.send_json({"op": 2, "d": {"token": TOKEN, "intents": 1 | 1 << 1 | 1 << 9}})
        ready, guild = await receive(), await receive()
        assert (ready["t"], ready["s"], guild["t"], guild["s"]) == ("READY", 1, "GUILD_CREATE", 2)
        assert ready["d"]["resume_gateway_url"] == fake.gateway_url
        assert ready["d"]["guilds"] == [{"id": str(world.guild), "unavailable": True}]
        assert {m["user"]["username"] for m in guild["d"]["members"]} == {"nanobot", "ada"}
        await ws.send_json({"op": 1, "d": 2})
        assert (await receive())["op"] == 11
        session_id = ready["d"]["session_id"]
        await ws.close(code=4000)  # not 1000/1001: the session stays resumable
    finally:
        await http.close()
    fake.user_message(world.channel, "buffered")
    resume = {"op": 6, "d": {"token": TOKEN, "session_id": session_id, "seq": 2}}
    http, ws = await _raw_gateway(fake)  # no compress: plain text frames
    try:
        assert (await ws.receive_json(timeout=5))["op"] == 10
        await ws.send_json(resume)
        replayed, resumed = await ws.receive_json(timeout=5), await ws.receive_json(timeout=5)
        assert (replayed["t"], replayed["s"], replayed["d"]["content"]) == (
            "MESSAGE_CREATE",
            3,
            "",  # no MESSAGE_CONTENT intent in this IDENTIFY
        )
        assert (resumed["t"], resumed["s"]) == ("RESUMED", 4)
        await ws.close(code=1000)  # a client's 1000 ends the session
        await fake.wait_until(lambda: not fake.sessions, 3, "session end")
        ws = await http.ws_connect(fake.gateway_url)
        assert (await ws.receive_json(timeout=5))["op"] == 10
        await ws.send_json(resume)
        assert await ws.receive_json(timeout=5) == {"op": 9, "d": False, "s": None, "t": None}
    finally:
        await ws.close()
        await http.close()


async def test_raw_rest_shapes(fake: FakeDiscord, world: World) -> None:
    """Exact ``application/json``, ``Via``, rate-limit headers, 429 body, 401 and 404."""
    headers = {"Authorization": f"Bot {TOKEN}"}
    fake.fail_next("POST /channels/*/messages", RateLimited(retry_after=0.25))
    async with aiohttp.ClientSession(headers=headers) as http:
        url = f"{fake.api_base}/channels/{world.channel}/messages"
        async with http.post(url, json={"content": "x"}) as limited:
            assert limited.status == 429
            assert limited.headers["Content-Type"] == "application/json"
            assert limited.headers["Via"] == "1.1 google"
            assert limited.headers["Retry-After"] == "1"
            assert limited.headers["X-RateLimit-Remaining"] == "0"
            assert limited.headers["X-RateLimit-Reset-After"] == "0.250"
            assert limited.headers["X-RateLimit-Scope"] == "user"
            body = await limited.json()
            assert body == {
                "message": "You are being rate limited.",
                "retry_after": 0.25,
                "global": False,
            }
        async with http.post(url, json={"content": "x"}) as ok:
            assert ok.status == 200 and ok.headers["X-RateLimit-Bucket"]
            message = await ok.json()
            assert message["author"]["id"] == str(fake.bot_user.id)
            assert message["channel_id"] == str(world.channel)
        async with http.get(f"{fake.api_base}/gateway/bot") as gateway:
            assert (await gateway.json())["url"] == fake.gateway_url
        async with http.get(f"{fake.api_base}/guilds/{world.guild}/widget") as unknown:
            assert unknown.status == 404
    assert fake.unhandled == [f"GET /guilds/{world.guild}/widget"]
    async with (
        aiohttp.ClientSession() as anonymous,
        anonymous.get(f"{fake.api_base}/users/@me") as denied,
    ):
        assert denied.status == 401


async def test_stop_is_prompt_with_hanging_request_and_open_socket() -> None:
    server = FakeDiscord()
    await server.start()
    server.fail_next("/users/@me", Hang())
    http = aiohttp.ClientSession(headers={"Authorization": "Bot t"})
    hanging = asyncio.create_task(http.get(f"{server.api_base}/users/@me"))
    ws = await http.ws_connect(server.gateway_url)
    await server.wait_until(lambda: len(server.requests) == 1, 3, "request")
    started = time.monotonic()
    await server.stop()
    assert time.monotonic() - started < 1
    with pytest.raises(aiohttp.ClientError):
        await hanging
    assert (await ws.receive(timeout=3)).type is aiohttp.WSMsgType.TEXT  # HELLO
    closing = await ws.receive(timeout=3)
    assert (closing.type, closing.data) == (aiohttp.WSMsgType.CLOSE, 1001)
    await ws.close()
    await http.close()


async def test_standalone_cli_and_http_control() -> None:
    """``python -m tests.fakes.discord`` prints its URLs and ids; /_fake/* drive it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.discord",
        "--port",
        "0",
        "--channel",
        "general",
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(10):
            info = json.loads(await process.stdout.readline())
        assert info["api_base"].endswith("/api/v10") and info["gateway_url"].endswith("/gateway")
        base = info["api_base"].removesuffix("/api/v10")
        channel = info["channels"]["general"]
        headers = {"Authorization": "Bot t"}
        async with aiohttp.ClientSession(headers=headers) as http:
            body = {"channel_id": channel, "content": "hi", "mentions_bot": True}
            async with http.post(f"{base}/_fake/user_message", json=body) as injected:
                assert injected.status == 200 and (await injected.json())["id"]
            url = f"{info['api_base']}/channels/{channel}/messages"
            async with http.post(url, json={"content": "hello"}) as sent:
                assert sent.status == 200
            async with http.get(f"{base}/_fake/sent") as listing:
                [message] = await listing.json()
            assert (message["channel_id"], message["content"]) == (channel, "hello")
            async with http.get(f"{base}/_fake/state") as state:
                assert (await state.json())["bot_user_id"] == info["bot_user_id"]
    finally:
        process.terminate()
        assert await process.wait() == 0


# ---- approvals in chat: buttons, clicks (INTERACTION_CREATE), answers ---------------------


class Decision(discord.ui.Button["Card"]):
    """One button of a card; with ``answer`` its callback edits the card, buttons removed."""

    def __init__(self, label: str, action: str, request: str, *, answer: bool) -> None:
        style = discord.ButtonStyle.danger if action == "deny" else discord.ButtonStyle.success
        super().__init__(label=label, style=style, custom_id=f"ap:{request}:{action}")
        self.action, self.answer = action, answer

    async def callback(self, interaction: discord.Interaction) -> None:
        if self.answer and self.view is not None:
            self.view.decided.append(self.action)
            await interaction.response.edit_message(content=f"Decided: {self.action}", view=None)


class Card(discord.ui.View):
    """An approval card's buttons. With ``answer`` they answer a click, as a persistent view
    would; without, they leave it to the test."""

    def __init__(self, request: str = "7", *, answer: bool = False) -> None:
        super().__init__(timeout=None)
        self.decided: list[str] = []
        self.add_item(Decision("Allow once", "once", request, answer=answer))
        self.add_item(Decision("Deny", "deny", request, answer=answer))


async def raw_callback(
    fake: FakeDiscord, record: InteractionRecord, body: dict[str, Any]
) -> tuple[int, Any]:
    """POST an interaction callback as any client would (no bot token): (status, JSON body)."""
    url = f"{fake.api_base}/interactions/{record.id}/{record.token}/callback"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as answer:
        return answer.status, await answer.json() if answer.status != 204 else None


async def test_card_buttons_are_kept_and_a_click_reaches_discord_py(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    card = await text_channel(bot, world.channel).send("Run `ls`?", view=Card())
    [sent] = fake.sent(world.channel)
    assert [b["custom_id"] for b in sent.buttons] == ["ap:7:once", "ap:7:deny"]
    assert [b["label"] for b in sent.buttons] == ["Allow once", "Deny"]
    assert card.components and fake.message(card.id)["components"] == sent.components

    click = fake.click(card.id, "ap:7:deny", user_id=world.ada)
    interaction = await bot.next_click()
    assert interaction.id == click.id and interaction.type is discord.InteractionType.component
    assert interaction.data is not None and interaction.data.get("custom_id") == "ap:7:deny"
    assert interaction.data.get("component_type") == 2
    assert isinstance(interaction.user, discord.Member) and interaction.user.id == world.ada
    assert interaction.guild_id == world.guild and interaction.channel_id == world.channel
    assert interaction.message is not None and interaction.message.id == card.id
    assert interaction.application_id == fake.bot_user.id and interaction.token == click.token

    await interaction.response.send_message("Only an approver can decide this.", ephemeral=True)
    assert (click.response_type, click.ephemeral, click.refusals) == (4, True, [])
    _, notice = fake.sent(world.channel)
    assert (notice.content, notice.ephemeral, notice.interaction_id) == (
        "Only an approver can decide this.",
        True,
        click.id,
    )
    assert notice.reply_to == card.id
    history = [m.id async for m in text_channel(bot, world.channel).history()]
    assert notice.id not in history and card.id in history  # only the clicker sees it

    # a second answer, from another process say: Discord refuses it
    again = discord.Interaction(data=cast(Any, click.payload), state=bot._connection)
    with pytest.raises(discord.HTTPException) as refused:
        await again.response.edit_message(content="too late", view=None)
    assert (refused.value.status, refused.value.code) == (400, 40060)
    assert refused.value.text == "Interaction has already been acknowledged."
    assert click.refusals == [(400, 40060)] and sent.content == "Run `ls`?"


async def test_update_message_removes_the_buttons_then_follow_ups(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    card = await text_channel(bot, world.channel).send("Run `ls`?", view=Card())
    click = fake.click(card.id, "ap:7:once", user_id=world.ada)
    interaction = await bot.next_click()
    callback = await interaction.response.edit_message(content="Allowed once by ada", view=None)
    assert callback is not None and callback.message_id == card.id
    [sent] = fake.sent(world.channel)
    assert (sent.content, sent.buttons, sent.edit_payloads[-1]["components"]) == (
        "Allowed once by ada",
        [],
        [],
    )
    assert (click.response_type, click.original_id) == (7, card.id)
    await bot.until(lambda: any(m.id == card.id and not m.components for m in bot.cached_messages))

    follow = await interaction.followup.send("Ran it: exit 0", ephemeral=True, wait=True)
    assert click.followups == [follow.id] and fake.sent(world.channel)[-1].ephemeral
    original = await interaction.original_response()
    assert original.id == card.id and original.content == "Allowed once by ada"
    await interaction.edit_original_response(content="Allowed once by ada at 12:00")
    assert sent.edits[-1] == "Allowed once by ada at 12:00"
    with pytest.raises(discord.NotFound):  # the clicked message is no follow-up of this token
        await interaction.followup.edit_message(world.channel, content="x")


async def test_deferred_update_then_edit_original(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    dm = await bot.create_dm(discord.Object(world.ada))
    card = await dm.send("Run `ls`?", view=Card())
    with pytest.raises(ValueError):  # only the DM's other party sees its buttons
        fake.click(card.id, "ap:7:once", user_id=fake.add_user("mallory"))
    with pytest.raises(LookupError):
        fake.click(card.id, "ap:7:always", user_id=world.ada)
    click = fake.click(card.id, "ap:7:once", user_id=world.ada)
    interaction = await bot.next_click()
    assert interaction.guild_id is None and isinstance(interaction.user, discord.User)
    assert isinstance(interaction.channel, discord.DMChannel) and interaction.user.id == world.ada
    await interaction.response.defer()  # a component's defer: type 6, DEFERRED_UPDATE_MESSAGE
    assert (click.response_type, click.original_id) == (6, card.id)
    await interaction.edit_original_response(content="Denied by ada", view=None)
    [sent] = fake.sent(world.dm)
    assert (sent.content, sent.buttons) == ("Denied by ada", [])
    with pytest.raises(LookupError):  # no buttons left to click
        fake.click(card.id, "ap:7:once", user_id=world.ada)


async def test_late_answers_and_expired_tokens_are_refused(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    bot = await connect()
    card = await text_channel(bot, world.channel).send("Run `ls`?", view=Card())
    late = fake.click(card.id, "ap:7:once", user_id=world.ada)
    interaction = await bot.next_click()
    with pytest.raises(discord.NotFound) as unknown:  # a follow-up before any answer
        await interaction.followup.send("early")
    assert unknown.value.code == 10015
    fake.advance_clock(3.01)  # the 3 s are up
    with pytest.raises(discord.NotFound) as expired:
        await interaction.response.send_message("late", ephemeral=True)
    assert (expired.value.code, expired.value.text) == (10062, "Unknown interaction")
    assert (late.acknowledged, late.refusals) == (False, [(404, 10062)])

    in_time = fake.click(card.id, "ap:7:deny", user_id=world.ada)
    answered = await bot.next_click()
    fake.advance_clock(2.9)
    await answered.response.defer(ephemeral=True, thinking=True)  # type 5: "thinking..."
    assert in_time.response_type == 5 and in_time.ephemeral
    loading = fake.message(in_time.original_id or 0)
    assert loading["flags"] == 64 | 128 and loading["content"] == ""
    await answered.edit_original_response(content="Denied.")
    assert fake.message(in_time.original_id or 0)["flags"] == 64
    fake.advance_clock(15 * 60)  # the token's 15 minutes are up
    with pytest.raises(discord.HTTPException) as stale:
        await answered.edit_original_response(content="much later")
    assert (stale.value.status, stale.value.code) == (401, 50027)


async def test_persistent_view_answers_a_click_after_a_restart(
    fake: FakeDiscord, world: World, connect: Connect
) -> None:
    first = await connect()
    card = await text_channel(first, world.channel).send("Run `ls`?", view=Card())
    second = await connect()  # a new process: only a view registered by custom_id can answer
    view = Card(answer=True)
    second.add_view(view)  # no message id: matches the custom_ids on any message
    click = fake.click(card.id, "ap:7:once", user_id=world.ada)
    await fake.wait_for_response(click, 5)
    assert view.decided == ["once"] and click.response_type == 7
    [sent] = fake.sent(world.channel)
    assert (sent.content, sent.buttons) == ("Decided: once", [])
    # every session gets the click; the first process has no view for it and stays silent
    assert [i.id for i in first.clicks] == [click.id]


@pytest.mark.parametrize(
    ("components", "path", "code"),
    [
        (
            [
                {
                    "type": 1,
                    "components": [{"type": 2, "style": 1, "label": "x", "custom_id": "x" * 101}],
                }
            ],
            "components.0.components.0.custom_id",
            "BASE_TYPE_BAD_LENGTH",
        ),
        (
            [{"type": 1, "components": [{"type": 2, "style": 1, "label": "x"}]}],
            "components.0.components.0.custom_id",
            "BUTTON_COMPONENT_CUSTOM_ID_REQUIRED",
        ),
        (
            [
                {
                    "type": 1,
                    "components": [
                        {"type": 2, "style": 1, "custom_id": "a"},
                        {"type": 2, "style": 2, "custom_id": "a"},
                    ],
                }
            ],
            "components.0.components.1.custom_id",
            "COMPONENT_CUSTOM_ID_DUPLICATED",
        ),
        (
            [{"type": 1, "components": [{"type": 2, "style": 9, "custom_id": "a"}]}],
            "components.0.components.0.style",
            "BASE_TYPE_CHOICES",
        ),
        (
            [
                {
                    "type": 1,
                    "components": [{"type": 2, "style": 1, "custom_id": "a", "label": "x" * 81}],
                }
            ],
            "components.0.components.0.label",
            "BASE_TYPE_BAD_LENGTH",
        ),
        ([{"type": 1, "components": []}], "components.0.components", "BASE_TYPE_BAD_LENGTH"),
        (
            [
                {"type": 1, "components": [{"type": 2, "style": 1, "custom_id": str(i)}]}
                for i in range(6)
            ],
            "components",
            "BASE_TYPE_BAD_LENGTH",
        ),
        ([{"type": 2, "style": 1, "custom_id": "a"}], "components.0.type", "UNION_TYPE_CHOICES"),
    ],
)
async def test_components_are_validated_like_discord(
    fake: FakeDiscord, world: World, components: list[Any], path: str, code: str
) -> None:
    headers = {"Authorization": f"Bot {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        url = f"{fake.api_base}/channels/{world.channel}/messages"
        async with http.post(url, json={"content": "x", "components": components}) as refused:
            assert refused.status == 400
            body = await refused.json()
        async with http.post(url, json={"content": "ok"}) as ok:
            message = await ok.json()
        edit = f"{url}/{message['id']}"
        async with http.patch(edit, json={"components": components}) as edited:
            assert edited.status == 400 and await edited.json() == body
    assert (body["code"], body["message"]) == (50035, "Invalid Form Body")
    node = body["errors"]
    for key in path.split("."):
        node = node[key]
    assert node["_errors"][0]["code"] == code
    [only] = fake.sent(world.channel)
    assert (only.content, only.components, only.edits) == ("ok", [], [])


async def test_raw_callbacks_and_the_control_api(fake: FakeDiscord, world: World) -> None:
    headers = {"Authorization": f"Bot {TOKEN}"}
    row = {"type": 1, "components": [{"type": 2, "style": 4, "label": "Deny", "custom_id": "d"}]}
    async with aiohttp.ClientSession(headers=headers) as http:
        url = f"{fake.api_base}/channels/{world.dm}/messages"
        async with http.post(url, json={"components": [row]}) as created:  # buttons alone will do
            card = await created.json()
    async with aiohttp.ClientSession(base_url=fake.base_url) as control:
        body = {"message_id": card["id"], "custom_id": "d", "user_id": str(world.ada)}
        async with control.post("/_fake/click", json=body) as clicked:
            ids = await clicked.json()
    record = fake.interaction(int(ids["id"]))
    assert record.token == ids["token"] and record.payload["user"]["id"] == str(world.ada)
    assert await raw_callback(fake, record, {"type": 2}) == (
        400,
        {
            "message": "Invalid Form Body",
            "code": 50035,
            "errors": {
                "type": {
                    "_errors": [
                        {
                            "code": "BASE_TYPE_CHOICES",
                            "message": "Value must be one of {4, 5, 6, 7, 9}.",
                        }
                    ]
                }
            },
        },
    )
    forged = InteractionRecord(**{**record.__dict__, "token": "forged"})
    assert await raw_callback(fake, forged, {"type": 6}) == (
        404,
        {"message": "Unknown interaction", "code": 10062},
    )
    assert await raw_callback(fake, record, {"type": 6}) == (204, None)  # no with_response
    assert await raw_callback(fake, record, {"type": 6}) == (
        400,
        {"message": "Interaction has already been acknowledged.", "code": 40060},
    )
    async with aiohttp.ClientSession(base_url=fake.base_url) as control:
        await control.post("/_fake/advance_clock", json={"seconds": 1})
        async with control.get("/_fake/interactions") as listed:
            [shown] = await listed.json()
    assert (shown["id"], shown["response_type"], shown["refusals"]) == (
        ids["id"],
        6,
        [[400, 40060]],
    )
