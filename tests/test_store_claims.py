"""Session leases and claims (store/claims.py), on both backends: one holder per session,
taken over once lapsed, messages claimed once, replies of dead members handed on."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nanobot.cluster.timings import ALONE
from nanobot.store import Database, Journal, NewEntry, SessionStore, migrations
from nanobot.store._times import to_text
from nanobot.store.claims import SESSIONS, Claims
from nanobot.store.leases import Leases
from nanobot.store.members import Member, Members

LEASE = timedelta(seconds=10)
T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def record(chat: str, text: str) -> dict[str, object]:
    return {
        "chat": {"channel": "telegram", "chat_id": chat},
        "sender_id": chat,
        "text": text,
        "message_id": text,
    }


async def held(db: Database, at: datetime = T0) -> dict[str, int]:
    """How many sessions each member holds at `at`."""
    return await Leases(db, clock=lambda: at).counts(SESSIONS)


async def journal(db: Database, chat: str, *texts: str) -> list[int]:
    ids = []
    for text in texts:
        row = await Journal(db).accept("telegram", text, record(chat, text), f"telegram:{chat}")
        assert row is not None
        ids.append(row)
    return ids


async def test_one_member_holds_a_session_until_its_lease_lapses(db: Database) -> None:
    a, b = Claims(db, "a"), Claims(db, "b")
    assert await a.hold("telegram:1", T0, LEASE)
    assert await a.hold("telegram:1", T0 + timedelta(seconds=5), LEASE)  # renewed: still a's
    assert not await b.hold("telegram:1", T0 + timedelta(seconds=14), LEASE)
    assert await b.hold("telegram:1", T0 + timedelta(seconds=15), LEASE)  # lapsed: b's now
    assert not await a.hold("telegram:1", T0 + timedelta(seconds=16), LEASE)
    assert await held(db, T0 + timedelta(seconds=16)) == {"b": 1}


async def test_two_members_racing_for_many_sessions_never_share_one(db: Database) -> None:
    a, b = Claims(db, "a"), Claims(db, "b")
    keys = [f"telegram:{n}" for n in range(40)]

    async def race(claims: Claims) -> set[str]:
        won = set()
        for key in keys:
            if await claims.hold(key, T0, LEASE):
                won.add(key)
        return won

    won_a, won_b = await asyncio.gather(race(a), race(b))
    assert won_a | won_b == set(keys)
    assert not won_a & won_b
    expected = {member: len(won) for member, won in (("a", won_a), ("b", won_b)) if won}
    assert await held(db) == expected


async def test_candidates_leave_out_what_another_member_holds_and_what_is_ours(
    db: Database,
) -> None:
    a, b = Claims(db, "a"), Claims(db, "b")
    one = await journal(db, "1", "m1", "m2")
    two = await journal(db, "2", "m3")
    assert [c.id for c in await b.candidates(T0, 10)] == [*one, *two]
    assert await a.hold("telegram:1", T0, LEASE)
    assert [row.id for row in await a.claim(one)] == one
    assert [c.id for c in await b.candidates(T0, 10)] == two  # a holds session 1
    assert [c.id for c in await a.candidates(T0, 10)] == two  # its own claims are taken
    # a dies: once its lease lapses, b sees session 1's messages again and may take them
    later = T0 + LEASE + timedelta(seconds=1)
    assert [c.id for c in await b.candidates(later, 10)] == [*one, *two]
    assert await b.next_lapse(T0) == T0 + LEASE
    assert await b.hold("telegram:1", later, LEASE)
    assert [row.id for row in await b.claim(one)] == one


async def test_an_answered_message_is_not_claimed(db: Database) -> None:
    a = Claims(db, "a")
    (first, second) = await journal(db, "1", "m1", "m2")
    await Journal(db).complete([first], None)
    assert [row.id for row in await a.claim([first, second])] == [second]


async def test_a_dead_members_replies_go_to_a_live_one_once(db: Database) -> None:
    dead, mine = Journal(db, member="dead"), Journal(db, member="live")
    orphan = await dead.enqueue("telegram", {"chat": {"channel": "telegram", "chat_id": "1"}})
    await mine.enqueue("telegram", {"chat": {"channel": "telegram", "chat_id": "2"}})
    await Journal(db).enqueue("telegram", {"chat": {"channel": "telegram", "chat_id": "3"}})
    live = Claims(db, "live")
    assert [item.id for item in await live.orphaned_replies(["live"])] == [orphan]
    assert await live.orphaned_replies(["live"]) == []  # now its own


async def test_a_member_whose_membership_expired_leaves_its_replies(db: Database) -> None:
    """The one rule of liveness: alive until its row expires (its leases do not come into
    it: in a cluster a member lives exactly as long as they hold, `cluster.timings`)."""
    members = {
        name: replace(Member.new(T0, lifetime=LEASE), id=name) for name in ("dead", "slow", "live")
    }
    for member in members.values():
        await Members(db, clock=lambda: T0).register(member)
    reply = {"chat": {"channel": "telegram", "chat_id": "1"}}
    orphan = await Journal(db, member="dead").enqueue("telegram", reply)
    slowed = await Journal(db, member="slow").enqueue("telegram", reply)
    await Journal(db, member="live").enqueue("telegram", reply)
    live = Claims(db, "live")
    assert await live.next_expiry() == T0 + LEASE  # the others' replies are watched
    # "slow" and "live" beat half a lease later; "dead" does not
    for name in ("slow", "live"):
        await Members(db, clock=lambda: T0 + LEASE / 2).beat(members[name])
    assert await live.next_expiry() == T0 + LEASE  # still dead's
    rows = await Members(db).all()
    alive = [m.id for m in rows if not m.stale(T0 + LEASE)]
    assert sorted(alive) == ["live", "slow"]
    assert [m.id for m in rows if m.stale(T0 + LEASE - timedelta(microseconds=1))] == []
    assert [item.id for item in await live.orphaned_replies(alive)] == [orphan]
    assert await live.orphaned_replies(alive) == []  # now its own
    assert await live.next_expiry() == T0 + LEASE * 1.5  # slow's, with replies left
    # Later "slow" is not alive any more; "live" takes its reply, never its own again.
    taken = await live.orphaned_replies(["someone"])
    assert [item.id for item in taken] == [slowed]
    assert await live.next_expiry() is None  # nobody else has replies to send


async def test_leaving_gives_every_session_up(db: Database) -> None:
    a, b = Claims(db, "a"), Claims(db, "b")
    for key in ("telegram:1", "telegram:2"):
        assert await a.hold(key, T0, LEASE)
    assert await a.renew(T0 + timedelta(seconds=5), LEASE) == 2
    assert not await b.hold("telegram:1", T0 + timedelta(seconds=6), LEASE)
    await a.release()
    assert await b.hold("telegram:1", T0 + timedelta(seconds=6), LEASE)
    assert await b.hold("telegram:2", T0 + timedelta(seconds=6), LEASE)
    assert await held(db, T0 + timedelta(seconds=6)) == {"b": 2}


async def accept(claims: Claims, chat: str, text: str, now: datetime = T0) -> tuple[int, bool]:
    """`text` in chat `chat`, journaled by `claims`' member; its row and whether it took it."""
    key = f"telegram:{chat}"
    accepted = await claims.accept("telegram", text, record(chat, text), key, now=now, ttl=LEASE)
    assert accepted is not None
    return accepted.id, accepted.here


