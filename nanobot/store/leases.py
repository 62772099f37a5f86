"""Leases: what one member of a cluster does at a time, held for a while and renewed.

A lease is a named row (the role it stands for: "intake:telegram", "schedule", …) saying
which member holds it and until when. A member takes one that is free (never held, released,
or lapsed: its holder stopped renewing it) or its own; it keeps it by renewing it well
before it lapses, and releases it when it stops. Each statement is one compare-and-set, so
two members racing for a lease never both get it, on SQLite (one writer at a time) and on
PostgreSQL alike (`INSERT … ON CONFLICT DO UPDATE … WHERE` re-checks the row it locked).

Every new holding gets a `token` greater than every earlier one of that lease (a fencing
token): a holder that stalled and lost the lease can be told from the one that has it now.

Moments come from the clock given to `Leases` (the wall clock by default) and are compared
as the database keeps them, in UTC: in a cluster the hosts' clocks must agree to well
within a lease's length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from nanobot.store._times import from_text, to_text, wall_clock
from nanobot.store.database import Database, Row

_COLUMNS: Final = "name, holder, token, acquired_at, expires_at"
_LAPSED: Final = to_text(datetime(1970, 1, 1, tzinfo=UTC))  # a released lease's expiry


@dataclass(frozen=True, slots=True)
class Lease:
    """One lease, as its row says."""

    name: str
    holder: str
    token: int  # grows with each new holding of this lease: a fencing token
    acquired_at: datetime  # when this holding began (renewals keep it)
    expires_at: datetime

    def held(self, now: datetime) -> bool:
        """Whether it is still held at `now` (released and lapsed leases are not)."""
        return now < self.expires_at


class Leases:
    """The leases table. Every method raises `StoreError` when the database fails."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = wall_clock) -> None:
        """`clock` gives the aware moment leases are stamped with and judged against."""
        self._db = db
        self._clock = clock

    def now(self) -> datetime:
        """The moment by this store's clock (for `Lease.held`)."""
        return self._clock()

    async def acquire(
        self, name: str, holder: str, ttl: timedelta, *, succeeds: str | None = None
    ) -> Lease | None:
        """Take the lease `name` for `holder` until `ttl` from now, if it is free (never
        held, released or lapsed), already `holder`'s, or held by `succeeds` (a holder
        known to have ended, such as the previous process on this data dir); None if
        another holds it.

        Taking a lease that was not held by `holder` a moment ago starts a new holding: a
        greater `token`, and `acquired_at` now. Taking one `holder` still holds extends it,
        like `renew`.
        """
        now = self._clock()
        stamp, until = to_text(now), to_text(now + ttl)
        ongoing = "leases.holder = excluded.holder AND leases.expires_at > ?"
        row = await self._db.fetchone(
            f"INSERT INTO leases ({_COLUMNS}) VALUES (?, ?, 1, ?, ?)"
            " ON CONFLICT (name) DO UPDATE SET"
            f" token = CASE WHEN {ongoing} THEN leases.token ELSE leases.token + 1 END,"
            f" acquired_at = CASE WHEN {ongoing} THEN leases.acquired_at"
            " ELSE excluded.acquired_at END,"
            " holder = excluded.holder, expires_at = excluded.expires_at"
            " WHERE leases.expires_at <= ? OR leases.holder = ? OR leases.holder = ?"
            f" RETURNING {_COLUMNS}",
            (name, holder, stamp, until, stamp, stamp, stamp, holder, succeeds or holder),
        )
        return _lease(row) if row is not None else None

    async def renew(self, lease: Lease, ttl: timedelta) -> Lease | None:
        """Extend `lease` to `ttl` from now; None if it is no longer this holding (another
        took it after it lapsed, or it was released). A holding that lapsed but that nobody
        took since is extended: nobody else held it meanwhile."""
        row = await self._db.fetchone(
            "UPDATE leases SET expires_at = ? WHERE name = ? AND holder = ? AND token = ?"
            f" RETURNING {_COLUMNS}",
            (to_text(self._clock() + ttl), lease.name, lease.holder, lease.token),
        )
        return _lease(row) if row is not None else None

    async def release(self, lease: Lease) -> bool:
        """Give `lease` up at once, so another may take it; False if it was no longer this
        holding (nothing changed). The row stays, keeping the token counting up."""
        changed = await self._db.execute(
            "UPDATE leases SET expires_at = ? WHERE name = ? AND holder = ? AND token = ?",
            (_LAPSED, lease.name, lease.holder, lease.token),
        )
        return changed > 0

    async def all(self) -> list[Lease]:
        """Every lease, held or not, by name (see `Lease.held`)."""
        rows = await self._db.fetchall(f"SELECT {_COLUMNS} FROM leases ORDER BY name")
        return [_lease(row) for row in rows]

    async def holders(self) -> dict[str, list[str]]:
        """The leases held now, by holder: holder → the names it holds, sorted."""
        now = self._clock()
        held: dict[str, list[str]] = {}
        for lease in await self.all():
            if lease.held(now):
                held.setdefault(lease.holder, []).append(lease.name)
        return held


def _lease(row: Row) -> Lease:
    return Lease(
        name=str(row["name"]),
        holder=str(row["holder"]),
        token=int(row["token"]),
        acquired_at=from_text(row["acquired_at"]),
        expires_at=from_text(row["expires_at"]),
    )
