"""The leases table on each backend, with the store's clock moved by the test; two open
databases on one state stand in for two processes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nanobot.store import Database
from nanobot.store.leases import Lease, Leases
from tests._clock import Clock

T0 = datetime(2026, 6, 15, 9, 0, tzinfo=UTC)
TTL = timedelta(seconds=10)
ROLE = "intake:telegram"


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def leases(db: Database, clock: Clock) -> Leases:
    return Leases(db, clock)


async def test_a_free_lease_is_taken_and_held_until_it_expires(
    leases: Leases, clock: Clock
) -> None:
    lease = await leases.acquire(ROLE, "a", TTL)
    assert lease == Lease(ROLE, "a", 1, acquired_at=T0, expires_at=T0 + TTL)
    assert lease.held(T0 + TTL - timedelta(microseconds=1))
    assert not lease.held(T0 + TTL)
    assert await leases.acquire(ROLE, "b", TTL) is None
    assert await leases.all() == [lease]


async def test_the_holder_takes_it_again_as_the_same_holding(leases: Leases, clock: Clock) -> None:
    await leases.acquire(ROLE, "a", TTL)
    clock.time += timedelta(seconds=3)
    again = await leases.acquire(ROLE, "a", TTL)
    assert again == Lease(ROLE, "a", 1, acquired_at=T0, expires_at=clock.time + TTL)


async def test_renewing_keeps_it_past_its_first_expiry(leases: Leases, clock: Clock) -> None:
    lease = await leases.acquire(ROLE, "a", TTL)
    assert lease is not None
    clock.time += timedelta(seconds=9)
    renewed = await leases.renew(lease, TTL)
    assert renewed == Lease(ROLE, "a", 1, acquired_at=T0, expires_at=clock.time + TTL)
    clock.time += timedelta(seconds=9)  # past the first expiry, not the renewed one
    assert await leases.acquire(ROLE, "b", TTL) is None


async def test_a_lapsed_lease_is_taken_by_another_with_a_greater_token(
    leases: Leases, clock: Clock
) -> None:
    lease = await leases.acquire(ROLE, "a", TTL)
    assert lease is not None
    clock.time += TTL  # at its expiry it is free
    taken = await leases.acquire(ROLE, "b", TTL)
    assert taken == Lease(ROLE, "b", 2, acquired_at=clock.time, expires_at=clock.time + TTL)
    # The holder that stalled cannot renew it, nor take it back while it is held.
    assert await leases.renew(lease, TTL) is None
    assert await leases.acquire(ROLE, "a", TTL) is None
    assert await leases.release(lease) is False
    assert await leases.all() == [taken]


async def test_a_lapsed_lease_nobody_took_is_renewed_by_its_holder(
    leases: Leases, clock: Clock
) -> None:
    lease = await leases.acquire(ROLE, "a", TTL)
    assert lease is not None
    clock.time += 2 * TTL
    renewed = await leases.renew(lease, TTL)
    assert renewed is not None and renewed.token == 1 and renewed.expires_at == clock.time + TTL


async def test_taking_back_ones_own_lapsed_lease_is_a_new_holding(
    leases: Leases, clock: Clock
) -> None:
    first = await leases.acquire(ROLE, "a", TTL)
    assert first is not None
    clock.time += TTL
    second = await leases.acquire(ROLE, "a", TTL)
    assert second == Lease(ROLE, "a", 2, acquired_at=clock.time, expires_at=clock.time + TTL)
    assert await leases.renew(first, TTL) is None  # the old holding is over


async def test_release_frees_it_at_once_and_only_by_its_holding(
    leases: Leases, clock: Clock
) -> None:
    lease = await leases.acquire(ROLE, "a", TTL)
    assert lease is not None
    impostor = Lease(ROLE, "b", lease.token, lease.acquired_at, lease.expires_at)
    assert await leases.release(impostor) is False
    assert await leases.acquire(ROLE, "b", TTL) is None
    assert await leases.release(lease) is True
    assert not (await leases.all())[0].held(clock.time)
    taken = await leases.acquire(ROLE, "b", TTL)
    assert taken is not None and taken.token == 2
    assert await leases.renew(lease, TTL) is None


async def test_a_lease_of_a_holder_known_to_be_gone_is_taken_at_once(leases: Leases) -> None:
    await leases.acquire(ROLE, "dead", TTL)
    assert await leases.acquire(ROLE, "new", TTL, succeeds="someone else") is None
    taken = await leases.acquire(ROLE, "new", TTL, succeeds="dead")
    assert taken is not None and (taken.holder, taken.token) == ("new", 2)


async def test_holders_lists_what_each_holds_now(leases: Leases, clock: Clock) -> None:
    assert await leases.holders() == {}
    await leases.acquire("schedule", "a", TTL)
    await leases.acquire(ROLE, "a", TTL)
    await leases.acquire("intake:discord", "b", 2 * TTL)
    assert await leases.holders() == {"a": ["intake:telegram", "schedule"], "b": ["intake:discord"]}
    clock.time += TTL
    assert await leases.holders() == {"b": ["intake:discord"]}


async def test_many_are_taken_renewed_and_released_in_one_statement_each(
    leases: Leases, clock: Clock
) -> None:
    await leases.acquire("session:2", "b", TTL)
    await leases.acquire("session:3", "b", TTL)
    await leases.release((await leases.all())[-1])  # b gives session:3 up
    await leases.acquire("session:4", "a", TTL)
    names = ["session:4", "session:1", "session:2", "session:3", "session:1"]
    taken = await leases.acquire_all(names, "a", TTL)
    assert [(lease.name, lease.token) for lease in taken] == [
        ("session:1", 1),
        ("session:3", 2),  # a new holding, after b's
        ("session:4", 1),  # a's already: the same holding, extended
    ]
    assert await leases.acquire_all([], "a", TTL) == []
    await leases.acquire("schedule", "a", TTL)
    clock.time += TTL / 2
    assert await leases.renew_all("a", "session:", TTL) == 3  # not its role
    assert await leases.counts("session:") == {"a": 3, "b": 1}
    clock.time += TTL / 2
    assert await leases.holders() == {"a": ["session:1", "session:3", "session:4"]}
    assert await leases.holders(besides="session:") == {}  # the role lapsed
    assert await leases.release_all("a", "session:") == 3
    assert await leases.counts("session:") == {}
    again = await leases.acquire_all(["session:1"], "b", TTL)
    assert [(lease.holder, lease.token) for lease in again] == [("b", 2)]


async def test_a_prefix_is_matched_as_written(leases: Leases) -> None:
    """Names are compared by their beginning, not by a pattern: `_` and `%` are letters."""
    await leases.acquire("session:a_b", "a", TTL)
    await leases.acquire("sessionXa", "a", TTL)
    await leases.acquire("s%", "a", TTL)
    assert await leases.counts("session:") == {"a": 1}
    assert await leases.counts("s%") == {"a": 1}
    assert await leases.renew_all("a", "session:a_", TTL) == 1


async def test_leases_are_independent(leases: Leases) -> None:
    assert await leases.acquire("schedule", "a", TTL) is not None
    assert await leases.acquire(ROLE, "b", TTL) is not None


async def test_two_processes_racing_for_a_lease_never_both_get_it(
    store_target: Path | str, db: Database, clock: Clock
) -> None:
    async with await Database.open(store_target) as other:
        stores = [Leases(db, clock), Leases(other, clock)]
        tokens: list[int] = []
        for round_ in range(15):
            clock.time += TTL  # whoever held it lapsed
            contenders = [f"{side}{n}" for side in "xy" for n in range(3)]
            won = await asyncio.gather(
                *(stores[i % 2].acquire(ROLE, holder, TTL) for i, holder in enumerate(contenders))
            )
            winners = [lease for lease in won if lease is not None]
            assert len(winners) == 1, (round_, winners)
            tokens.append(winners[0].token)
            assert await stores[1].all() == winners
        assert tokens == list(range(1, 16))  # one new holding per round, never a token again


async def test_renewal_and_takeover_racing_at_expiry_leave_one_holder(
    store_target: Path | str, db: Database, clock: Clock
) -> None:
    async with await Database.open(store_target) as other:
        mine, theirs = Leases(db, clock), Leases(other, clock)
        for _ in range(10):
            lease = await mine.acquire(ROLE, "a", TTL)
            if lease is None:  # "b" won the last round: let it lapse
                clock.time += TTL
                lease = await mine.acquire(ROLE, "a", TTL)
            assert lease is not None
            clock.time = lease.expires_at
            renewed, taken = await asyncio.gather(
                mine.renew(lease, TTL), theirs.acquire(ROLE, "b", TTL)
            )
            assert (renewed is None) != (taken is None), (renewed, taken)
            [row] = await theirs.all()
            assert row == (renewed or taken)
