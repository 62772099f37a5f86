"""The usage ledger: tokens and cost of every run, so a user can see what nanobot costs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from nanobot.store._together import write_one
from nanobot.store.database import Database

_Usage = tuple[str, str, str, int, int, float, str]


@dataclass(frozen=True, slots=True)
class UsageTotals:
    runs: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


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
    ) -> None:
        row: _Usage = (
            session_key,
            run_id,
            model,
            prompt_tokens,
            completion_tokens,
            cost,
            datetime.now(UTC).isoformat(timespec="seconds"),
        )
        await write_one(self._records, self._record_each, row)

    async def _record_each(self, rows: Sequence[_Usage]) -> list[None]:
        await self._db.execute(
            "INSERT INTO usage (session_key, run_id, model, prompt_tokens, completion_tokens,"
            " cost, at) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(rows)),
            [v for row in rows for v in row],
        )
        return [None] * len(rows)

    async def totals(
        self, session_key: str | None = None, since: datetime | None = None
    ) -> UsageTotals:
        """Totals for one session key (all its sessions) or everything, optionally since a time."""
        clauses, params = [], []
        if session_key is not None:
            clauses.append("session_key = ?")
            params.append(session_key)
        if since is not None:
            clauses.append("at >= ?")
            params.append(since.astimezone(UTC).isoformat(timespec="seconds"))
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        row = await self._db.fetchone(
            "SELECT count(*), coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0),"
            f" coalesce(sum(cost), 0) FROM usage {where}",
            tuple(params),
        )
        assert row is not None
        return UsageTotals(int(row[0]), int(row[1]), int(row[2]), float(row[3]))
