"""Sessions: conversations stored as append-only lists of entries.

A session belongs to a key (`channel:chat_id`, plus thread where the platform has one). Each
key has at most one *live* session; `/new` archives it, and the next `live()` starts another.
Archived sessions and their entries are kept as history. Entries are never updated or
deleted: a compaction is itself an entry that later context building starts from. (On
SQLite a row also holds its words for the search index until they move there, the column
then emptied: `store.search`; what the entry says never changes.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, cast, get_args

from nanobot.errors import StoreError
from nanobot.store._times import from_text, now_text, to_text
from nanobot.store.database import Database, Row, SqlValue, Statement
from nanobot.store.search import (
    POSTGRES_INSERT_WITH_WORDS,
    SQLITE_BATCH,
    SQLITE_MOVE_WORDS,
    sqlite_words_of,
    words_of,
)

EntryKind = Literal["message", "compaction", "note"]
"""What an entry holds: a chat message, a compaction summary, or a system note."""

_KINDS: Final = frozenset(get_args(EntryKind))


@dataclass(frozen=True, slots=True)
class NewEntry:
    """An entry to append; the store assigns its id and timestamp.

    For `kind="message"`, `data` is an OpenAI-format chat message (`role`, `content`, and
    `tool_calls` / `tool_call_id` where they apply). `data` must be JSON-serialisable.
    """

    kind: EntryKind
    data: dict[str, Any]
    run_id: str | None = None
    inbound_id: int | None = None  # the inbound journal row this user message came from
    sender: str | None = None  # who sent this user message: their platform id, telegram:123


@dataclass(frozen=True, slots=True)
class Entry:
    """A stored entry. Ids increase with insertion order: within a session they are also
    committed in that order, so a reader paging by id (`since`) never skips one."""

    id: int
    session_id: int
    kind: EntryKind
    data: dict[str, Any]
    run_id: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session, live (`archived_at is None`) or archived, with its number of entries."""

    id: int
    key: str
    created_at: datetime
    archived_at: datetime | None
    entry_count: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Totals for `nanobot status`. `size_bytes` includes the write-ahead log."""

    sessions: int
    live_sessions: int
    entries: int
    size_bytes: int


_ENTRY_COLUMNS: Final = "id, session_id, kind, data, run_id, created_at"


class SessionStore:
    """Sessions and their entries in the state database.

    Every method raises `StoreError` when the database fails, and is safe to use from
    several tasks and several processes at once.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        # Single appends of many turns at once go out as one statement (PostgreSQL).
        self._appends = db.together("entries", self._append_each)
        # SQLite: how many entries' words this store left waiting outside FTS5 since it
        # last moved them; from `SQLITE_BATCH` on, the next append moves them (`store.search`).
        self._waiting = 0

    async def live(self, key: str) -> int:
        """Return the id of the live session for `key`, starting one if there is none.

        Two processes racing to start the same key get the same session: the unique index on
        live keys lets only one insert succeed.
        """
        if self._db.dialect.name == "postgresql":  # one round trip, found or started
            row = await self._db.fetchone(_LIVE, (key, key, now_text()))
            assert row is not None, "found, or started by the insert (or its no-op update)"
            return int(row["id"])
        row = await self._db.fetchone(
            "SELECT id FROM sessions WHERE key = ? AND archived_at IS NULL", (key,)
        )
        if row is not None:
            return int(row["id"])
        # The no-op update makes RETURNING give the id whether this insert won or not.
        row = await self._db.fetchone(
            "INSERT INTO sessions (key, created_at) VALUES (?, ?)"
            " ON CONFLICT (key) WHERE archived_at IS NULL DO UPDATE SET key = excluded.key"
            " RETURNING id",
            (key, now_text()),
        )
        assert row is not None, "an upsert with RETURNING always returns its row"
        return int(row["id"])

    async def archive(self, key: str) -> int | None:
        """Archive the live session for `key` and return its id; None if there was none.

        The session and its entries stay readable; the next `live(key)` starts a new one.
        """
        row = await self._db.fetchone(
            "UPDATE sessions SET archived_at = ? WHERE key = ? AND archived_at IS NULL"
            " RETURNING id",
            (now_text(), key),
        )
        return None if row is None else int(row["id"])

    async def append(self, session_id: int, entries: Sequence[NewEntry]) -> list[Entry]:
        """Append `entries` atomically, in order, and return them as stored.

        Appending to an archived session is allowed (a turn that was running when `/new`
        came in finishes where it started). Raises `StoreError` if the session does not exist
        and `TypeError` if a payload is not JSON-serialisable; either way nothing is appended.
        """
        if not entries:
            return []
        created_at = datetime.now(UTC)
        stamp = to_text(created_at)
        # Encode first: a payload that is not JSON fails before anything is sent. Each
        # entry's words go into the search index in the same transaction (`store.search`).
        sqlite = self._db.dialect.name == "sqlite"
        statements: list[Statement] = []
        firsts: list[int] = []  # the index of each entry's own statement
        items: list[tuple[SqlValue, ...]] = []  # each entry's values and words
        waiting = 0  # SQLite: entries whose words this append leaves waiting
        for entry in entries:
            values: tuple[SqlValue, ...] = (
                session_id,
                entry.kind,
                _encode(entry.data),
                entry.run_id,
                stamp,
                entry.inbound_id,
                entry.sender,
            )
            words = (sqlite_words_of if sqlite else words_of)(entry.kind, entry.data)
            items.append((*values, words))
            firsts.append(len(statements))
            if sqlite:  # the words in the entry's row, till they move into FTS5
                statements.append((_SQLITE_INSERT, (*values, words)))
                waiting += words is not None
            elif words is None:
                statements.append((_INSERT, values))
            else:
                statements.append((POSTGRES_INSERT_WITH_WORDS, (*values, words)))
        moving = sqlite and self._waiting >= SQLITE_BATCH
        if moving:  # in this transaction: a failure or a crash leaves them waiting
            statements += SQLITE_MOVE_WORDS
        # One append to a session at a time, in every process: a batch's ids are adjacent,
        # and a session's ids are committed in their order (`since` pages by id).
        lock = f"session:{session_id}"
        if len(entries) == 1 and self._appends is not None and self._appends.applies():
            # The common case in one round trip, shared with other sessions' appends.
            rows, firsts = [[await self._appends((lock, *items[0]))]], [0]
        else:
            rows = await self._db.atomic(statements, lock=lock)
            self._waiting = waiting if moving else self._waiting + waiting
        return [
            Entry(
                id=int(rows[first][0]["id"]),
                session_id=session_id,
                kind=entry.kind,
                data=entry.data,
                run_id=entry.run_id,
                created_at=created_at,
            )
            for entry, first in zip(entries, firsts, strict=True)
        ]

    async def _append_each(self, items: Sequence[tuple[SqlValue, ...]]) -> list[Row]:
        """Single entries of several sessions (each `(lock, *insert's values, words)`), appended
        in one statement, under every session's lock; their rows, in order."""
        values = ", ".join([_LOCKED_VALUES] * len(items))
        rows = await self._db.fetchall(
            _LOCKED_INSERTS.format(values=values),
            [v for order, item in enumerate(items) for v in (order, *item)],
        )
        # Inserted in the items' order, so their ids ascend in it.
        return sorted(rows, key=lambda row: int(row["id"]))

    async def tail(self, session_id: int, limit: int, before_id: int | None = None) -> list[Entry]:
        """Return the last `limit` entries of the session, oldest first.

        With `before_id`, only entries with a smaller id are considered, so passing the
        first id of one page fetches the page before it. The cost depends on `limit`, not on
        the length of the session.
        """
        if limit <= 0:
            return []
        # Sentinel instead of a second query: `id < ?` keeps the index range either way.
        upper = before_id if before_id is not None else 2**63 - 1
        rows = await self._db.fetchall(
            f"SELECT {_ENTRY_COLUMNS} FROM entries"
            " WHERE session_id = ? AND id < ? ORDER BY id DESC LIMIT ?",
            (session_id, upper, limit),
        )
        return [self._entry(row) for row in reversed(rows)]

    async def since(self, session_id: int, after_id: int, limit: int) -> list[Entry]:
        """Up to `limit` entries of the session with an id above `after_id`, oldest first."""
        rows = await self._db.fetchall(
            f"SELECT {_ENTRY_COLUMNS} FROM entries"
            " WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?",
            (session_id, after_id, limit),
        )
        return [self._entry(row) for row in rows]

    async def count(self, session_id: int) -> int:
        """The number of entries in the session."""
        row = await self._db.fetchone(
            "SELECT count(*) FROM entries WHERE session_id = ?", (session_id,)
        )
        return int(row[0]) if row else 0

    async def sessions(self, key: str | None = None) -> list[SessionInfo]:
        """All sessions, or those of one key, oldest first."""
        where, params = ("WHERE s.key = ?", (key,)) if key is not None else ("", ())
        rows = await self._db.fetchall(
            "SELECT s.id, s.key, s.created_at, s.archived_at,"
            " (SELECT count(*) FROM entries e WHERE e.session_id = s.id) AS entry_count"
            f" FROM sessions s {where} ORDER BY s.id",
            params,
        )
        return [
            SessionInfo(
                id=int(row["id"]),
                key=str(row["key"]),
                created_at=from_text(row["created_at"]),
                archived_at=None if row["archived_at"] is None else from_text(row["archived_at"]),
                entry_count=int(row["entry_count"]),
            )
            for row in rows
        ]

    async def stats(self) -> StoreStats:
        """Counts of sessions and entries, and the size of the database on disk."""
        row = await self._db.fetchone(
            "SELECT (SELECT count(*) FROM sessions),"
            " (SELECT count(*) FROM sessions WHERE archived_at IS NULL),"
            " (SELECT count(*) FROM entries)"
        )
        assert row is not None, "a SELECT without FROM yields one row"
        return StoreStats(
            sessions=int(row[0]),
            live_sessions=int(row[1]),
            entries=int(row[2]),
            size_bytes=await self._db.size_bytes(),
        )

    def _entry(self, row: Row) -> Entry:
        kind = row["kind"]
        try:
            data = json.loads(row["data"])
        except ValueError:
            data = None
        if kind not in _KINDS or not isinstance(data, dict):
            raise StoreError(
                f"{self._db.name}: entry {row['id']} (kind {kind!r}) is not an entry this "
                "nanobot can read"
            )
        return Entry(
            id=int(row["id"]),
            session_id=int(row["session_id"]),
            kind=cast(EntryKind, kind),
            data=data,
            run_id=row["run_id"],
            created_at=from_text(row["created_at"]),
        )


