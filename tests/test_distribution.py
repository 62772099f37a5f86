"""Work distribution among the members of a cluster (nanobot/distribution.py), on a real
PostgreSQL database with real LISTEN/NOTIFY: every message taken once, each session's by one
member in order, a dead member's sessions taken over once its leases lapse."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from nanobot.bus.events import ChatRef, InboundMessage
from nanobot.bus.queue import MessageBus
from nanobot.cluster.distribution import Distributor
from nanobot.cluster.timings import ALONE
from nanobot.store import Database, Journal
from nanobot.store.claims import Claims
from nanobot.store.members import Member as MemberRow
from nanobot.store.members import Members
from nanobot.store.wakeups import INBOUND, Listening, PostgresWakeups

LEASE = timedelta(seconds=1)
EVENTS: list[str] = []  # what the members did, in order


@dataclass
class Taker:
    """A dispatcher that only notes what it was given."""

    name: str
    taken: list[tuple[InboundMessage, bool]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: bool = False

    def take(self, message: InboundMessage, *, resume: bool) -> None:
        self.taken.append((message, resume))
        EVENTS.append(f"{self.name} took {message.text}")
        self.arrived.set()

    def drop_all(self) -> None:
        self.dropped = True
        EVENTS.append(f"{self.name} dropped its turns")


@dataclass
class Member:
    distributor: Distributor
    listening: Listening
    taker: Taker
    task: asyncio.Future[tuple[None, None]] | None = None

    def start(self) -> None:
        """Take work and listen, as the gateway runs its distributor and wake-ups."""
        self.task = asyncio.gather(self.distributor.run(self.taker), self.listening.run())

    async def kill(self) -> None:
        """Stop taking without giving anything up, as a process killed with -9."""
        assert self.task is not None
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


@pytest.fixture
async def db(postgres_url: str) -> AsyncIterator[Database]:
    async with await Database.open(postgres_url) as database:
        yield database


def member(db: Database, url: str, name: str, lease: timedelta = LEASE) -> Member:
    wakeups = PostgresWakeups(db, url)
    distributor = Distributor(
        Claims(db, name),
        Journal(db),
        Members(db),
        wakeups,
        MessageBus(),
        channels={"telegram"},
        lease=lease,
    )
    return Member(distributor, Listening(wakeups, {INBOUND: distributor.woken}), Taker(name))


async def arrive(via: Member, chat: str, text: str) -> None:
    """A message taken in by `via`'s channel, as the gate hands it on: journaled (and taken
    by `via` if it may answer it at once), then answered there or the cluster woken."""
    message = InboundMessage.from_chat(ChatRef("telegram", chat), chat, text, f"{chat}-{text}")
    accepted = await via.distributor.accept(message)
    assert accepted is not None
    await via.distributor.hand_over(replace(message, journal_id=accepted.id), accepted)


async def register(db: Database, *names: str) -> None:
    """`names` as live members: none of them is alone, so new sessions are shared out."""
    members = Members(db)
    for name in names:
        await members.register(replace(MemberRow.new(members.now(), lifetime=ALONE), id=name))


async def until(condition: Callable[[], bool], *members: Member, seconds: float = 20) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            waits = [asyncio.create_task(m.taker.arrived.wait()) for m in members]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
            for m in members:
                m.taker.arrived.clear()


async def test_every_message_is_taken_once_and_each_session_by_one_member(
    db: Database, postgres_url: str
) -> None:
    a, b = member(db, postgres_url, "a"), member(db, postgres_url, "b")
    await register(db, "a", "b")
    a.start()
    b.start()
    try:
        for round_ in range(3):
            for chat in range(20):
                await arrive(a if chat % 2 else b, str(chat), f"m{round_}")
        await until(lambda: len(a.taker.taken) + len(b.taker.taken) == 60, a, b)
    finally:
        await a.kill()
        await b.kill()
    taken = [*a.taker.taken, *b.taker.taken]
    assert len({m.journal_id for m, _ in taken}) == 60
    for one in (a, b):
        for chat_id in {msg.chat.chat_id for msg, _ in one.taker.taken}:
            texts = [msg.text for msg, _ in one.taker.taken if msg.chat.chat_id == chat_id]
            assert texts == ["m0", "m1", "m2"]  # the whole session here, in order
    assert not any(resume for _, resume in taken)


async def test_a_member_alone_answers_what_it_takes_in_without_a_round_trip_more(
    db: Database, postgres_url: str
) -> None:
    a = member(db, postgres_url, "a")
    await register(db, "a")
    a.start()
    await asyncio.sleep(0)  # it runs: it takes work now
    try:
        for text in ("one", "two"):
            await arrive(a, "5", text)
            # handed to its dispatcher as it was journaled: no wake-up, no round
            assert [m.text for m, _ in a.taker.taken][-1] == text
        await register(db, "b")  # no longer alone: a new session is the cluster's
        await arrive(a, "6", "three")
        assert [m.text for m, _ in a.taker.taken] == ["one", "two"]
        await until(lambda: len(a.taker.taken) == 3, a)
        await arrive(a, "6", "four")  # its session now: taken at once again
        assert [m.text for m, _ in a.taker.taken] == ["one", "two", "three", "four"]
    finally:
        await a.kill()
    assert await Claims(db, "a").candidates(datetime.now(UTC), 10) == []


async def test_a_dead_members_session_is_taken_over_once_its_lease_lapses(
    db: Database, postgres_url: str
) -> None:
    a, b = member(db, postgres_url, "a"), member(db, postgres_url, "b")
    a.start()
    await arrive(a, "7", "first")
    await until(lambda: len(a.taker.taken) == 1, a)
    b.start()
    await a.kill()  # its turn for "first" never finished: the message stays pending
    await arrive(b, "7", "second")
    await until(lambda: len(b.taker.taken) == 2, b)
    await b.kill()
    assert [m.text for m, _ in b.taker.taken] == ["first", "second"]
    assert [m.text for m, _ in a.taker.taken] == ["first"]


async def test_a_member_that_leaves_hands_its_waiting_work_on_at_once(
    db: Database, postgres_url: str
) -> None:
    # A lease no test waits out: only leaving frees the session in time.
    a, b = member(db, postgres_url, "a", timedelta(hours=1)), member(db, postgres_url, "b")
    a.start()
    await arrive(a, "3", "one")
    await until(lambda: len(a.taker.taken) == 1, a)
    await a.kill()
    b.start()
    await a.distributor.leave()
    await until(lambda: len(b.taker.taken) == 1, b)
    await b.kill()
    assert [m.text for m, _ in b.taker.taken] == ["one"]


async def test_a_member_cut_off_from_the_store_stops_its_turns_before_its_leases_lapse(
    db: Database, postgres_url: str
) -> None:
    async with await Database.open(postgres_url) as own:  # a's own connections
        a, b = member(own, postgres_url, "a"), member(db, postgres_url, "b")
        a.start()
        await arrive(a, "9", "held")
        await until(lambda: len(a.taker.taken) == 1, a)
        b.start()
        await own.close()  # a loses the store: its renewals fail from now on
        await until(lambda: len(b.taker.taken) == 1, b)
        await a.kill()
        await b.kill()
    assert [m.text for m, _ in b.taker.taken] == ["held"]
    # a stopped the turn before its lease lapsed and b could take the session
    assert EVENTS[-2:] == ["a dropped its turns", "b took held"]
