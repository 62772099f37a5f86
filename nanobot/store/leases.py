"""Leases: what one member of a cluster does at a time, held for a while and renewed.

A lease is a named row saying which member holds it and until when: a role
("intake:telegram", "schedule", `nanobot.cluster.roles`) or a session ("session:<key>",
`store.claims`), the one primitive for both. A member takes one that is free (never held,
released, or lapsed: its holder stopped renewing it) or its own; it keeps it by renewing it
well before it lapses, and releases it when it stops. Each statement is one compare-and-set,
so two members racing for a lease never both get it, on SQLite (one writer at a time) and on
PostgreSQL alike (`INSERT … ON CONFLICT DO UPDATE … WHERE` re-checks the row it locked).
Leases are taken, renewed and released one by one or in batches (a member's thousand
sessions in one statement).

Every new holding gets a `token` greater than every earlier one of that lease (a fencing
token): a holder that stalled and lost the lease can be told from the one that has it now.

Moments come from the clock given to `Leases` (the wall clock by default) and are compared
as the database keeps them, in UTC: in a cluster the hosts' clocks must agree to well
within a lease's length.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from nanobot.store._times import from_text, to_text, wall_clock
from nanobot.store.database import Database, Row, SqlValue

_COLUMNS: Final = "name, holder, token, acquired_at, expires_at"
_LAPSED: Final = to_text(datetime(1970, 1, 1, tzinfo=UTC))  # a released lease's expiry
_NAMED: Final = "substr(name, 1, ?) = ?"  # a name that begins with a prefix (no LIKE escapes)
# Whether the row's holding goes on (the holder takes its own lease again, before it lapsed).
_ONGOING: Final = "leases.holder = excluded.holder AND leases.expires_at > ?"


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
        taken = await self.acquire_all([name], holder, ttl, succeeds=succeeds)
        return taken[0] if taken else None

    async def acquire_all(
        self,
        names: Collection[str],
        holder: str,
        ttl: timedelta,
        *,
        succeeds: str | None = None,
        now: datetime | None = None,
    ) -> list[Lease]:
        """Take each of the leases `names` as `acquire` would, in one statement; returns
        those `holder` holds now, by name (the others are another's). `now`, here and in
        the batched methods below, is the moment to judge by where the caller carries its
        own (`Claims`); the store's clock otherwise."""
        if not names:
            return []
        # In one order on every member: two statements taking overlapping leases then wait
        # for each other in turn, and never deadlock.
        ordered = sorted(set(names))
        now = now or self._clock()
        stamp, until = to_text(now), to_text(now + ttl)
        rows = await self._db.fetchall(
            take(", ".join(["(?, ?, 1, ?, ?)"] * len(ordered)), values=True),
            (
                *(v for name in ordered for v in (name, holder, stamp, until)),
                *taken_params(now, succeeds or holder),
            ),
        )
        return sorted((_lease(row) for row in rows), key=lambda lease: lease.name)

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

    async def renew_all(
        self, holder: str, prefix: str, ttl: timedelta, *, now: datetime | None = None
    ) -> int:
        """Extend to `ttl` from now every lease named `prefix…` that `holder` holds and
        that has not lapsed (a lapsed one may be another's by now, or about to be), in one
        statement; returns how many."""
        now = now or self._clock()
        return await self._db.execute(
            f"UPDATE leases SET expires_at = ? WHERE holder = ? AND {_NAMED} AND expires_at > ?",
            (to_text(now + ttl), holder, len(prefix), prefix, to_text(now)),
        )

    async def release_all(self, holder: str, prefix: str) -> int:
        """Give up every lease named `prefix…` that `holder` holds; returns how many."""
        return await self._db.execute(
            f"UPDATE leases SET expires_at = ? WHERE holder = ? AND {_NAMED} AND expires_at > ?",
            (_LAPSED, holder, len(prefix), prefix, _LAPSED),
        )

    async def all(self) -> list[Lease]:
        """Every lease, held or not, by name (see `Lease.held`)."""
        rows = await self._db.fetchall(f"SELECT {_COLUMNS} FROM leases ORDER BY name")
        return [_lease(row) for row in rows]

    async def holders(self, *, besides: str | None = None) -> dict[str, list[str]]:
        """The leases held now, by holder: holder → the names it holds, sorted; without
        those named `besides…` when given (a kind held by the thousand, see `counts`)."""
        where = "expires_at > ?"
        params: list[SqlValue] = [to_text(self._clock())]
        if besides is not None:
            where += f" AND NOT {_NAMED}"
            params += [len(besides), besides]
        rows = await self._db.fetchall(
            f"SELECT name, holder FROM leases WHERE {where} ORDER BY name", tuple(params)
        )
        held: dict[str, list[str]] = {}
        for row in rows:
            held.setdefault(str(row["holder"]), []).append(str(row["name"]))
        return held

    async def counts(self, prefix: str) -> dict[str, int]:
        """How many leases named `prefix…` each holder holds now."""
        rows = await self._db.fetchall(
            f"SELECT holder, COUNT(*) AS held FROM leases WHERE {_NAMED} AND expires_at > ?"
            " GROUP BY holder",
            (len(prefix), prefix, to_text(self._clock())),
        )
        return {str(row["holder"]): int(row["held"]) for row in rows}


def _lease(row: Row) -> Lease:
    return Lease(
        name=str(row["name"]),
        holder=str(row["holder"]),
        token=int(row["token"]),
        acquired_at=from_text(row["acquired_at"]),
        expires_at=from_text(row["expires_at"]),
    )


def take(rows: str, *, values: bool = False) -> str:
    """The statement that takes leases: `rows` gives (name, holder, 1, acquired_at,
    expires_at) for each lease to take, as `VALUES` tuples (`values`) or a `SELECT … WHERE`;
    each is taken where it is free, lapsed, already its holder's or held by the one given
    last in `taken_params`, and the leases taken are returned (`RETURNING` the columns).
    Bind the rows' parameters, then `taken_params`. Other stores take leases within their
    own statements with it (`Claims.accept`)."""
    return (
        f"INSERT INTO leases ({_COLUMNS}) {'VALUES ' if values else ''}{rows}"
        " ON CONFLICT (name) DO UPDATE SET"
        f" token = CASE WHEN {_ONGOING} THEN leases.token ELSE leases.token + 1 END,"
        f" acquired_at = CASE WHEN {_ONGOING} THEN leases.acquired_at"
        " ELSE excluded.acquired_at END,"
        " holder = excluded.holder, expires_at = excluded.expires_at"
        " WHERE leases.expires_at <= ? OR leases.holder = excluded.holder OR leases.holder = ?"
        f" RETURNING {_COLUMNS}"
    )


def taken_params(now: datetime, succeeds: str) -> tuple[str, str, str, str]:
    """The parameters `take` binds after its rows': the moment, and a holder whose leases
    may be taken over (the holder itself where there is none)."""
    stamp = to_text(now)
    return (stamp, stamp, stamp, succeeds)