_INSERT: Final = (
    "INSERT INTO entries (session_id, kind, data, run_id, created_at, inbound_id, sender)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id"
)
# SQLite: with the words that wait in the row for FTS5 (`store.search`).
_SQLITE_INSERT: Final = (
    "INSERT INTO entries (session_id, kind, data, run_id, created_at, inbound_id, sender,"
    " unindexed_words) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id"
)


def _encode(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


# Entries of several sessions appended in one statement, each under its session's advisory
# lock (PostgreSQL): the locks taken first, in one order (two statements locking some of
# the same sessions wait for each other in turn and never deadlock), held until the
# statement's own transaction ends; then the rows inserted in the items' order, and the
# words of those that have them indexed (`store.search`): the n-th id is the n-th item's.
_LOCKED_VALUES = (
    "(CAST(? AS BIGINT), CAST(? AS TEXT), CAST(? AS BIGINT), CAST(? AS TEXT),"
    " CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS BIGINT), CAST(? AS TEXT),"
    " CAST(? AS TEXT))"
)
_LOCKED_INSERTS = (
    "WITH items (ord, lock, session_id, kind, data, run_id, created_at, inbound_id, sender,"
    " words) AS"
    " (VALUES {values}),"
    " locked AS (SELECT count(pg_advisory_xact_lock(k)) AS n FROM"
    " (SELECT DISTINCT hashtextextended(lock, 0) AS k FROM items ORDER BY k) keys),"
    " added AS (INSERT INTO entries"
    " (session_id, kind, data, run_id, created_at, inbound_id, sender)"
    " SELECT session_id, kind, data, run_id, created_at, inbound_id, sender FROM items, locked"
    " ORDER BY ord RETURNING id),"
    " numbered AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS ord FROM added),"
    " indexed AS (INSERT INTO entry_words (entry_id, words)"
    " SELECT n.id, to_tsvector('simple', i.words) FROM numbered n JOIN items i ON i.ord = n.ord"
    " WHERE i.words IS NOT NULL)"
    " SELECT id FROM added"
)
# `live` in one statement (PostgreSQL): the live session if there is one, else the one the
# insert starts; one that another process started meanwhile is returned by the conflict's
# no-op update.
_LIVE = (
    "WITH found AS (SELECT id FROM sessions WHERE key = ? AND archived_at IS NULL),"
    " made AS (INSERT INTO sessions (key, created_at) SELECT ?, ?"
    " WHERE NOT EXISTS (SELECT 1 FROM found)"
    " ON CONFLICT (key) WHERE archived_at IS NULL DO UPDATE SET key = excluded.key"
    " RETURNING id)"
    " SELECT id FROM found UNION ALL SELECT id FROM made"
)
