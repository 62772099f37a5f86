"""The budgets' tables: spend per budget and period, the holds of calls in flight, raises
and the warnings sent.

A budget is a *scope* ("install", "person:<id>", "cron", "heartbeat") and a *period*
("day:2026-12-04", "month:2026-12", in the install's time zone; the caller names them).
`reserve` is one conditional statement, run as one transaction that every other
reservation waits for (SQLite's write lock; on PostgreSQL the advisory lock `budget`, so
several members of a cluster serialise too): a call's expected cost is held against all its
budgets or none of them, and holds plus spend never pass a cap (plus its raises). Each
budget's row keeps the sum of its holds (`held`); a hold that its process never settled
(it crashed mid-call) is dropped once it expired, and the sums made again (`expire`: at
start, and every minute by each process that reserves).

Holds and settlements of concurrent calls are written together (`_Batches`): whatever
arrives while one transaction runs goes in the next, one after another in it (each
conditional statement sees the holds before it), so a thousand chats at once cost a few
transactions, not two thousand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from nanobot.store._times import to_text, wall_clock
from nanobot.store.database import Database, Row, SqlValue, Statement

LOCK = "budget"
DRIFT = 1e-9  # USD: less is rounding, from adding and taking off holds


@dataclass(frozen=True, slots=True)
class Claim:
    """A budget a call is held against: its scope, period and cap (USD, before raises)."""

    scope: str
    period: str
    cap: float


@dataclass(frozen=True, slots=True)
class Standing:
    """Where one budget stands: spent, held by calls in flight and raised (USD)."""

    scope: str
    period: str
    spent: float
    held: float
    raised: float


class _Batches:
    """Groups of statements run in one transaction (under `LOCK`) with the groups of
    every other task that arrived meanwhile: a task whose group is not yet written when
    it gets the turn writes all that waits, its own included."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._turn = asyncio.Lock()
        self._waiting: list[tuple[Sequence[Statement], asyncio.Future[list[list[Row]]]]] = []

    async def run(self, statements: Sequence[Statement]) -> list[list[Row]]:
        """Each statement's rows, as `Database.atomic` returns them.

        Raises:
            StoreError: the transaction failed (every group in it fails alike).
        """
        done: asyncio.Future[list[list[Row]]] = asyncio.get_running_loop().create_future()
        self._waiting.append((statements, done))
        async with self._turn:
            if not done.done():
                batch, self._waiting = self._waiting, []
                # Shielded: the other tasks' groups are written even if this one is
                # cancelled meanwhile (the store serialises a next batch behind it).
                await asyncio.shield(self._write(batch))
        return done.result()

    async def _write(
        self, batch: list[tuple[Sequence[Statement], asyncio.Future[list[list[Row]]]]]
    ) -> None:
        try:
            results = await self._db.atomic([s for group, _ in batch for s in group], lock=LOCK)
        except Exception as exc:  # noqa: BLE001 - every group's caller gets it
            for _, done in batch:
                if not done.done():
                    done.set_exception(exc)
            return
        start = 0
        for group, done in batch:
            done.set_result(results[start : start + len(group)])
            start += len(group)


