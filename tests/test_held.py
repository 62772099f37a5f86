"""A turn whose session or reply cannot be written: its message stays unanswered in the
journal, intake stops, and the message is answered once the store takes writes again (or
after a restart). The real store fails for real: `PRAGMA query_only` makes every write fail
as on a file that turned read-only, switched on right after a chosen write."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from nanobot.agent.dispatcher import HELD, Dispatcher
from nanobot.agent.held import Held
from nanobot.bus.events import ChatRef, InboundMessage, Outbound, OutboundMessage
from nanobot.bus.intake import IntakePaused
from nanobot.bus.queue import MessageBus
from nanobot.bus.records import Record
from nanobot.channels.base import Intake
from nanobot.errors import StoreError
from nanobot.gate import ChannelRules, Gate
from nanobot.outage import DEFAULT_BACKOFF
from nanobot.store import Access, Database, Journal
from tests.fakes.llm import Call, FakeLLM, Text, ToolCalls
from tests.test_loop import Parts, make_parts


async def read_only(db: Database, on: bool) -> None:
    await db.fetchall(f"PRAGMA query_only = {'ON' if on else 'OFF'}")


class FailingJournal(Journal):
    """The journal, after whose next `accept` (or before whose next `complete`) every write
    fails until `read_only(db, False)`."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.db = db
        self.fail_after_accept = False
        self.fail_complete = False

    async def accept(
        self, channel: str, message_id: str, message: Record, session_key: str | None = None
    ) -> int | None:
        row = await super().accept(channel, message_id, message, session_key)
        if self.fail_after_accept:
            self.fail_after_accept = False
            await read_only(self.db, True)
        return row

    async def complete(
        self,
        inbound_ids: Sequence[int],
        reply: tuple[str, Record] | None,
        *,
        cron_run: int | None = None,
    ) -> int | None:
        if self.fail_complete:
            self.fail_complete = False
            await read_only(self.db, True)
        return await super().complete(inbound_ids, reply, cron_run=cron_run)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Gates:
    """The database's storage-failure watcher here: tells every gate built on it (a restart
    of the rig builds another on the same database)."""

    def __init__(self) -> None:
        self.gates: list[Gate] = []

    def store_failed(self, error: StoreError) -> None:
        for gate in self.gates:
            gate.store_failed(error)


class Rig:
    """Gate, journal, dispatcher and loop on one database, wired as the gateway wires them."""

    def __init__(self, parts: Parts, db: Database, gates: Gates) -> None:
        self.parts, self.db, self.gates = parts, db, gates
        self.bus, self.clock = MessageBus(), Clock()
        self.journal = FailingJournal(db)
        rules = {"telegram": ChannelRules(frozenset({"*"}))}
        self.gate = Gate(rules, Access(db), self.journal, self.bus, clock=self.clock)
        gates.gates.append(self.gate)
        self.dispatcher = self.make_dispatcher()
        self.out: list[Outbound] = []
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def make_dispatcher(self) -> Dispatcher:
        held = Held(self.gate, self.journal)
        return Dispatcher(self.parts.loop, self.bus, self.journal, held=held)

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.dispatcher.run()),
            asyncio.create_task(self._collect()),
        ]

    async def _collect(self) -> None:
        async for item in self.bus.outbound("telegram"):
            self.out.append(item)
            self._arrived.set()
            if isinstance(item, OutboundMessage) and item.outbox_id is not None:
                await self.journal.confirm(item.outbox_id)

    async def send(self, chat: str, text: str, mid: str) -> Intake:
        return await self.gate(InboundMessage.from_chat(ChatRef("telegram", chat), chat, text, mid))

    def texts(self, chat: str | None = None) -> list[str]:
        return [
            o.text
            for o in self.out
            if isinstance(o, OutboundMessage) and (chat is None or o.chat.chat_id == chat)
        ]

    async def wait_texts(self, count: int) -> list[str]:
        async with asyncio.timeout(20):
            while len(self.texts()) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.texts()

    async def recover_store(self) -> None:
        """The store takes writes again, and the gate's pause before trying it is over."""
        await read_only(self.db, False)
        self.clock.now += DEFAULT_BACKOFF.pause(1)

    async def pending(self) -> list[str]:
        return [str(p.message["message_id"]) for p in await self.journal.pending_inbound()]

    async def stop(self) -> None:
        if not self._tasks or self._tasks[0].done():
            return
        self.bus.close_inbound()
        await asyncio.wait_for(self._tasks[0], 10)
        self.bus.close_outbound()
        await asyncio.wait_for(self._tasks[1], 10)


@pytest.fixture
def gates() -> Gates:
    return Gates()


@pytest.fixture
async def db(tmp_path: Path, gates: Gates) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db", watch=gates) as database:
        yield database


@pytest.fixture
async def rig(tmp_path: Path, fake_llm: FakeLLM, db: Database, gates: Gates) -> AsyncIterator[Rig]:
    rig = Rig(await make_parts(tmp_path, fake_llm, db), db, gates)
    await rig.start()
    yield rig
    await read_only(db, False)
    await rig.stop()


