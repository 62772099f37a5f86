"""The members table against a real SQLite file, with the store's clock moved by the test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nanobot.cluster.timings import ALONE, BEAT_INTERVAL
from nanobot.errors import StoreError
from nanobot.store import Database
from nanobot.store.members import Member, Members
from tests._clock import Clock

T0 = datetime(2026, 6, 15, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def members(db: Database, clock: Clock) -> Members:
    return Members(db, clock)


def test_a_new_member_is_this_process_with_a_random_id() -> None:
    import os
    import socket

    first, second = Member.new(T0, lifetime=ALONE), Member.new(T0, lifetime=ALONE)
    assert first.id != second.id and len(first.id) == 16
    assert (first.pid, first.host) == (os.getpid(), socket.gethostname())
    assert first.started_at == first.beat_at == T0
    assert Member.new(T0, host="box", pid=42, lifetime=ALONE).describe() == "pid 42 on host box"


async def test_register_beat_and_leave(members: Members, clock: Clock) -> None:
    assert await members.all() == []
    me = Member.new(clock(), host="box", pid=42, version="9.9", lifetime=ALONE)
    await members.register(me)
    assert await members.all() == [me]

    clock.time += BEAT_INTERVAL
    beaten = await members.beat(me)
    beat_at = T0 + BEAT_INTERVAL
    assert beaten == Member(
        me.id, "box", 42, "9.9", started_at=T0, beat_at=beat_at, expires_at=beat_at + ALONE
    )
    assert await members.all() == [beaten]

    assert await members.leave(me.id)
    assert await members.all() == []
    assert not await members.leave(me.id)


async def test_a_member_registered_twice_is_refused(members: Members, clock: Clock) -> None:
    me = Member.new(clock(), lifetime=ALONE)
    await members.register(me)
    with pytest.raises(StoreError, match=r"(?i)unique"):
        await members.register(me)


async def test_a_beat_writes_a_row_that_is_gone_again(members: Members, clock: Clock) -> None:
    me = Member.new(clock(), lifetime=ALONE)
    clock.time += timedelta(minutes=5)
    assert await members.beat(me) == Member(
        me.id,
        me.host,
        me.pid,
        me.version,
        started_at=T0,
        beat_at=clock.time,
        expires_at=clock.time + ALONE,
    )
    assert [m.id for m in await members.all()] == [me.id]


async def test_a_member_is_stale_once_its_row_expires(members: Members, clock: Clock) -> None:
    me = Member.new(clock(), lifetime=ALONE)
    await members.register(me)
    assert ALONE == 3 * BEAT_INTERVAL
    [row] = await members.all()
    assert row.lifetime == ALONE and row.expires_at == T0 + ALONE
    assert not row.stale(members.now())
    clock.time = T0 + ALONE - timedelta(microseconds=1)
    assert not row.stale(members.now())
    clock.time = T0 + ALONE
    assert row.stale(members.now())
    clock.time += BEAT_INTERVAL
    [row] = [await members.beat(row)]  # a beat keeps its lifetime, from now
    assert row.expires_at == clock.time + ALONE and not row.stale(members.now())


async def test_a_member_lives_as_long_as_it_says(members: Members, clock: Clock) -> None:
    """Readers judge by the expiry each member wrote, never by a timing of their own."""
    short = Member.new(clock(), pid=1, lifetime=timedelta(seconds=10))
    await members.register(short)
    await members.register(Member.new(clock(), pid=2, lifetime=ALONE))
    clock.time += timedelta(seconds=10)
    assert [m.pid for m in await members.all() if not m.stale(members.now())] == [2]


async def test_all_lists_the_latest_beat_first(members: Members, clock: Clock) -> None:
    old, new = (
        Member.new(clock(), pid=1, lifetime=ALONE),
        Member.new(clock(), pid=2, lifetime=ALONE),
    )
    await members.register(old)
    await members.register(new)
    clock.time += BEAT_INTERVAL
    await members.beat(old)
    assert [m.pid for m in await members.all()] == [1, 2]
    clock.time += BEAT_INTERVAL
    await members.beat(new)
    assert [m.pid for m in await members.all()] == [2, 1]


async def test_forget_stale_removes_only_the_members_that_stopped_beating(
    members: Members, clock: Clock
) -> None:
    dead, alive = (
        Member.new(clock(), pid=1, lifetime=ALONE),
        Member.new(clock(), pid=2, lifetime=ALONE),
    )
    await members.register(dead)
    await members.register(alive)
    clock.time += ALONE - timedelta(seconds=1)
    await members.beat(alive)
    assert await members.forget_stale() == 0  # dead a second later
    clock.time += timedelta(seconds=1)
    assert await members.forget_stale() == 1
    assert [m.pid for m in await members.all()] == [2]


async def test_another_process_sees_the_rows(
    store_target: Path | str, members: Members, clock: Clock
) -> None:
    me = Member.new(clock(), lifetime=ALONE)
    await members.register(me)
    async with await Database.open(store_target) as other:
        assert await Members(other).all() == [me]


async def test_times_are_kept_in_utc_whatever_zone_they_come_in(
    members: Members, clock: Clock
) -> None:
    from zoneinfo import ZoneInfo

    clock.time = datetime(2026, 6, 15, 11, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    await members.register(Member.new(clock(), lifetime=ALONE))
    [row] = await members.all()
    assert row.beat_at == T0 and row.beat_at.tzinfo == UTC


async def test_a_write_that_fails_raises_store_error(tmp_path: Path, clock: Clock) -> None:
    async with await Database.open(tmp_path / "state.db") as db:  # SQLite's read-only switch
        await db.execute("PRAGMA query_only = ON")
        with pytest.raises(StoreError, match="readonly"):
            await Members(db, clock).register(Member.new(clock(), lifetime=ALONE))


async def test_the_workspace_and_agreement_are_kept_and_a_beat_keeps_them(
    members: Members, clock: Clock
) -> None:
    me = Member.new(
        clock(), workspace="/srv/ws", agreement={"model": "ab12", "tools": "cd34"}, lifetime=ALONE
    )
    await members.register(me)
    assert await members.all() == [me]
    clock.time += BEAT_INTERVAL
    beaten = await members.beat(me)
    [row] = await members.all()
    assert row == beaten and (row.workspace, dict(row.agreement)) == (
        "/srv/ws",
        {"model": "ab12", "tools": "cd34"},
    )
    await members.leave(me.id)  # a row written anew by a beat has them too
    await members.beat(beaten)
    [row] = await members.all()
    assert (row.workspace, dict(row.agreement)) == ("/srv/ws", {"model": "ab12", "tools": "cd34"})


async def test_a_row_of_a_version_before_has_no_workspace_or_agreement(
    db: Database, members: Members, clock: Clock
) -> None:
    await db.execute(
        "INSERT INTO members (id, host, pid, version, started_at, beat_at, expires_at)"
        " VALUES ('old', 'box', 7, '0.9', '2026-06-15T09:00:00+00:00',"
        " '2026-06-15T09:00:00+00:00', '2026-06-15T09:00:45+00:00')"
    )
    [row] = await members.all()
    assert (row.id, row.workspace, dict(row.agreement)) == ("old", "", {})
    me = Member.new(clock(), agreement={"model": "ab12"}, lifetime=ALONE)
    assert me.disagrees(row) == row.disagrees(me) == []  # nothing to tell


def test_disagrees_names_the_parts_that_differ_sorted() -> None:
    me = Member.new(T0, agreement={"model": "1", "telegram": "2", "tools": "3"}, lifetime=ALONE)
    twin = Member.new(T0, agreement={"tools": "3", "model": "1", "telegram": "2"}, lifetime=ALONE)
    other = Member.new(T0, agreement={"model": "9", "telegram": "2", "tools": "8"}, lifetime=ALONE)
    newer = Member.new(
        T0, agreement={"model": "1", "telegram": "2", "tools": "3", "web": "4"}, lifetime=ALONE
    )
    assert me.disagrees(twin) == []
    assert me.disagrees(other) == other.disagrees(me) == ["model", "tools"]
    assert me.disagrees(newer) == ["web"]  # a part only one has


def _wait_for_its_command_line(pid: int) -> None:
    """Until /proc shows the process's arguments: the kernel lets the parent go on during the
    child's exec, a moment before it sets them up, and an empty command line reads as "not
    nanobot" (seen under load)."""
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_member_whose_process_ended_on_this_host_is_gone() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    here = socket.gethostname()
    nanobot_like = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "nanobot"]
    )
    other = subprocess.Popen(["sleep", "30"])
    try:
        for started in (nanobot_like, other):
            _wait_for_its_command_line(started.pid)
        alive = Member.new(now, host=here, pid=nanobot_like.pid, lifetime=ALONE)
        assert not alive.ended_here() and not alive.gone(now)
        assert Member.new(
            now, host=here, pid=other.pid, lifetime=ALONE
        ).ended_here()  # a reused pid
        assert Member.new(
            now, host=here, pid=os.getpid(), lifetime=ALONE
        ).ended_here()  # an earlier us
        assert not Member.new(now, host="elsewhere", pid=other.pid, lifetime=ALONE).ended_here()
        assert alive.gone(now + ALONE + timedelta(seconds=1))  # stale is gone too
    finally:
        for process in (nanobot_like, other):
            process.kill()
            process.wait()
    assert Member.new(now, host=here, pid=nanobot_like.pid, lifetime=ALONE).gone(
        now
    )  # reaped: nobody's