async def register(db: Database, name: str, beat: datetime = T0) -> None:
    await Members(db, clock=lambda: beat).register(
        replace(Member.new(beat, lifetime=ALONE), id=name)
    )


async def test_a_member_alone_takes_a_free_session_as_it_journals_a_message(db: Database) -> None:
    a, b = Claims(db, "a"), Claims(db, "b")
    await register(db, "a")
    await register(db, "b", T0 - ALONE - timedelta(seconds=1))  # dead long ago
    first, here = await accept(a, "1", "m1")
    assert here
    assert await held(db) == {"a": 1}
    assert await a.candidates(T0, 10) == []  # claimed already: nothing left to take
    assert await b.candidates(T0, 10) == []  # a holds the session
    assert (
        await a.accept("telegram", "m1", record("1", "m1"), "telegram:1", now=T0, ttl=LEASE) is None
    )
    later = T0 + timedelta(seconds=5)
    second, here = await accept(a, "1", "m2", later)
    assert here and second > first
    assert not await b.hold("telegram:1", T0 + LEASE + timedelta(seconds=1), LEASE)  # renewed


async def test_in_a_cluster_a_member_takes_at_once_only_a_session_it_holds(db: Database) -> None:
    a, b = Claims(db, "a"), Claims(db, "b")
    await register(db, "a")
    await register(db, "b")
    first, here = await accept(a, "1", "m1")
    assert not here  # a new session is shared out through the candidates
    assert await held(db) == {}
    assert [c.id for c in await b.candidates(T0, 10)] == [first]
    assert await a.hold("telegram:1", T0, LEASE)
    # m1 waits for nobody's claim yet: answering m2 first would break the session's order
    second, here = await accept(a, "1", "m2")
    assert not here
    assert [c.id for c in await a.claim([first, second])] == [first, second]
    _, here = await accept(a, "1", "m3")
    assert here
    # b holds session 2: a journals its message for b, and takes nothing
    assert await b.hold("telegram:2", T0, LEASE)
    fourth, here = await accept(a, "2", "m4")
    assert not here
    assert await held(db) == {"a": 1, "b": 1}
    assert [c.id for c in await b.candidates(T0, 10)] == [fourth]


