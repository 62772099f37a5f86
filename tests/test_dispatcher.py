"""The dispatcher with real parts: bus, gate, journal, loop, litellm against the fake server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nanobot.agent.dispatcher import Dispatcher
from nanobot.agent.taint import Ledger
from nanobot.bus.events import (
    Attachment,
    ChatRef,
    InboundMessage,
    Outbound,
    OutboundMessage,
    StreamUpdate,
    Typing,
)
from nanobot.bus.queue import MessageBus
from nanobot.gate import ChannelRules, Gate
from nanobot.media.reading import Reader
from nanobot.media.speech import VoiceReplies
from nanobot.media.voice import Transcriber, TranscriptionSettings
from nanobot.store import Access, Database, Journal
from nanobot.store.chats import ChatSettings
from nanobot.store.taint import TaintStore
from nanobot.workspace import Workspace
from tests.fakes import audio
from tests.fakes.llm import Call, Echo, FakeLLM, Hang, Text, ToolCalls
from tests.test_loop import Parts, make_parts


class Harness:
    """The dispatcher on a gate open to everyone in `channels`, collecting what goes out to
    them (`out`), each delivery confirmed at once."""

    def __init__(
        self,
        parts: Parts,
        db: Database,
        channels: tuple[str, ...] = ("telegram",),
        *,
        whole_replies: tuple[str, ...] = (),
        reader: Reader | None = None,
        voices: VoiceReplies | None = None,
    ) -> None:
        self.parts = parts
        self.bus = MessageBus()
        self.journal = Journal(db)
        rules = {channel: ChannelRules(frozenset({"*"})) for channel in channels}
        self.gate = Gate(rules, Access(db), self.journal, self.bus)
        self.dispatcher = Dispatcher(
            parts.loop,
            self.bus,
            self.journal,
            whole_replies=whole_replies,
            reader=reader,
            voices=voices,
        )
        self.out: list[Outbound] = []
        self._channels = channels
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, *, recover: bool = False) -> None:
        if recover:
            await self.dispatcher.recover(self._channels)
        self._tasks.append(asyncio.create_task(self.dispatcher.run()))
        for channel in self._channels:
            self._tasks.append(asyncio.create_task(self._collect(channel)))

    async def _collect(self, channel: str) -> None:
        async for item in self.bus.outbound(channel):
            self.out.append(item)
            self._arrived.set()
            if isinstance(item, OutboundMessage) and item.outbox_id is not None:
                await self.journal.confirm(item.outbox_id)

    async def send(self, chat: str, text: str, mid: str) -> None:
        message = InboundMessage.from_chat(ChatRef("telegram", chat), chat, text, mid)
        await self.gate(message)

    def replies(self, chat: str | None = None) -> list[OutboundMessage]:
        return [
            o
            for o in self.out
            if isinstance(o, OutboundMessage) and (chat is None or o.chat.chat_id == chat)
        ]

    async def wait_replies(self, count: int, seconds: float = 20) -> None:
        async with asyncio.timeout(seconds):
            while len(self.replies()) < count:
                self._arrived.clear()
                await self._arrived.wait()

    async def stop(self) -> None:
        self.bus.close_inbound()
        await asyncio.wait_for(self._tasks[0], 10)
        self.bus.close_outbound()
        for collector in self._tasks[1:]:
            await asyncio.wait_for(collector, 10)


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


@pytest.fixture
async def harness(tmp_path: Path, fake_llm: FakeLLM, db: Database) -> AsyncIterator[Harness]:
    harness = Harness(await make_parts(tmp_path, fake_llm, db), db)
    await harness.start()
    yield harness
    await harness.stop()


async def test_a_message_is_answered_through_the_outbox(
    harness: Harness, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("Hello Ada!"))
    await harness.send("1", "hi", "m1")
    await harness.wait_replies(1)
    (reply,) = harness.replies()
    assert reply.text == "Hello Ada!"
    assert reply.reply_to == "m1"
    assert reply.outbox_id is not None
    typing = [o.active for o in harness.out if isinstance(o, Typing)]
    assert typing == [True, False]
    assert await harness.journal.pending_inbound() == []
    assert await harness.journal.pending_outbox() == []


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "whole"])
async def test_a_channel_that_shows_replies_whole_asks_the_model_for_them_whole(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, streamed: bool
) -> None:
    # litellm's transport: it asks for an answer whole when nobody watches it written (the
    # direct one always streams: it costs it nothing).
    harness = Harness(
        await make_parts(tmp_path, fake_llm, db, transport="litellm"),
        db,
        whole_replies=() if streamed else ("telegram",),
    )
    await harness.start()
    fake_llm.script(Text("Hello Ada, in a few words."))
    await harness.send("1", "hi", "m1")
    await harness.wait_replies(1)
    await harness.stop()
    assert [r.text for r in harness.replies()] == ["Hello Ada, in a few words."]
    assert bool(fake_llm.requests[-1].body.get("stream")) is streamed


async def test_commands(harness: Harness, fake_llm: FakeLLM) -> None:
    await harness.send("1", "remember: blue", "m1")
    await harness.wait_replies(1)
    await harness.send("1", "/status", "m2")
    await harness.wait_replies(2)
    status = harness.replies()[-1].text
    assert "Model: openai/fake-model" in status
    assert "Tokens used in this chat" in status and " in 1 turn" in status  # not "1 turns"
    assert " in 1 turns" not in status
    assert "Context:" in status
    await harness.send("1", "/new@nanobot_bot", "m3")
    await harness.wait_replies(3)
    assert "new conversation" in harness.replies()[-1].text
    await harness.send("1", "/stop", "m4")
    await harness.wait_replies(4)
    assert harness.replies()[-1].text == "Nothing is running."
    await harness.send("1", "/help", "m5")
    await harness.wait_replies(5)
    assert "/new" in harness.replies()[-1].text
    await harness.send("1", "who?", "m6")
    await harness.wait_replies(6)
    assert [m["role"] for m in fake_llm.requests[-1].messages] == ["system", "user"]
    assert fake_llm.request_count == 2  # commands never reach the model


async def test_stop_aborts_the_running_turn(harness: Harness, fake_llm: FakeLLM) -> None:
    fake_llm.script(Hang())
    await harness.send("1", "think hard", "m1")
    await fake_llm.wait_for_requests(1)
    await harness.send("1", "/stop", "m2")
    await harness.wait_replies(1)
    await asyncio.sleep(0.2)  # the stopped turn ends meanwhile, and says nothing more
    assert [r.text for r in harness.replies()] == ["Stopped."]  # the command's answer, once


async def test_a_slow_chat_does_not_delay_another(harness: Harness, fake_llm: FakeLLM) -> None:
    fake_llm.script_for("fake-model")
    fake_llm.script(Hang(), Text("fast answer"))
    await harness.send("slow", "take your time", "m1")
    await fake_llm.wait_for_requests(1)
    await harness.send("fast", "quick one", "m2")
    await harness.wait_replies(1)
    assert harness.replies()[0].chat.chat_id == "fast"
    await harness.send("slow", "/stop", "m3")
    await harness.wait_replies(2)  # the answer to /stop; the stopped turn says nothing more


async def test_recovery_sends_undelivered_replies_and_finishes_turns(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    parts = await make_parts(tmp_path, fake_llm, db)
    first = Harness(parts, db)
    # A reply that never got delivered, and a message whose turn was cut short mid-tool.
    journal = first.journal
    outbox_id = await journal.enqueue(
        "telegram",
        {
            "chat": {"channel": "telegram", "chat_id": "1", "thread_id": None},
            "text": "from before the crash",
            "kind": "reply",
            "reply_to": None,
            "stream_id": None,
        },
    )
    await journal.progress(outbox_id, 2)  # it was long: two parts were out already
    fake_llm.script(ToolCalls([Call("block", id="s1")]))
    await first.start()
    await first.send("2", "long job", "m1")
    await parts.blocker.started.wait()
    first._tasks[0].cancel()  # the process dies: the turn is cut off mid-tool
    first._tasks[1].cancel()
    await asyncio.gather(*first._tasks, return_exceptions=True)

    fake_llm.script(Text("Done, after the restart."))
    second = Harness(await make_parts(tmp_path, fake_llm, db), db)
    await second.start(recover=True)
    await second.wait_replies(2)
    texts = sorted(r.text for r in second.replies())
    assert texts == ["Done, after the restart.", "from before the crash"]
    resent = next(r for r in second.replies() if r.outbox_id == outbox_id)
    assert resent.parts_sent == 2
    resumed = fake_llm.requests[-1].messages
    assert resumed[-1]["role"] == "tool"
    assert "may have run in part or in whole" in resumed[-1]["content"]
    assert [m["content"] for m in resumed if m["role"] == "user"][-1].endswith("long job")
    assert await second.journal.pending_inbound() == []
    await second.stop()


async def test_answers_to_messages_that_waited_are_each_a_message_of_their_own(
    harness: Harness, fake_llm: FakeLLM
) -> None:
    # Two more messages arrive while the first answer is being written: every answer the
    # model gives is delivered as its own message (none replaces another's).
    fake_llm.script(Text("First answer.", delay=1.0), Text("Second answer."))
    await harness.send("1", "one", "m1")
    await fake_llm.wait_for_requests(1, seconds=30)
    await harness.send("1", "two", "m2")
    await harness.send("1", "three", "m3")
    await harness.wait_replies(2)
    replies = harness.replies()
    assert [r.text for r in replies] == ["First answer.", "Second answer."]
    assert len({r.stream_id for r in replies}) == 2
    said = [m["content"] for m in fake_llm.requests[-1].messages if m["role"] == "assistant"]
    assert said == ["First answer."]  # the history says what the chat shows
    assert await harness.journal.pending_inbound() == []


async def test_files_sent_in_a_chat_are_recorded_with_their_sender(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    ledger = Ledger(TaintStore(db), tmp_path / "workspace")
    harness = Harness(await make_parts(tmp_path, fake_llm, db, ledger=ledger), db)
    await harness.start()
    try:
        saved = tmp_path / "workspace" / "inbox" / "cv.txt"
        saved.parent.mkdir(parents=True)
        saved.write_text("hire me")
        fake_llm.script(Text("Got it."))
        message = InboundMessage.from_chat(
            ChatRef("telegram", "7"),
            "7",
            "my cv",
            "m1",
            attachments=(Attachment("document", saved, "text/plain", 7),),
        )
        await harness.gate(message)
        await harness.wait_replies(1)
    finally:
        await harness.stop()
    [mark] = await TaintStore(db).all()
    assert (mark.path, mark.source) == (
        "inbox/cv.txt",
        "received in a chat (telegram chat 7, from 7)",
    )
    assert mark.session_key == "telegram:7"


# Long bounds: litellm's first import, in the test's own process, takes many seconds on a
# busy machine.


def _voice(workspace: Path, caption: str = "") -> InboundMessage:
    data = audio.ogg_opus(4)
    path = workspace / "inbox" / "voice_9.ogg"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    note = Attachment("voice", path, "audio/ogg", len(data), 4.0)
    return InboundMessage.from_chat(
        ChatRef("telegram", "5"), "5", caption, "m9", attachments=(note,)
    )


async def _heard(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, message: InboundMessage, model: str | None
) -> Harness:
    workspace = tmp_path / "workspace"
    settings = TranscriptionSettings(model=model, api_base=fake_llm.base_url, api_key="k")
    reader = Reader(Transcriber(settings, Workspace(workspace)), None)
    harness = Harness(await make_parts(tmp_path, fake_llm, db), db, reader=reader)
    await harness.start()
    return harness


async def test_a_voice_note_is_the_senders_words(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    message = _voice(tmp_path / "workspace")
    fake_llm.add_transcript(message.attachments[0].path.read_bytes(), "what is on today")
    harness = await _heard(tmp_path, fake_llm, db, message, "openai/whisper-1")
    fake_llm.script(Text("Nothing until noon."))
    try:
        await harness.gate(message)
        await harness.wait_replies(1, seconds=120)
    finally:
        await harness.stop()
    assert [r.text for r in harness.replies()] == ["Nothing until noon."]
    said = fake_llm.requests[0].messages[-1]["content"]
    assert "[voice note, 0:04, spoken; its transcript follows" in said
    assert said.endswith("what is on today")
    assert "untrusted_content" not in said  # the sender's own words
    status = await harness.parts.loop.status("telegram:5")
    assert "Transcribed here since the start: 1 voice note, by openai/whisper-1" in status


async def test_a_voice_note_that_cannot_be_heard_is_answered_at_once(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    message = _voice(tmp_path / "workspace")
    harness = await _heard(tmp_path, fake_llm, db, message, None)
    try:
        await harness.gate(message)
        await harness.wait_replies(1, seconds=120)
    finally:
        await harness.stop()
    (notice,) = harness.replies()
    assert notice.text.startswith("I could not transcribe your voice note: voice notes need ")
    assert notice.outbox_id is not None and notice.reply_to == "m9"
    assert fake_llm.request_count == 0  # no turn: nothing else was said
    assert await harness.journal.pending_inbound() == []
    assert message.attachments[0].path.exists()  # kept


async def test_a_captioned_note_that_cannot_be_heard_still_gets_its_caption_answered(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    message = _voice(tmp_path / "workspace", caption="listen to this")
    harness = await _heard(tmp_path, fake_llm, db, message, None)
    fake_llm.script(Text("I can't hear it, sorry."))
    try:
        await harness.gate(message)
        await harness.wait_replies(2, seconds=120)
    finally:
        await harness.stop()
    texts = [r.text for r in harness.replies()]
    assert texts[0].startswith("I could not transcribe your voice note")
    assert texts[1] == "I can't hear it, sorry."
    said = fake_llm.requests[0].messages[-1]["content"]
    assert "listen to this" in said and "not transcribed: voice notes need" in said


async def test_a_message_after_a_voice_note_does_not_overtake_it(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    # Hearing the note takes a while; the text sent after it is read at once, and must
    # still reach the session after the note.
    message = _voice(tmp_path / "workspace")
    fake_llm.add_transcript(message.attachments[0].path.read_bytes(), "what is on today")
    fake_llm.script_for("whisper-1", Echo(delay=0.5))
    harness = await _heard(tmp_path, fake_llm, db, message, "openai/whisper-1")
    try:
        await harness.gate(message)
        await harness.send("5", "and after that?", "m10")
        await harness.wait_replies(1, seconds=60)  # the first transcription imports litellm
        if "and after that?" not in harness.replies()[-1].text:  # not steered: a turn of its own
            await harness.wait_replies(2)
    finally:
        await harness.stop()
    assert harness.replies()[-1].text.startswith("echo: ")
    first = "\n".join(str(m["content"]) for m in fake_llm.requests[0].messages)
    assert "what is on today" in first
    for request in fake_llm.requests:
        said = "\n".join(str(m["content"]) for m in request.messages)
        if "and after that?" in said:
            assert said.index("what is on today") < said.index("and after that?")


async def test_a_voice_note_is_answered_by_a_reply_to_be_spoken_shown_only_whole(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    message = _voice(tmp_path / "workspace")
    voices = VoiceReplies(ChatSettings(db), {"telegram": "when_spoken"})
    harness = Harness(await make_parts(tmp_path, fake_llm, db), db, voices=voices)
    await harness.start()
    fake_llm.chunk_delay = 0.15  # long enough to be shown while written
    words = "one two three four five six seven eight nine ten"
    fake_llm.script(Text(f"Spoken: {words}."), Text(f"Typed: {words}."))
    try:
        await harness.gate(message)
        await harness.wait_replies(1)
        await harness.send("5", "and typed", "m10")
        await harness.wait_replies(2)
    finally:
        await harness.stop()
    spoken, typed = harness.replies()
    assert (spoken.text, spoken.speak) == (f"Spoken: {words}.", True)
    assert (typed.text, typed.speak) == (f"Typed: {words}.", False)
    shown = {u.stream_id for u in harness.out if isinstance(u, StreamUpdate)}
    assert shown == {typed.stream_id}  # the spoken one was not streamed
    [row] = await db.fetchall("SELECT message FROM outbox WHERE id = ?", (spoken.outbox_id,))
    assert json.loads(row[0])["speak"] is True  # a restart delivers it spoken too


async def test_a_voice_note_to_a_busy_chat_joins_its_turn_and_holds_up_no_other_chat(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    message = _voice(tmp_path / "workspace")
    fake_llm.add_transcript(message.attachments[0].path.read_bytes(), "what is on today")
    fake_llm.script_for("whisper-1", Echo(delay=6))  # a slow transcription service
    fake_llm.script(ToolCalls([Call("block", id="s"), Call("echo", {"text": "x"}, id="e")]))
    harness = await _heard(tmp_path, fake_llm, db, message, "openai/whisper-1")
    loop = harness.parts.loop
    try:
        await harness.send("5", "do two things", "m1")
        await harness.parts.blocker.started.wait()
        await harness.gate(message)  # chat 5 is busy, and its note takes long to hear
        await harness.send("6", "hello from six", "m2")
        await harness.wait_replies(1, seconds=60)
        (first,) = harness.replies()
        assert first.chat.chat_id == "6", first
        assert first.text.endswith("hello from six"), first.text
        assert "Transcribed here" not in await loop.status("telegram:5"), "chat 6 waited"
        async with asyncio.timeout(60):
            # The loop tells that it heard the note only in /status: there is no event.
            while "Transcribed here" not in await loop.status("telegram:5"):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        harness.parts.blocker.release.set()
        async with asyncio.timeout(60):
            while not any("what is on today" in r.text for r in harness.replies("5")):
                await harness.wait_replies(len(harness.replies()) + 1)
    finally:
        await harness.stop()
    # Steered into the running turn or answered after it, as any message: once, in order.
    said = [e["content"] for e in await harness.parts.entries("telegram:5") if e["role"] == "user"]
    assert said[0].endswith("do two things")
    assert sum("what is on today" in text for text in said) == 1
    assert "[voice note, 0:04, spoken" in said[-1]
