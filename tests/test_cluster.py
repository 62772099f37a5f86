"""Leader roles on a real SQLite file, two open databases standing in for two gateways, with
short leases: one of two members plays a role, the other takes over when the holder stops
renewing, the work stops the moment the role is lost. And a Discord channel that does not
hold its intake role: it delivers all the same, and connects once it takes the role."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from discord.gateway import DiscordWebSocket
from discord.http import Route
from pydantic import SecretStr

from nanobot.bus.events import ChatRef, OutboundMessage
from nanobot.channels.base import InboxPolicy
from nanobot.channels.discord import DiscordChannel
from nanobot.cluster.roles import SCHEDULE, Cluster, LeaderRole, intake
from nanobot.config import DiscordConfig
from nanobot.errors import StoreError
from nanobot.store import Database
from nanobot.store.leases import Lease, Leases
from tests.fakes.discord import FakeDiscord
from tests.test_channel_discord import TOKEN, Recorder

LEASE = timedelta(seconds=0.3)  # tried and renewed every 0.1 s
WAIT = 5.0  # seconds an expected event may take, at most


class Work:
    """A role's work: says when it starts and when it is cancelled; runs until cancelled
    unless told to end."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.runs = 0
        self.end: BaseException | None = None
        self._ending = asyncio.Event()

    async def __call__(self) -> None:
        self.runs += 1
        self.started.set()
        try:
            await self._ending.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        if self.end is not None:
            raise self.end

    def finish(self, error: BaseException | None = None) -> None:
        self.end = error
        self._ending.set()