async def claimed_by_the_dead(db: Database) -> int:
    """Message m1 of chat 1, claimed by member "dead", whose lease on it lapses at T0 + LEASE."""
    dead = Claims(db, "dead")
    assert await dead.hold("telegram:1", T0, LEASE)
    (first,) = await journal(db, "1", "m1")
    assert [c.id for c in await dead.claim([first])] == [first]
    return first


async def test_a_member_alone_leaves_a_session_whose_earlier_message_another_claimed(
    db: Database,
) -> None:
    a = Claims(db, "a")
    first = await claimed_by_the_dead(db)
    lapsed = T0 + LEASE
    second, here = await accept(a, "1", "m2", lapsed)
    assert not here  # m1's turn is to be resumed first, by whoever takes the session
    assert [c.id for c in await a.candidates(lapsed, 10)] == [first, second]


async def test_leases_are_taken_many_at_once_and_only_where_free(db: Database) -> None:
    a, b = Claims(db, "a"), Claims(db, "b")
    assert await b.hold("telegram:2", T0, LEASE)
    assert await b.hold("telegram:3", T0 - LEASE, LEASE)  # lapsed at T0
    assert await a.hold("telegram:4", T0, LEASE)
    keys = ["telegram:1", "telegram:2", "telegram:3", "telegram:4"]
    assert await a.hold_all(keys, T0, LEASE) == {"telegram:1", "telegram:3", "telegram:4"}
    assert await held(db) == {"a": 3, "b": 1}
    assert await a.hold_all([], T0, LEASE) == set()


async def test_two_members_taking_overlapping_sessions_at_once_never_share_one(
    db: Database,
) -> None:
    a, b = Claims(db, "a"), Claims(db, "b")
    keys = [f"telegram:{n}" for n in range(60)]
    won_a, won_b = set(), set()
    for start in range(0, 60, 12):  # each a batch, the other's reversed
        batch = keys[start : start + 20]
        got_a, got_b = await asyncio.gather(
            a.hold_all(batch, T0, LEASE), b.hold_all(batch[::-1], T0, LEASE)
        )
        won_a |= got_a
        won_b |= got_b
    assert won_a | won_b == set(keys)
    assert not won_a & won_b


async def test_a_claimed_message_says_whether_its_turn_was_interrupted(db: Database) -> None:
    a = Claims(db, "a")
    first, second = await journal(db, "1", "m1", "m2")
    sessions = SessionStore(db)
    session = await sessions.live("telegram:1")
    user = NewEntry("message", {"role": "user", "content": "m1"}, inbound_id=first)
    await sessions.append(session, [user])
    assert await a.hold("telegram:1", T0, LEASE)
    claimed = await a.claim([second, first])
    assert [(c.id, c.reached) for c in claimed] == [(first, True), (second, False)]
    assert claimed[0].message == record("1", "m1")


