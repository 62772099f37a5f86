"""The budgets' tables: spend per budget and period, the holds of calls in flight, raises
and the warnings sent.

A budget is a *scope* ("install", "person:<id>", "cron", "heartbeat") and a *period*
("day:2026-12-04", "month:2026-12", in the install's time zone; the caller names them).
`reserve` is one conditional statement, run as one transaction that every other
reservation waits for (SQLite's write lock; on PostgreSQL the advisory lock `budget`, so
several members of a cluster serialise too): a call's expected cost is held against all its
budgets or none of them, and holds plus spend never pass a cap (plus its raises). A hold
counts only until it expires: the process that made it settles or releases it well before,
and one that crashed leaks nothing for longer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from nanobot.store._times import to_text, wall_clock
from nanobot.store.database import Database, SqlValue, Statement

LOCK = "budget"


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


class BudgetStore:
    """The budget tables. Every method raises `StoreError` when the database fails."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = wall_clock) -> None:
        self._db = db
        self._clock = clock

    async def reserve(
        self, hold: str, claims: Sequence[Claim], amount: float, lasts: timedelta
    ) -> bool:
        """Hold `amount` against every budget of `claims` for `lasts`, as hold `hold`, if
        each has room for it (spent + held + amount ≤ cap + raised); whether it was held
        (all or nothing)."""
        if not claims:
            return True
        now = self._clock()
        values = ", ".join(["(?, ?, CAST(? AS DOUBLE PRECISION))"] * len(claims))
        params: list[SqlValue] = [v for c in claims for v in (c.scope, c.period, c.cap)]
        now_text = to_text(now)
        sql = (
            f"WITH claim (scope, period, cap) AS (VALUES {values}), used AS ("
            " SELECT c.scope, c.period, c.cap"
            " + coalesce((SELECT sum(r.amount) FROM budget_raises AS r"
            "    WHERE r.scope = c.scope AND r.period = c.period), 0) AS cap,"
            " coalesce((SELECT s.spent FROM budget_spend AS s"
            "    WHERE s.scope = c.scope AND s.period = c.period), 0)"
            " + coalesce((SELECT sum(h.amount) FROM budget_holds AS h"
            "    WHERE h.scope = c.scope AND h.period = c.period AND h.expires_at > ?), 0)"
            "   AS used FROM claim AS c)"
            " INSERT INTO budget_holds (hold, scope, period, amount, expires_at)"
            " SELECT ?, scope, period, CAST(? AS DOUBLE PRECISION), ? FROM used"
            " WHERE NOT EXISTS (SELECT 1 FROM used WHERE used + CAST(? AS DOUBLE PRECISION)"
            " > cap + 1e-12) RETURNING scope"
        )
        params += [now_text, hold, amount, to_text(now + lasts), amount]
        [rows] = await self._db.atomic([(sql, params)], lock=LOCK)
        return bool(rows)

    async def settle(
        self, hold: str, charges: Sequence[tuple[str, str]], cost: float
    ) -> list[tuple[str, str, float]]:
        """Replace hold `hold` by what the call cost, charged to each (scope, period) of
        `charges`; each budget's spend after it."""
        statements: list[Statement] = [("DELETE FROM budget_holds WHERE hold = ?", (hold,))]
        if charges:
            values = ", ".join(["(?, ?, CAST(? AS DOUBLE PRECISION))"] * len(charges))
            statements.append(
                (
                    f"INSERT INTO budget_spend (scope, period, spent) VALUES {values}"
                    " ON CONFLICT (scope, period) DO UPDATE"
                    " SET spent = budget_spend.spent + excluded.spent"
                    " RETURNING scope, period, spent",
                    [v for scope, period in charges for v in (scope, period, cost)],
                )
            )
        results = await self._db.atomic(statements)
        rows = results[1] if charges else []
        return [(str(r[0]), str(r[1]), float(r[2])) for r in rows]

    async def release(self, hold: str) -> None:
        """Drop hold `hold` (its call failed or was cancelled: nothing was spent)."""
        await self._db.execute("DELETE FROM budget_holds WHERE hold = ?", (hold,))

    async def expire(self) -> int:
        """Drop the holds that expired (their process died mid-call); how many."""
        now = to_text(self._clock())
        return await self._db.execute("DELETE FROM budget_holds WHERE expires_at <= ?", (now,))

    async def standing(self, budgets: Sequence[tuple[str, str]]) -> list[Standing]:
        """Where each (scope, period) of `budgets` stands, in their order."""
        now = to_text(self._clock())
        out = []
        for scope, period in budgets:
            row = await self._db.fetchone(
                "SELECT coalesce((SELECT spent FROM budget_spend WHERE scope = ? AND period = ?),"
                " 0), coalesce((SELECT sum(amount) FROM budget_holds WHERE scope = ?"
                " AND period = ? AND expires_at > ?), 0), coalesce((SELECT sum(amount)"
                " FROM budget_raises WHERE scope = ? AND period = ?), 0)",
                (scope, period, scope, period, now, scope, period),
            )
            assert row is not None
            out.append(Standing(scope, period, float(row[0]), float(row[1]), float(row[2])))
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