class BudgetStore:
    """The budget tables. Every method raises `StoreError` when the database fails."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = wall_clock) -> None:
        self._db = db
        self._clock = clock
        self._batches = _Batches(db)
        self._rows: set[tuple[str, str]] = set()  # budgets whose spend row is known to exist

    async def reserve(
        self, hold: str, claims: Sequence[Claim], amount: float, lasts: timedelta
    ) -> bool:
        """Hold `amount` against every budget of `claims` for `lasts`, as hold `hold`, if
        each has room for it (spent + held + amount ≤ cap + raised, and spent + held below
        it even for an amount of 0); whether it was held
        (all or nothing). Each budget's row carries its holds' sum (`held`), so the check
        reads one row per budget, however many calls are in flight."""
        if not claims:
            return True
        now = self._clock()
        pairs = ", ".join(["(?, ?, 0, 0)"] * len(claims))
        values = ", ".join(["(?, ?, CAST(? AS DOUBLE PRECISION))"] * len(claims))
        keys: list[SqlValue] = [v for c in claims for v in (c.scope, c.period)]
        caps: list[SqlValue] = [v for c in claims for v in (c.scope, c.period, c.cap)]
        new = [(c.scope, c.period) for c in claims if (c.scope, c.period) not in self._rows]
        statements: list[Statement] = [
            (
                f"INSERT INTO budget_spend (scope, period, spent, held) VALUES {pairs}"
                " ON CONFLICT (scope, period) DO NOTHING",
                keys,
            )
        ]
        statements += [
            (
                f"WITH claim (scope, period, cap) AS (VALUES {values})"
                " INSERT INTO budget_holds (hold, scope, period, amount, expires_at)"
                " SELECT ?, c.scope, c.period, CAST(? AS DOUBLE PRECISION), ? FROM claim AS c"
                " WHERE NOT EXISTS (SELECT 1 FROM (SELECT s.spent + s.held AS used,"
                "  d.cap + coalesce((SELECT sum(r.amount) FROM budget_raises AS r"
                "   WHERE r.scope = d.scope AND r.period = d.period), 0) AS cap"
                "  FROM claim AS d JOIN budget_spend AS s"
                "  ON s.scope = d.scope AND s.period = d.period) AS b"
                # Over: no room for this call, or none left at all (a call of no known
                # price holds nothing, but a spent budget still stops it).
                "  WHERE b.used + CAST(? AS DOUBLE PRECISION) > b.cap + 1e-12"
                "  OR b.used + 1e-12 >= b.cap)"
                " RETURNING scope",
                [*caps, hold, amount, to_text(now + lasts), amount],
            ),
            (
                f"UPDATE budget_spend SET held = held + ? WHERE ({_either(len(claims))})"
                " AND EXISTS (SELECT 1 FROM budget_holds WHERE hold = ?)",
                [amount, *keys, hold],
            ),
        ]
        if not new:
            statements = statements[1:]  # every row exists: no upsert needed
        results = await self._batches.run(statements)
        self._rows.update(new)
        return bool(results[-2])

    async def settle(
        self, hold: str, charges: Sequence[tuple[str, str]], cost: float
    ) -> list[tuple[str, str, float]]:
        """Replace hold `hold` by what the call cost, charged to each (scope, period) of
        `charges`; each budget's spend after it."""
        keys: list[SqlValue] = [v for pair in charges for v in pair]
        statements: list[Statement] = []
        if charges:
            statements.append(
                (
                    "UPDATE budget_spend SET spent = spent + ?, held = held - coalesce(("
                    "SELECT h.amount FROM budget_holds AS h WHERE h.hold = ?"
                    " AND h.scope = budget_spend.scope AND h.period = budget_spend.period), 0)"
                    f" WHERE {_either(len(charges))} RETURNING scope, period, spent",
                    [cost, hold, *keys],
                )
            )
        statements.append(("DELETE FROM budget_holds WHERE hold = ?", (hold,)))
        results = await self._batches.run(statements)
        rows = results[0] if charges else []
        return [(str(r[0]), str(r[1]), float(r[2])) for r in rows]

    async def release(self, hold: str, budgets: Sequence[tuple[str, str]]) -> None:
        """Drop hold `hold` of `budgets` (its call failed or was cancelled: nothing was
        spent)."""
        await self.settle(hold, budgets, 0.0)

    async def expire(self) -> int:
        """Drop the holds that expired (their process died mid-call), and make each
        budget's `held` its live holds' sum again; how many were dropped."""
        now = to_text(self._clock())
        results = await self._db.atomic(
            [
                (
                    "UPDATE budget_spend SET held = coalesce((SELECT sum(h.amount)"
                    " FROM budget_holds AS h WHERE h.scope = budget_spend.scope"
                    " AND h.period = budget_spend.period AND h.expires_at > ?), 0)"
                    " WHERE held <> 0",
                    (now,),
                ),
                ("DELETE FROM budget_holds WHERE expires_at <= ? RETURNING hold", (now,)),
            ],
            lock=LOCK,
        )
        return len(results[1])

    async def standing(self, budgets: Sequence[tuple[str, str]]) -> list[Standing]:
        """Where each (scope, period) of `budgets` stands, in their order."""
        out = []
        for scope, period in budgets:
            row = await self._db.fetchone(
                "SELECT coalesce((SELECT spent FROM budget_spend WHERE scope = ? AND period = ?),"
                " 0), coalesce((SELECT held FROM budget_spend WHERE scope = ? AND period = ?),"
                " 0), coalesce((SELECT sum(amount) FROM budget_raises WHERE scope = ?"
                " AND period = ?), 0)",
                (scope, period, scope, period, scope, period),
            )
            assert row is not None
            held = float(row[1])
            held = held if abs(held) > DRIFT else 0.0  # sums of floats, added and taken off
            out.append(Standing(scope, period, float(row[0]), held, float(row[2])))
        return out

    async def add_raise(self, scope: str, period: str, amount: float, by: str) -> None:
        """Raise the cap of `scope` in `period` by `amount` USD, granted by `by`."""
        await self._db.execute(
            "INSERT INTO budget_raises (scope, period, amount, raised_by, raised_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (scope, period, amount, by, to_text(self._clock())),
        )

    async def warn_once(self, scope: str, period: str) -> bool:
        """Note that the warning of `scope` in `period` is sent; False when it was already
        (by this process or another)."""
        rows = await self._db.fetchall(
            "INSERT INTO budget_warnings (scope, period, warned_at) VALUES (?, ?, ?)"
            " ON CONFLICT (scope, period) DO NOTHING RETURNING scope",
            (scope, period, to_text(self._clock())),
        )
        return bool(rows)


def _either(count: int) -> str:
    """A condition true for any of `count` (scope, period) pairs, bound in order."""
    return " OR ".join(["(scope = ? AND period = ?)"] * count)