async def test_the_quick_look_finds_only_what_nobody_claimed_nor_waits_behind_a_claim(
    db: Database,
) -> None:
    a = Claims(db, "a")
    first = await claimed_by_the_dead(db)
    (behind,) = await journal(db, "1", "m2")  # waits behind dead's claim of m1
    assert await a.hold("telegram:2", T0, LEASE)
    (own,) = await journal(db, "2", "m3")
    (free,) = await journal(db, "3", "m4")
    lapsed = T0 + LEASE
    assert [c.id for c in await a.candidates(lapsed, 10, claimed=False)] == [own, free]
    # the full look also sees the lapsed session, its claimed message first
    assert [c.id for c in await a.candidates(lapsed, 10)] == [first, behind, own, free]


async def test_a_member_that_lost_its_session_queues_no_reply(db: Database) -> None:
    # a's turn ran while it had lost the store; b took the session over and claimed the
    # message. a's answer, arriving late, is refused: b's is the one that counts, once.
    [first] = await journal(db, "7", "late")
    a, b = Claims(db, "a"), Claims(db, "b")
    assert await a.hold("telegram:7", T0, LEASE) and await a.claim([first])
    assert await b.hold("telegram:7", T0 + LEASE + timedelta(seconds=1), LEASE)
    assert await b.claim([first])
    reply = ("telegram", record("7", "an answer"))
    assert await Journal(db, member="a").complete([first], reply) is None
    assert await Journal(db, member="b").complete([first], reply) is not None
    assert await Journal(db, member="b").complete([first], reply) is None  # answered
    outbox = await db.fetchall("SELECT claimed_by FROM outbox")
    assert [row["claimed_by"] for row in outbox] == ["b"]


async def test_answers_written_together_queue_only_those_still_ours(db: Database) -> None:
    ours, theirs = await journal(db, "8", "ours", "theirs")
    mine = Claims(db, "a")
    assert await mine.claim([ours]) and await Claims(db, "b").claim([theirs])
    journal_a = Journal(db, member="a")
    reply = ("telegram", record("8", "an answer"))
    queued = await asyncio.gather(
        journal_a.complete([ours], reply),
        journal_a.complete([theirs], reply),
        journal_a.complete([], reply),  # a reply that answers no message (a notice)
    )
    assert queued[0] is not None and queued[1] is None and queued[2] is not None
    states = await db.fetchall("SELECT id, state FROM inbound ORDER BY id")
    assert [row["state"] for row in states] == ["done", "pending"]


async def test_session_leases_and_members_from_before_the_one_lease_carry_over(
    tmp_path: Path,
) -> None:
    """Schema 19 kept session leases in a table of their own, with no token, and members
    with no expiry: a lease held then is held after the upgrade, by its holder, until its
    expiry; a member row from then is expired (its process runs an older version)."""
    path = tmp_path / "state.db"
    until = to_text(datetime.now(UTC) + LEASE)
    with closing(sqlite3.connect(path)) as conn:
        for version, script in enumerate(migrations.MIGRATIONS[:19], start=1):
            conn.executescript(script)
            conn.execute(f"PRAGMA user_version = {version}")
        conn.execute(
            "INSERT INTO session_leases (session_key, holder, expires_at) VALUES (?, ?, ?)",
            ("telegram:1", "old", until),
        )
        conn.execute(
            "INSERT INTO members (id, host, pid, version, started_at, beat_at)"
            " VALUES ('old', 'box', 7, '0.9', ?, ?)",
            (to_text(T0), to_text(T0)),
        )
        conn.commit()
    async with await Database.open(path) as db:
        assert await held(db, datetime.now(UTC)) == {"old": 1}
        assert not await Claims(db, "new").hold("telegram:1", datetime.now(UTC), LEASE)
        [lease] = await Leases(db).all()
        assert (lease.name, lease.token, to_text(lease.expires_at)) == (
            "session:telegram:1",
            1,
            until,
        )
        [member] = await Members(db).all()
        assert member.expires_at == member.beat_at == T0 and member.stale(T0)