async def test_a_reply_that_cannot_be_queued_is_sent_once_the_store_takes_writes(
    rig: Rig, fake_llm: FakeLLM, warnings: list[str], errors: list[str]
) -> None:
    fake_llm.script(Text("Hello Ada!"), Text("Yes."))
    rig.journal.fail_complete = True  # the outbox row (and the answered mark) fails
    assert await rig.send("1", "hi", "m1") is Intake.ACCEPTED
    assert await rig.wait_texts(1) == [HELD]
    assert rig.gate.stopped
    assert await rig.pending() == ["m1"]
    held = [w for w in warnings if "message m1 is not answered yet" in w]
    assert len(held) == 1 and "readonly" in held[0]
    assert errors == []  # no traceback
    [stopped] = [w for w in warnings if w.startswith("intake stopped")]  # the gate's one line
    assert "readonly" in stopped

    await rig.recover_store()
    assert await rig.send("2", "anyone there?", "m2") is Intake.ACCEPTED  # reopens intake
    texts = await rig.wait_texts(3)
    assert sorted(texts[1:]) == ["Hello Ada!", "Yes."]
    assert rig.texts("1") == [HELD, "Hello Ada!"]  # the stored answer: no second model call
    assert fake_llm.request_count == 2
    await asyncio.sleep(0)
    assert await rig.pending() == []


async def test_a_user_message_that_cannot_be_stored_is_answered_once_the_store_takes_writes(
    rig: Rig, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("Hi!"), Text("Hi too!"))
    rig.journal.fail_after_accept = True  # journaled; its session entry then fails
    assert await rig.send("1", "hi", "m1") is Intake.ACCEPTED
    assert await rig.wait_texts(1) == [HELD]
    assert fake_llm.request_count == 0  # the model is not asked what memory does not hold
    assert await rig.pending() == ["m1"]
    # Refused while stopped, and not taken, so not answered: the channel hands it again.
    with pytest.raises(IntakePaused, match="intake is stopped"):
        await rig.send("1", "hello?", "m1b")

    await rig.recover_store()
    assert await rig.send("2", "hey", "m2") is Intake.ACCEPTED
    await rig.wait_texts(3)
    assert rig.texts("1")[0] == HELD and len(rig.texts("1")) == 2
    assert len(rig.texts("2")) == 1
    user = [e for e in await rig.parts.entries("telegram:1") if e.get("role") == "user"]
    assert len(user) == 1  # stored once, by the retry


async def test_a_tool_result_that_cannot_be_stored_resumes_the_turn_once_the_store_takes_writes(
    rig: Rig, fake_llm: FakeLLM
) -> None:
    fake_llm.script(ToolCalls([Call("block", {})]), Text("done"), Text("and you?"))
    assert await rig.send("1", "wait for it", "m1") is Intake.ACCEPTED
    async with asyncio.timeout(10):
        await rig.parts.blocker.started.wait()
    await read_only(rig.db, True)
    rig.parts.blocker.release.set()
    assert await rig.wait_texts(1) == [HELD]  # not "could not be saved" as if answered
    assert await rig.pending() == ["m1"]

    await rig.recover_store()
    assert await rig.send("2", "hi", "m2") is Intake.ACCEPTED
    await rig.wait_texts(3)
    assert rig.texts("1")[0] == HELD and len(rig.texts("1")) == 2
    assert fake_llm.request_count == 3


async def test_what_is_held_at_a_stop_is_answered_after_the_restart(
    rig: Rig, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("Hello after all"))
    rig.journal.fail_after_accept = True
    assert await rig.send("1", "hi", "m1") is Intake.ACCEPTED
    assert await rig.wait_texts(1) == [HELD]
    await rig.stop()
    await read_only(rig.db, False)

    restarted = Rig(rig.parts, rig.db, rig.gates)
    await restarted.dispatcher.recover(["telegram"])
    await restarted.start()
    try:
        assert await restarted.wait_texts(1) == ["Hello after all"]
    finally:
        await restarted.stop()
    assert await restarted.pending() == []


async def test_what_is_held_is_answered_after_the_pause_without_a_message_coming_in(
    rig: Rig, fake_llm: FakeLLM
) -> None:
    """A process that takes no messages in (a cluster member the load balancer does not
    send to) tries the store again once the gate's pause is over."""
    fake_llm.script(Text("Hello after the pause"))
    rig.journal.fail_after_accept = True
    assert await rig.send("1", "hi", "m1") is Intake.ACCEPTED
    assert await rig.wait_texts(1) == [HELD]
    await read_only(rig.db, False)
    rig.clock.now += DEFAULT_BACKOFF.pause(1)  # the pause is over; nobody sends anything
    assert await rig.wait_texts(2) == [HELD, "Hello after the pause"]
    assert rig.gate.stopped  # intake itself reopens with the next message's journal write
    assert await rig.pending() == []
