"""Which member of a cluster answers which session, and sends which reply.

Several gateways on one database share the journal. A session's turns run on one member at a
time: the one holding its lease (a lease named `session:<key>` in `store.leases`, renewed while
held, lapsing when its holder dies). A member claims the pending messages of the sessions it
holds (`inbound.claimed_by`), and the replies it queues are its own to send
(`outbox.claimed_by`). When a member dies its leases lapse; another takes the sessions, claims
their messages and resumes their turns as a restart would, and sends the replies the dead member
left unsent.

Every change of hands is one compare-and-set statement, so two members never both hold a
session, whatever they race for.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from nanobot.store._times import from_text, to_text
from nanobot.store.database import Database, SqlValue
from nanobot.store.journal import ACCEPT, Accepted, PendingOutbox, Record, encode
from nanobot.store.leases import Leases, take, taken_params

SESSIONS: Final = "session:"
"""What the name of a session's lease begins with; the session's key follows."""

# The lease `l` of inbound row `i`'s session (looked up by the leases' names); the session
# key of lease `l`, what follows the prefix (so that the inbound rows' index on their keys
# serves a lookup from a lease); whether `l` is a session's lease at all.
_LEASE_OF = f"l.name = '{SESSIONS}' || i.session_key"
_KEY_OF = f"substr(l.name, {len(SESSIONS) + 1})"
_SESSION_LEASE = f"substr(l.name, 1, {len(SESSIONS)}) = '{SESSIONS}'"


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
        self._leases = Leases(db)
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
            f" AND NOT EXISTS (SELECT 1 FROM leases l WHERE {_LEASE_OF}"
            " AND l.holder <> ? AND l.expires_at > ?)"
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
        taken = await self._leases.acquire_all(
            [SESSIONS + key for key in session_keys], self.member, ttl, now=now
        )
        return {lease.name[len(SESSIONS) :] for lease in taken}

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
        lease, or no other member is alive (`Member.stale`) and the session is free (taken
        then, for `ttl`), and no earlier message of the session waits for another member or
        for none. None when the message was journaled before (the lease may have been
        renewed all the same).
        """
        lease, stamp = SESSIONS + session_key, to_text(now)
        taking: tuple[SqlValue, ...] = (
            lease, self.member, stamp, to_text(now + ttl),
            session_key, self.member,
            lease, self.member, stamp,
            self.member, stamp,
            *taken_params(now, self.member),
        )  # fmt: skip
        row_values: tuple[SqlValue, ...] = (
            channel, message_id, encode(message), to_text(now), session_key
        )  # fmt: skip
        if self._db.dialect.name == "postgresql":
            # One round trip: the lease taken by a data-modifying WITH, in the same statement.
            row = await self._db.fetchone(
                f"WITH lease AS ({_TAKE}) "
                + ACCEPT.format(claimed_by="(SELECT holder FROM lease)"),
                (*taking, *row_values),
            )
        else:
            async with self._db.transaction():
                held = await self._db.fetchone(_TAKE, taking)
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
        """Extend every session lease this member holds and that has not lapsed (a lapsed
        one may be another's by now, or about to be); returns how many it renewed."""
        return await self._leases.renew_all(self.member, SESSIONS, ttl, now=now)

    async def unclaim(self) -> None:
        """Hand back the pending messages this member claimed (it stopped their turns):
        any member may take them again."""
        await self._db.write(
            "UPDATE inbound SET claimed_by = NULL WHERE claimed_by = ? AND state = 'pending'",
            (self.member,),
        )

    async def release(self) -> None:
        """Give up every session lease this member holds."""
        await self._leases.release_all(self.member, SESSIONS)

    async def next_lapse(self, now: datetime) -> datetime | None:
        """When the earliest session lease another member holds lapses, of those on a
        session with pending messages: should that member have died, its session is to be
        taken then. The moment to look again."""
        row = await self._db.fetchone(
            "SELECT MIN(l.expires_at) AS lapse FROM leases l WHERE l.holder <> ?"
            f" AND l.expires_at > ? AND {_SESSION_LEASE} AND EXISTS (SELECT 1 FROM inbound i"
            f" WHERE i.session_key = {_KEY_OF} AND i.state = 'pending')",
            (self.member, to_text(now)),
        )
        return None if row is None or row["lapse"] is None else from_text(str(row["lapse"]))

    async def next_expiry(self) -> datetime | None:
        """The earliest expiry (`members.expires_at`) of another member with replies to
        send: when those replies may have to be taken over (`orphaned_replies`)."""
        row = await self._db.fetchone(
            "SELECT MIN(m.expires_at) AS expiry FROM members m WHERE m.id <> ? AND EXISTS"
            " (SELECT 1 FROM outbox o WHERE o.claimed_by = m.id AND o.state = 'pending')",
            (self.member,),
        )
        return None if row is None or row["expiry"] is None else from_text(str(row["expiry"]))

    async def orphaned_replies(self, alive: Sequence[str]) -> list[PendingOutbox]:
        """Take the unsent replies of the other members not in `alive` (dead: their
        membership expired, or they stopped without sending them), and return them, oldest
        first, to be sent by this member."""
        marks = ",".join("?" * len(alive)) or "NULL"
        rows = await self._db.fetchall(
            f"UPDATE outbox SET claimed_by = ? WHERE state = 'pending'"
            f" AND claimed_by IS NOT NULL AND claimed_by <> ? AND claimed_by NOT IN ({marks})"
            " RETURNING id, channel, message, attempts, parts_sent",
            (self.member, self.member, *alive),
        )
        found = [
            PendingOutbox(
                r["id"], r["channel"], json.loads(r["message"]), r["attempts"], r["parts_sent"]
            )
            for r in rows
        ]
        return sorted(found, key=lambda p: p.id)


# `Claims.accept`'s lease: taken (or renewed) when no earlier message of the session waits
# for another member or for none (answering this one first would break the session's
# order), and this member holds the session already or no other member is alive (alone, it
# takes what is free; in a cluster, new sessions are shared out by `candidates`).
_TAKE = take(
    "SELECT ?, ?, 1, ?, ?"
    " WHERE NOT EXISTS (SELECT 1 FROM inbound WHERE session_key = ? AND state = 'pending'"
    " AND (claimed_by IS NULL OR claimed_by <> ?))"
    " AND (EXISTS (SELECT 1 FROM leases WHERE name = ? AND holder = ? AND expires_at > ?)"
    " OR NOT EXISTS (SELECT 1 FROM members WHERE id <> ? AND expires_at > ?))"
)