class Frozen(Leases):
    """The store as a frozen process sees it: once `freeze()` is called no statement comes
    back (as if the process stopped: SIGSTOP, or a network cut off)."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.frozen = asyncio.Event()

    def freeze(self) -> None:
        self.frozen.set()

    async def acquire(
        self, name: str, holder: str, ttl: timedelta, *, succeeds: str | None = None
    ) -> Lease | None:
        await self._stuck()
        return await super().acquire(name, holder, ttl, succeeds=succeeds)

    async def renew(self, lease: Lease, ttl: timedelta) -> Lease | None:
        await self._stuck()
        return await super().renew(lease, ttl)

    async def _stuck(self) -> None:
        if self.frozen.is_set():
            await asyncio.Event().wait()


class Flaky(Leases):
    """A store whose first `failures` tries to take a lease fail."""

    def __init__(self, db: Database, failures: int) -> None:
        super().__init__(db)
        self.failures = failures

    async def acquire(
        self, name: str, holder: str, ttl: timedelta, *, succeeds: str | None = None
    ) -> Lease | None:
        if self.failures:
            self.failures -= 1
            raise StoreError("state.db: disk I/O error")
        return await super().acquire(name, holder, ttl, succeeds=succeeds)


class Counting(Leases):
    """A store that says when `count` tries to take a lease were made."""

    def __init__(self, db: Database, count: int) -> None:
        super().__init__(db)
        self.count = count
        self.reached = asyncio.Event()

    async def acquire(
        self, name: str, holder: str, ttl: timedelta, *, succeeds: str | None = None
    ) -> Lease | None:
        try:
            return await super().acquire(name, holder, ttl, succeeds=succeeds)
        finally:
            self.count -= 1
            if self.count <= 0:
                self.reached.set()


@pytest.fixture
async def dbs(tmp_path: Path) -> AsyncIterator[tuple[Database, Database]]:
    async with (
        await Database.open(tmp_path / "state.db") as first,
        await Database.open(tmp_path / "state.db") as second,
    ):
        yield first, second


async def wait(event: asyncio.Event) -> None:
    async with asyncio.timeout(WAIT):
        await event.wait()


def role(leases: Leases, holder: str, **options: str) -> LeaderRole:
    return LeaderRole(leases, SCHEDULE, holder, lease=LEASE, **options)


async def test_alone_it_takes_the_role_at_once(dbs: tuple[Database, Database]) -> None:
    work, standby = Work(), asyncio.Event()
    holding = asyncio.create_task(role(Leases(dbs[0]), "a").hold(work, standby=standby.set))
    await wait(work.started)
    assert not standby.is_set()
    [lease] = await Leases(dbs[0]).all()
    assert (lease.name, lease.holder, lease.token) == (SCHEDULE, "a", 1)
    holding.cancel()
    await asyncio.wait([holding])
    assert work.cancelled.is_set()


async def test_one_of_two_plays_the_role_and_the_other_stands_by(
    dbs: tuple[Database, Database],
) -> None:
    first, second = Work(), Work()
    standby = asyncio.Event()
    a = asyncio.create_task(role(Leases(dbs[0]), "a").hold(first))
    await wait(first.started)
    tries = Counting(dbs[1], 5)
    b = asyncio.create_task(role(tries, "b").hold(second, standby=standby.set))
    await wait(standby)  # b found a holding it
    await wait(tries.reached)  # and four more of its tries were refused
    assert not second.started.is_set() and first.runs == 1
    b.cancel()
    a.cancel()
    await asyncio.wait([a, b])


async def test_another_takes_over_when_the_holder_stops_renewing(
    dbs: tuple[Database, Database], warnings: list[str]
) -> None:
    frozen = Frozen(dbs[0])
    first, second = Work(), Work()
    a = asyncio.create_task(role(frozen, "a").hold(first))
    await wait(first.started)
    b = asyncio.create_task(role(Leases(dbs[1]), "b").hold(second))
    frozen.freeze()
    await wait(first.cancelled)  # its lease could not be renewed in time: it stops
    await wait(second.started)  # and b takes over once the lease lapsed
    [lease] = await Leases(dbs[1]).all()
    assert (lease.holder, lease.token) == ("b", 2)
    assert any("lost the role schedule" in w and "could not be renewed" in w for w in warnings)
    a.cancel()
    b.cancel()
    await asyncio.wait([a, b])


async def test_the_work_stops_at_once_when_another_took_the_role(
    dbs: tuple[Database, Database], warnings: list[str]
) -> None:
    work, standby = Work(), asyncio.Event()
    holding = asyncio.create_task(role(Leases(dbs[0]), "a").hold(work, standby=standby.set))
    await wait(work.started)
    # A member whose clock is far ahead sees the lease lapsed and takes it.
    ahead = Leases(dbs[1], lambda: datetime.now(UTC) + timedelta(hours=1))
    assert await ahead.acquire(SCHEDULE, "intruder", timedelta(hours=2)) is not None
    await wait(work.cancelled)
    await wait(standby)  # it waits for the role again, and does not run meanwhile
    assert work.runs == 1
    assert any("another gateway took it" in w for w in warnings)
    holding.cancel()
    await asyncio.wait([holding])


async def test_the_role_is_taken_again_after_it_was_lost(dbs: tuple[Database, Database]) -> None:
    work = Work()
    holding = asyncio.create_task(role(Leases(dbs[0]), "a").hold(work))
    await wait(work.started)
    ahead = Leases(dbs[1], lambda: datetime.now(UTC) + timedelta(hours=1))
    taken = await ahead.acquire(SCHEDULE, "intruder", timedelta(hours=1, seconds=0.5))
    assert taken is not None
    await wait(work.cancelled)
    work.started.clear()
    await ahead.release(taken)
    await wait(work.started)  # a second holding, a second run
    assert work.runs == 2
    holding.cancel()
    await asyncio.wait([holding])


async def test_work_that_ends_or_fails_gives_the_role_up(dbs: tuple[Database, Database]) -> None:
    leases = Leases(dbs[0])
    done = Work()
    holding = asyncio.create_task(role(leases, "a").hold(done))
    await wait(done.started)
    done.finish()
    await asyncio.wait_for(holding, WAIT)
    [lease] = await leases.all()
    assert not lease.held(leases.now())

    failing = Work()
    holding = asyncio.create_task(role(leases, "a").hold(failing))
    await wait(failing.started)
    failing.finish(RuntimeError("the channel crashed"))
    with pytest.raises(RuntimeError, match="crashed"):
        await asyncio.wait_for(holding, WAIT)
    [lease] = await leases.all()
    assert not lease.held(leases.now()) and lease.token == 2


async def test_stopping_gives_the_role_up_at_once(dbs: tuple[Database, Database]) -> None:
    long = timedelta(minutes=1)  # nobody waits for it to lapse here
    first, second, standby = Work(), Work(), asyncio.Event()
    a = asyncio.create_task(LeaderRole(Leases(dbs[0]), SCHEDULE, "a", lease=long).hold(first))
    await wait(first.started)
    a.cancel()
    await asyncio.wait([a])
    assert first.cancelled.is_set()
    b = LeaderRole(Leases(dbs[1]), SCHEDULE, "b", lease=long)
    holding = asyncio.create_task(b.hold(second, standby=standby.set))
    await wait(second.started)
    assert not standby.is_set()  # taken at the first try
    holding.cancel()
    await asyncio.wait([holding])


async def test_a_restart_takes_the_role_of_the_process_it_replaces_at_once(
    dbs: tuple[Database, Database],
) -> None:
    leases = Leases(dbs[0])
    assert await leases.acquire(SCHEDULE, "killed", timedelta(hours=1)) is not None
    work, standby = Work(), asyncio.Event()
    cluster = Cluster(leases, "restarted", LEASE, succeeds="killed")
    holding = asyncio.create_task(cluster.role(SCHEDULE).hold(work, standby=standby.set))
    await wait(work.started)
    assert not standby.is_set()
    holding.cancel()
    await asyncio.wait([holding])


async def test_a_store_that_fails_is_logged_once_and_tried_again(
    dbs: tuple[Database, Database], warnings: list[str]
) -> None:
    work, standby = Work(), asyncio.Event()
    holding = asyncio.create_task(
        role(Flaky(dbs[0], failures=3), "a").hold(work, standby=standby.set)
    )
    await wait(work.started)
    assert not standby.is_set()  # failing is not standing by
    assert [e.splitlines()[0] for e in warnings] == [
        "the role schedule cannot be taken or renewed: state.db: disk I/O error; its work "
        "waits; trying again every 0.1 s (next try in 0.1 s)",  # once, then at debug
        "the store answers again for the role schedule after 0 s",
    ]
    holding.cancel()
    await asyncio.wait([holding])


def test_role_names() -> None:
    assert intake("telegram") == "intake:telegram"
    assert SCHEDULE == "schedule"


async def test_a_discord_member_without_the_role_delivers_and_connects_once_it_has_it(
    dbs: tuple[Database, Database], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Route, "BASE", Route.BASE)  # put back after the test, whatever happens
    monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", DiscordWebSocket.DEFAULT_GATEWAY)
    role = intake("discord")
    other = Leases(dbs[1])
    held = await other.acquire(role, "the other member", timedelta(minutes=1))
    assert held is not None
    async with FakeDiscord(token=TOKEN) as fake:
        ada = fake.add_user("ada")
        dm = fake.dm_channel(ada)
        config = DiscordConfig(
            enabled=True,
            token=SecretStr(TOKEN),
            api_base=fake.api_base,
            gateway_url=fake.gateway_url,
            allow_from=[str(ada)],
        )
        received = Recorder()
        channel = DiscordChannel(
            config,
            received,
            InboxPolicy(tmp_path / "inbox"),
            guild_ready_timeout=0.05,
            role=LeaderRole(Leases(dbs[0]), role, "this member", lease=LEASE),
        )
        ready = asyncio.Event()
        running = asyncio.create_task(channel.run(ready.set))
        await wait(ready)  # ready to deliver, though another member holds the connection
        await channel.deliver(OutboundMessage(ChatRef("discord", str(dm)), "sent by a standby"))
        assert [m.content for m in fake.sent(dm)] == ["sent by a standby"]
        assert fake.sessions == []  # no gateway connection

        await other.release(held)  # the other member stops: this one connects
        await fake.wait_for_ready()
        fake.user_message(dm, "now you hear me", user_id=ada)
        [message] = await received.wait()
        assert message.text == "now you hear me"
        running.cancel()
        await asyncio.wait([running])
