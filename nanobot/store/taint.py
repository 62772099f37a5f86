"""The taint ledger's table: which workspace files hold content from outside, and from where.

One row per file (`path`, relative to the workspace; absolute for a file outside it). A
lookup is one statement on the primary key (`IN (…)`), with a prefix test for folders (a
command that names `inbox/` reads what is in it). Writes are upserts: several members of a
cluster may mark the same file at once, and the last one's source wins only when it wrote
the whole file (`replace`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

from nanobot.store._times import from_text, to_text, wall_clock
from nanobot.store.database import Database

_MAX_PARAMS = 400  # per statement: SQLite allows 32766 since 3.32, PostgreSQL 65535


@dataclass(frozen=True, slots=True)
class TaintMark:
    """`path` holds content from `source`, as a turn of `session_key` recorded at `marked_at`."""

    path: str
    source: str
    session_key: str
    marked_at: datetime


class TaintStore:
    """The `taint` table. Every method raises `StoreError` when the database fails."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = wall_clock) -> None:
        self._db = db
        self._clock = clock

    async def marks(
        self, paths: Collection[str], *, under: Collection[str] = ()
    ) -> list[TaintMark]:
        """The rows of `paths`, and of every path below one of the folders `under`."""
        paths, under = sorted(set(paths)), sorted({f.rstrip("/") + "/" for f in under if f})
        if not paths and not under:
            return []
        found: dict[str, TaintMark] = {}
        for start in range(0, max(len(paths), 1), _MAX_PARAMS):
            chunk = paths[start : start + _MAX_PARAMS]
            clauses = [f"path IN ({', '.join('?' * len(chunk))})"] if chunk else []
            folders = under if start == 0 else []
            # substr, not LIKE or a range: no escaping of `%`/`_`, and no collation surprises.
            clauses += ["substr(path, 1, ?) = ?"] * len(folders)
            params: list[str | int] = [*chunk]
            for folder in folders:
                params += [len(folder), folder]
            rows = await self._db.fetchall(
                "SELECT path, source, session_key, marked_at FROM taint WHERE "
                + " OR ".join(clauses),
                params,
            )
            for row in rows:
                found[str(row[0])] = TaintMark(
                    str(row[0]), str(row[1]), str(row[2]), from_text(str(row[3]))
                )
        return [found[p] for p in sorted(found)]

    async def mark(
        self, paths: Collection[str], source: str, *, replace: bool, session_key: str = ""
    ) -> None:
        """Record `paths` as holding content from `source`; an existing row keeps its source
        unless `replace`."""
        ordered = sorted(set(paths))
        if not ordered:
            return
        now = to_text(self._clock())
        on_conflict = (
            "DO UPDATE SET source = excluded.source, session_key = excluded.session_key,"
            " marked_at = excluded.marked_at"
            if replace
            else "DO NOTHING"
        )
        for start in range(0, len(ordered), _MAX_PARAMS // 4):
            chunk = ordered[start : start + _MAX_PARAMS // 4]
            await self._db.execute(
                "INSERT INTO taint (path, source, session_key, marked_at) VALUES "
                + ", ".join(["(?, ?, ?, ?)"] * len(chunk))
                + f" ON CONFLICT (path) {on_conflict}",
                [v for path in chunk for v in (path, source, session_key, now)],
            )

    async def clear(self, paths: Collection[str]) -> None:
        """Forget the rows of `paths` (absent ones are no error)."""
        ordered = sorted(set(paths))
        for start in range(0, len(ordered), _MAX_PARAMS):
            chunk = ordered[start : start + _MAX_PARAMS]
            await self._db.execute(
                f"DELETE FROM taint WHERE path IN ({', '.join('?' * len(chunk))})", chunk
            )

    async def all(self, limit: int = 1000) -> list[TaintMark]:
        """Every row, by path, at most `limit` (for `nanobot taint list`)."""
        rows = await self._db.fetchall(
            "SELECT path, source, session_key, marked_at FROM taint ORDER BY path LIMIT ?",
            (limit,),
        )
        return [TaintMark(str(r[0]), str(r[1]), str(r[2]), from_text(str(r[3]))) for r in rows]
