"""The usage ledger: tokens and cost of every run, so a user can see what nanobot costs.

One row per run: its session key, model, whose turn it was (`person`, the platform user id
of the sender; NULL for cron and the heartbeat), what started it (`source`: chat, cron,
heartbeat, task), its tokens (`cached_tokens`: the part of the prompt the provider read
from its cache) and cost, `priced` 0 where the model's price is unknown (the cost is then
no figure, not zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

from nanobot.store._together import write_one
from nanobot.store.database import Database, SqlValue

_Usage = tuple[str, str, str, int, int, float, str, str | None, str, int, int]

Grouping = Literal["day", "hour", "model", "person", "chat", "source"]
GROUPINGS: Final[tuple[Grouping, ...]] = ("day", "model", "person", "chat", "source")
# The column a report groups by; a day is the UTC date's (the caller may regroup by zone).
_GROUP_SQL: Final[dict[Grouping, str]] = {
    "day": "substr(at, 1, 10)",
    "hour": "substr(at, 1, 13)",  # for days in another zone than UTC, summed by the caller
    "model": "model",
    "person": "coalesce(person, '')",
    "chat": "session_key",
    "source": "source",
}


@dataclass(frozen=True, slots=True)
class UsageTotals:
    runs: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    cached_tokens: int = 0
    unpriced: int = 0  # runs whose cost is unknown (not in `cost`)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class UsageLine:
    """One group of a report (`key`: the day, model, person, chat or source)."""

    key: str
    totals: UsageTotals


_SUMS: Final = (
    "count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0),"
    " coalesce(sum(CASE WHEN priced = 1 THEN cost ELSE 0 END), 0),"
    " coalesce(sum(cached_tokens), 0), coalesce(sum(CASE WHEN priced = 1 THEN 0 ELSE 1 END), 0)"
)


class UsageLedger:
    def __init__(self, db: Database) -> None:
        self._db = db
        # Many runs' usage at once in one statement (PostgreSQL).
        self._records = db.together("usage", self._record_each)

    async def record(
        self,
        session_key: str,
        run_id: str,
        *,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        cost: float,
        cached_tokens: int = 0,
        priced: bool = True,
        person: str | None = None,
        source: str = "chat",
    ) -> None:
        row: _Usage = (
            session_key,
            run_id,
            model,
            prompt_tokens,
            completion_tokens,
            cost,
            datetime.now(UTC).isoformat(timespec="seconds"),
            person,
            source,
            cached_tokens,
            1 if priced else 0,
        )
        await write_one(self._records, self._record_each, row)

    async def _record_each(self, rows: Sequence[_Usage]) -> list[None]:
        await self._db.execute(
            "INSERT INTO usage (session_key, run_id, model, prompt_tokens, completion_tokens,"
            " cost, at, person, source, cached_tokens, priced) VALUES "
            + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(rows)),
            [v for row in rows for v in row],
        )
        return [None] * len(rows)

    async def totals(
        self,
        session_key: str | None = None,
        since: datetime | None = None,
        *,
        person: str | None = None,
    ) -> UsageTotals:
        """Totals for one session key (all its sessions), one person, or everything,
        optionally since a time."""
        where, params = _where(session_key, since, person)
        row = await self._db.fetchone(f"SELECT {_SUMS} FROM usage {where}", params)
        assert row is not None
        return _totals(list(row))

    async def report(self, by: Grouping, since: datetime | None = None) -> list[UsageLine]:
        """The totals of each group since `since` (everything: None), ordered by key."""
        where, params = _where(None, since, None)
        column = _GROUP_SQL[by]
        rows = await self._db.fetchall(
            f"SELECT {column} AS k, {_SUMS} FROM usage {where} GROUP BY k ORDER BY k", params
        )
        return [UsageLine(str(row[0]), _totals(list(row)[1:])) for row in rows]


def _where(
    session_key: str | None, since: datetime | None, person: str | None
) -> tuple[str, list[SqlValue]]:
    clauses: list[str] = []
    params: list[SqlValue] = []
    for column, value in (("session_key", session_key), ("person", person)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if since is not None:
        clauses.append("at >= ?")
        params.append(since.astimezone(UTC).isoformat(timespec="seconds"))
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params


def _totals(row: Sequence[object]) -> UsageTotals:
    values = list(row)
    return UsageTotals(
        int(values[0]),  # type: ignore[call-overload]
        int(values[1]),  # type: ignore[call-overload]
        int(values[2]),  # type: ignore[call-overload]
        float(values[3]),  # type: ignore[arg-type]
        int(values[4]),  # type: ignore[call-overload]
        int(values[5]),  # type: ignore[call-overload]
    )
