"""Which member of a cluster answers which session, and sends which reply.

Several gateways on one database share the journal. A session's turns run on one member at a
time: the one holding its lease (`session_leases`, renewed while held, lapsing when its
holder dies). A member claims the pending messages of the sessions it holds (`inbound.
claimed_by`), and the replies it queues are its own to send (`outbox.claimed_by`). When a
member dies its leases lapse; another takes the sessions, claims their messages and resumes
their turns as a restart would, and sends the replies the dead member left unsent.

Every change of hands is one compare-and-set statement, so two members never both hold a
session, whatever they race for.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from nanobot.store._times import from_text, to_text
from nanobot.store.database import Database, SqlValue
from nanobot.store.journal import ACCEPT, Accepted, PendingOutbox, Record, encode
from nanobot.store.members import STALE_AFTER


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pending message no member holds the session of (or whose holder's lease lapsed)."""

    id: int
    channel: str
    session_key: str | None  # None for a row journaled before sessions were recorded
    message: Record


@dataclass(frozen=True, slots=True)
class Claimed:
    """A pending message this member claimed."""

    id: int
    channel: str
    message: Record
    reached: bool  # its user message is in its session already: its turn was interrupted


class Claims:
    """Session leases and claims of journal and outbox rows, for member `member`."""

    def __init__(self, db: Database, member: str) -> None:
        self._db = db
        self.member = member

    async def candidates(
        self, now: datetime, limit: int, *, claimed: bool = True
    ) -> list[Candidate]:
        """Pending messages, oldest first, that this member might take: not claimed by it,
        and whose session no other member holds a live lease on.

        `claimed=False` looks only at messages nobody claimed, of sessions where no other
        member's claim waits (those are for whoever resumes that session first): far
        cheaper while many messages are being answered (an index holds just those), and
        all there is to take unless a member died or left since the last full look.
        """
        if claimed:
            where = "(i.claimed_by IS NULL OR i.claimed_by <> ?)"
            params: tuple[SqlValue, ...] = (self.member,)
        else:
            where = (
                "i.claimed_by IS NULL AND NOT EXISTS (SELECT 1 FROM inbound j"
                " WHERE j.session_key = i.session_key AND j.state = 'pending'"
                " AND j.claimed_by IS NOT NULL AND j.claimed_by <> ?)"
            )
            params = (self.member,)
        rows = await self._db.fetchall(
            f"SELECT i.id, i.channel, i.session_key, i.message FROM inbound i"
            f" WHERE i.state = 'pending' AND {where}"
            " AND NOT EXISTS (SELECT 1 FROM session_leases l"
            " WHERE l.session_key = i.session_key AND l.holder <> ? AND l.expires_at > ?)"
            " ORDER BY i.id LIMIT ?",
            (*params, self.member, to_text(now), limit),
        )
        return [
            Candidate(r["id"], r["channel"], r["session_key"], json.loads(r["message"]))
            for r in rows
        ]

    async def hold(self, session_key: str, now: datetime, ttl: timedelta) -> bool:
        """Take or renew the lease on `session_key`: True if this member holds it now (it
        was free, lapsed, or already its own)."""
        return session_key in await self.hold_all([session_key], now, ttl)

    async def hold_all(
        self, session_keys: Collection[str], now: datetime, ttl: timedelta
    ) -> set[str]:
        """Take or renew the leases on `session_keys` in one statement; returns those this
        member holds now (free, lapsed, or already its own)."""
        if not session_keys:
            return set()
        # In one order on every member: two members' statements taking overlapping sessions
        # then wait for each other in turn, and never deadlock.
        keys = sorted(set(session_keys))
        expires = to_text(now + ttl)
        rows = await self._db.fetchall(
            "INSERT INTO session_leases (session_key, holder, expires_at) VALUES "
            + ", ".join(["(?, ?, ?)"] * len(keys))
            + _LEASE_TAKEN
            + " RETURNING session_key",
            (*(v for key in keys for v in (key, self.member, expires)), to_text(now)),
        )
        return {str(r["session_key"]) for r in rows}

    async def accept(
        self,
        channel: str,
        message_id: str,
        message: Record,
        session_key: str,
        *,
        now: datetime,
        ttl: timedelta,
    ) -> Accepted | None:
        """Journal an inbound message (as `Journal.accept`) and, in the same transaction,
        claim it for this member when it may answer it at once: it holds the session's
        lease, or no other member is alive and the session is free (taken then, for `ttl`),
        and no earlier message of the session waits for another member or for none. None
        when the message was journaled before (the lease may have been renewed all the same).
        """
        alive_since = to_text(now - STALE_AFTER)
        take: tuple[SqlValue, ...] = (
            session_key, self.member, to_text(now + ttl),
            session_key, self.member,
            session_key, self.member, to_text(now),
            self.member, alive_since,
            to_text(now),
        )  # fmt: skip
        row_values: tuple[SqlValue, ...] = (
            channel, message_id, encode(message), to_text(now), session_key
        )  # fmt: skip
        if self._db.dialect.name == "postgresql":
            # One round trip: the lease taken by a data-modifying WITH, in the same statement.
            row = await self._db.fetchone(
                f"WITH lease AS ({_TAKE}) "
                + ACCEPT.format(claimed_by="(SELECT holder FROM lease)"),
                (*take, *row_values),
            )
        else:
            async with self._db.transaction():
                held = await self._db.fetchone(_TAKE, take)
                row = await self._db.fetchone(
                    ACCEPT.format(claimed_by="?"),
                    (*row_values, self.member if held is not None else None),
                )
        if row is None:
            return None
        return Accepted(int(row["id"]), here=row["claimed_by"] == self.member)

    async def claim(self, ids: Sequence[int]) -> list[Claimed]:
        """Mark pending messages `ids` as this member's; returns those it got, oldest first
        (one answered meanwhile is not among them), each saying whether its turn was
        interrupted. Call only for sessions it holds."""
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = await self._db.fetchall(
            f"UPDATE inbound SET claimed_by = ? WHERE id IN ({marks}) AND state = 'pending'"
            " RETURNING id, channel, message,"
            " EXISTS (SELECT 1 FROM entries e WHERE e.inbound_id = inbound.id) AS reached",
            (self.member, *ids),
        )
        found = [
            Claimed(r["id"], r["channel"], json.loads(r["message"]), bool(r["reached"]))
            for r in rows
        ]
        return sorted(found, key=lambda c: c.id)

    async def renew(self, now: datetime, ttl: timedelta) -> int:
        """Extend every lease this member holds and that has not lapsed (a lapsed one may be
        another's by now, or about to be); returns how many it renewed."""
        return await self._db.execute(
            "UPDATE session_leases SET expires_at = ? WHERE holder = ? AND expires_at > ?",
            (to_text(now + ttl), self.member, to_text(now)),
        )

    async def unclaim(self) -> None:
        """Hand back the pending messages this member claimed (it stopped their turns):
        any member may take them again."""
        await self._db.write(
            "UPDATE inbound SET claimed_by = NULL WHERE claimed_by = ? AND state = 'pending'",
            (self.member,),
        )

    async def release(self) -> None:
        """Give up every lease this member holds."""
        await self._db.write("DELETE FROM session_leases WHERE holder = ?", (self.member,))

    async def next_lapse(self, now: datetime) -> datetime | None:
        """When the earliest lease another member holds lapses, of those whose lapse leaves
        work behind should that member have died: a lease on a session with pending
        messages, or any lease of a member with replies to send. The moment to look again."""
        # Two looks, each one pass over the leases: asked per lease, "has its holder
        # replies to send" would scan the pending replies once per lease.
        now_text = to_text(now)
        row = await self._db.fetchone(
            "SELECT MIN(lapse) AS lapse FROM ("
            "SELECT MIN(l.expires_at) AS lapse FROM session_leases l"
            " WHERE l.holder <> ? AND l.expires_at > ? AND EXISTS (SELECT 1 FROM inbound i"
            " WHERE i.session_key = l.session_key AND i.state = 'pending')"
            " UNION ALL SELECT MIN(l.expires_at) FROM session_leases l"
            " WHERE l.holder <> ? AND l.expires_at > ? AND l.holder IN"
            " (SELECT o.claimed_by FROM outbox o WHERE o.state = 'pending')) lapses",
            (self.member, now_text, self.member, now_text),
        )
        return None if row is None or row["lapse"] is None else from_text(str(row["lapse"]))

    async def quiet_since(self) -> datetime | None:
        """The oldest latest beat (`members.beat_at`) of another member with replies to
        send: with `STALE_AFTER` added, when those replies may have to be taken over."""
        row = await self._db.fetchone(
            "SELECT MIN(m.beat_at) AS beat FROM members m WHERE m.id <> ? AND EXISTS"
            " (SELECT 1 FROM outbox o WHERE o.claimed_by = m.id AND o.state = 'pending')",
            (self.member,),
        )
        return None if row is None or row["beat"] is None else from_text(str(row["beat"]))

    async def orphaned_replies(self, alive: Sequence[str], now: datetime) -> list[PendingOutbox]:
        """Take the unsent replies of other members that are dead, and return them, oldest
        first, to be sent by this member. A member is dead when it is not in `alive` (its
        beats stopped, or it stopped without sending them), or when one of its session
        leases lapsed at `now` and it has not beaten since: a member renews all its leases
        together, so it stopped doing so a lease ago (this tells sooner than its beats)."""
        marks = ",".join("?" * len(alive)) or "NULL"
        rows = await self._db.fetchall(
            f"UPDATE outbox SET claimed_by = ? WHERE state = 'pending'"
            f" AND claimed_by IS NOT NULL AND claimed_by <> ? AND (claimed_by NOT IN ({marks})"
            " OR EXISTS (SELECT 1 FROM session_leases l WHERE l.holder = outbox.claimed_by"
            " AND l.expires_at <= ? AND NOT EXISTS (SELECT 1 FROM members m"
            " WHERE m.id = l.holder AND m.beat_at >= l.expires_at)))"
            " RETURNING id, channel, message, attempts, parts_sent",
            (self.member, self.member, *alive, to_text(now)),
        )
        found = [
            PendingOutbox(
                r["id"], r["channel"], json.loads(r["message"]), r["attempts"], r["parts_sent"]
            )
            for r in rows
        ]
        return sorted(found, key=lambda p: p.id)

    async def holders(self) -> dict[str, int]:
        """How many sessions each member holds a lease on (lapsed ones included)."""
        rows = await self._db.fetchall(
            "SELECT holder, COUNT(*) AS held FROM session_leases GROUP BY holder"
        )
        return {str(r["holder"]): int(r["held"]) for r in rows}


# A lease taken only when it is free, lapsed, or already this member's (a compare-and-set).
_LEASE_TAKEN = (
    " ON CONFLICT (session_key) DO UPDATE SET holder = excluded.holder,"
    " expires_at = excluded.expires_at"
    " WHERE session_leases.holder = excluded.holder OR session_leases.expires_at <= ?"
)

# `Claims.accept`'s lease: taken (or renewed) when no earlier message of the session waits
# for another member or for none (answering this one first would break the session's
# order), and this member holds the session already or no other member is alive (alone, it
# takes what is free; in a cluster, new sessions are shared out by `candidates`).
_TAKE = (
    "INSERT INTO session_leases (session_key, holder, expires_at) SELECT ?, ?, ?"
    " WHERE NOT EXISTS (SELECT 1 FROM inbound WHERE session_key = ? AND state = 'pending'"
    " AND (claimed_by IS NULL OR claimed_by <> ?))"
    " AND (EXISTS (SELECT 1 FROM session_leases WHERE session_key = ? AND holder = ?"
    " AND expires_at > ?) OR NOT EXISTS (SELECT 1 FROM members WHERE id <> ? AND beat_at > ?))"
    + _LEASE_TAKEN
    + " RETURNING holder"
)
