"""Membership: a gateway's row kept alive while it runs, against a real SQLite file; the
beats are driven by the test, and a write failure is a real one (a read-only connection)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from loguru import logger

from nanobot.cluster.membership import Membership
from nanobot.cluster.timings import ALONE, BEAT_INTERVAL
from nanobot.store import Database
from nanobot.store.members import Member, Members

T0 = datetime(2026, 6, 15, 9, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.time = T0

    def __call__(self) -> datetime:
        return self.time


class Ticks:
    """The membership's sleep, driven by the test: `tick()` lets one beat happen and returns
    once it has (the beating task sleeps again)."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self._asleep = asyncio.Event()
        self._go: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        self._asleep.set()
        await self._go.get()

    async def tick(self) -> None:
        await self._asleep.wait()
        self._asleep.clear()
        self._go.put_nowait(None)
        await self._asleep.wait()


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


@pytest.fixture
def lines() -> Iterator[list[str]]:
    """What the membership logs at INFO or worse, as 'LEVEL message'."""
    found: list[str] = []
    sink = logger.add(
        lambda m: found.append(f"{m.record['level'].name} {m.record['message']}"), level="INFO"
    )
    yield found
    logger.remove(sink)


async def test_the_row_lives_while_the_block_runs_and_goes_at_a_clean_end(
    db: Database, lines: list[str]
) -> None:
    clock, ticks = Clock(), Ticks()
    members = Members(db, clock)
    dead = Member.new(T0 - timedelta(hours=1), pid=1, lifetime=ALONE)
    await members.register(dead)  # a process that died without leaving
    async with Membership(members, sleep=ticks.sleep) as membership:
        [row] = await members.all()  # the dead one is forgotten
        assert row == membership.member and row.started_at == row.beat_at == T0
        clock.time += BEAT_INTERVAL
        await ticks.tick()
        [row] = await members.all()
        assert row.beat_at == T0 + BEAT_INTERVAL and row.started_at == T0
        assert ticks.asked == [BEAT_INTERVAL.total_seconds()] * 2
    assert await members.all() == []
    assert lines == []


async def test_the_row_stays_when_the_block_fails(db: Database) -> None:
    members = Members(db, Clock())
    with pytest.raises(RuntimeError):
        async with Membership(members, sleep=Ticks().sleep):
            raise RuntimeError("crash")
    [row] = await members.all()  # it goes stale: who it was and when it was last alive
    assert row.beat_at == T0


async def test_a_failed_beat_is_logged_once_and_never_stops_the_beating(
    db: Database, lines: list[str]
) -> None:
    clock, ticks = Clock(), Ticks()
    members = Members(db, clock)
    async with Membership(members, sleep=ticks.sleep):
        await db.execute("PRAGMA query_only = ON")  # every write fails from now on
        for _ in range(3):
            clock.time += BEAT_INTERVAL
            await ticks.tick()
        [failed] = lines  # once (nanobot.outage): the later failures at debug
        assert failed.startswith(
            "WARNING could not record this gateway's beat in the state database: "
        )
        assert "readonly" in failed
        assert f"reports it down once no beat is recorded for {ALONE.seconds}s" in failed
        assert f"(next try in {BEAT_INTERVAL.seconds} s)" in failed

        await db.execute("PRAGMA query_only = OFF")  # the disk has room again
        clock.time += BEAT_INTERVAL
        await ticks.tick()
        [row] = await members.all()
        assert row.beat_at == T0 + 4 * BEAT_INTERVAL
        [back] = lines[1:]
        assert back.startswith("WARNING this gateway's beats are recorded again after ")
    assert await members.all() == []


async def test_a_store_failing_at_start_and_stop_is_logged_not_raised(
    db: Database, lines: list[str]
) -> None:
    clock, ticks = Clock(), Ticks()
    members = Members(db, clock)
    await db.execute("PRAGMA query_only = ON")
    async with Membership(members, sleep=ticks.sleep) as membership:
        assert len(lines) == 1 and lines[0].startswith("WARNING could not record")
        await db.execute("PRAGMA query_only = OFF")
        clock.time += BEAT_INTERVAL
        await ticks.tick()  # the beat writes the row that registering could not
        assert await members.all() == [membership.member]
        await db.execute("PRAGMA query_only = ON")
    assert lines[-1].startswith(
        "WARNING could not remove this gateway's row from the members table ("
    )
    assert lines[-1].endswith(f"it goes stale in {ALONE.seconds}s")
    assert len(await members.all()) == 1


AGREED = {"model": "m1", "telegram": "t1", "tools": "x1"}


async def test_a_member_whose_config_differs_from_a_live_one_is_refused(
    db: Database, lines: list[str]
) -> None:
    from nanobot.errors import ConfigError

    clock = Clock()
    members = Members(db, clock)
    running = Member.new(T0, host="alpha", pid=4242, agreement=AGREED, lifetime=ALONE)
    await members.register(running)
    differing = {**AGREED, "model": "m2", "tools": "x2"}
    membership = Membership(members, agreement=differing, sleep=Ticks().sleep)
    with pytest.raises(ConfigError) as refused:
        async with membership:
            pytest.fail("the block ran")
    message = str(refused.value)
    assert "differs in model, tools from" in message
    assert f"pid 4242 on host alpha, member {running.id}" in message
    assert "m2" not in message and "x1" not in message  # kinds, never values
    assert await members.all() == [running]  # the refused one's row is gone


async def test_members_that_agree_start_and_another_workspace_is_warned_about(
    db: Database, lines: list[str]
) -> None:
    clock = Clock()
    members = Members(db, clock)
    elsewhere = Member.new(
        T0, host="alpha", pid=1, workspace="/mnt/a", agreement=AGREED, lifetime=ALONE
    )
    same = Member.new(
        T0, host="beta", pid=2, workspace="/mnt/shared", agreement=AGREED, lifetime=ALONE
    )
    for member in (elsewhere, same):
        await members.register(member)
    async with Membership(
        members, workspace="/mnt/shared", agreement=AGREED, sleep=Ticks().sleep
    ) as membership:
        assert len(await members.all()) == 3
        assert membership.member.workspace == "/mnt/shared"
    [warning] = lines
    assert warning.startswith("WARNING this gateway's workspace is /mnt/shared but pid 1 on")
    assert "uses /mnt/a" in warning and "must share one workspace" in warning


async def test_gone_members_and_rows_without_an_agreement_are_not_compared(
    db: Database, lines: list[str]
) -> None:
    clock = Clock()
    members = Members(db, clock)
    differing = {**AGREED, "model": "m2"}
    stale = Member.new(
        T0 - ALONE - timedelta(seconds=1), pid=1, agreement=differing, lifetime=ALONE
    )
    predecessor = Member.new(
        T0, host="alpha", pid=2, workspace="/old", agreement=differing, lifetime=ALONE
    )
    older = Member.new(T0, host="gamma", pid=3, agreement={}, lifetime=ALONE)  # a version before
    for member in (predecessor, older):
        await members.register(member)
    membership = Membership(members, agreement=AGREED, succeeds=predecessor.id, sleep=Ticks().sleep)
    # The same host and pid: an earlier process of a restarted container.
    restarted = Member.new(T0, agreement=differing, workspace="/old", lifetime=ALONE)
    assert (restarted.host, restarted.pid) == (membership.member.host, membership.member.pid)
    await members.register(stale)
    await members.register(restarted)
    async with membership:
        pass
    assert lines == []
