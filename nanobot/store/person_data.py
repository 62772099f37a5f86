"""What the store holds of one person, read out (`export`) or deleted (`forget`): what
`nanobot people export` and `forget` do under data-protection law.

A person's data: the sessions of their private chats (every entry, and the search index's
rows for them), their own messages in groups (the entries their inbound messages became;
what others and the assistant said there belongs to the group and stays), the inbound
journal's rows of what they sent, the outbox's rows to their private chats, the cron jobs
they made, the approvals, usage and chat settings of their private chats, the taint marks of
their folder's files, and their links and session notes. The files of their folder are the
caller's to delete (`nanobot.manage`).

The search index is deleted row by row through the store's own table (`entry_words`): on
SQLite a contentless FTS5 table, whose rows are deleted by giving their words again
(`store.search.words_of`), then merged (`optimize`) so no segment keeps the old words, and the
file vacuumed so no free page keeps them either; on PostgreSQL rows of a table.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from loguru import logger

from nanobot.store.database import Database, SqlValue, Statement
from nanobot.store.people import PeopleStore
from nanobot.store.search import words_of

_BATCH = 500


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What `forget` deleted, counted."""

    sessions: int
    entries: int
    inbound: int
    outbox: int
    jobs: int


class PersonData:
    """A person's rows, read and deleted. Every method raises `StoreError` when the
    database fails."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._sqlite = db.dialect.name == "sqlite"

    async def ids(self, person: str) -> list[str]:
        """`person` and every platform id linked to them."""
        links = await PeopleStore(self._db).links()
        return [person, *sorted(u for u, p in links.items() if p == person and u != person)]

    async def entries(self, person: str) -> Iterator[dict[str, Any]]:
        """Every entry of `person`'s sessions (their private chats whole, their own messages
        in groups), oldest first, as JSON-ready records."""
        private, groups = await self._sessions(person)
        own = await self._inbound(await self.ids(person))
        rows = await self._entry_rows(private, groups, own)
        return (
            {
                "session": str(r["key"]),
                "id": int(r["id"]),
                "kind": str(r["kind"]),
                "at": str(r["created_at"]),
                "data": json.loads(r["data"]),
            }
            for r in rows
        )

    async def forget(self, person: str) -> Forgotten:
        """Delete what the store holds of `person` (see the module), all in one transaction,
        then scrub the file (SQLite) so nothing deleted stays readable in it."""
        ids = await self.ids(person)
        private, groups = await self._sessions(person)
        inbound = await self._inbound(ids)
        rows = await self._entry_rows(private, groups, inbound)
        below = await self._db.fetchone("SELECT below FROM search_backfill WHERE id = 1")
        unindexed_below = int(below[0]) if below is not None else 0
        words = [
            (int(r["id"]), words_of(str(r["kind"]), json.loads(r["data"])))
            for r in rows
            if int(r["id"]) >= unindexed_below
        ]
        outbox = await self._outbox(private)
        statements: list[Statement] = [*self._unindex(words)]
        entry_ids = [int(r["id"]) for r in rows]
        statements += _chunked("DELETE FROM entries WHERE id IN ({})", entry_ids)
        statements += _chunked(
            "DELETE FROM sessions WHERE key IN ({})"
            " AND NOT EXISTS (SELECT 1 FROM entries e WHERE e.session_id = sessions.id)",
            private,
        )
        statements += _chunked("DELETE FROM inbound WHERE id IN ({})", inbound)
        statements += _chunked("DELETE FROM outbox WHERE id IN ({})", outbox)
        for table in ("usage", "approval_log", "approval_grants", "approval_requests"):
            statements += _chunked(f"DELETE FROM {table} WHERE session_key IN ({{}})", private)
        jobs = await self._db.fetchall(
            "SELECT id FROM cron_jobs WHERE created_by IN ({})".format(", ".join("?" * len(ids)))
            + (" OR owner IN ({})".format(", ".join("?" * len(private))) if private else ""),
            [*ids, *private],
        )
        job_ids = [str(j[0]) for j in jobs]
        statements += _chunked("DELETE FROM cron_runs WHERE job_id IN ({})", job_ids)
        statements += _chunked("DELETE FROM cron_jobs WHERE id IN ({})", job_ids)
        for key in private:
            channel, _, chat = key.partition(":")
            statements.append(
                (
                    "DELETE FROM chat_settings WHERE channel = ? AND chat_id = ?",
                    (channel, chat),
                )
            )
        statements += _chunked("DELETE FROM person_sessions WHERE person IN ({})", ids)
        statements += _chunked("DELETE FROM person_links WHERE person IN ({})", ids)
        statements += _chunked("DELETE FROM person_links WHERE user_key IN ({})", ids)
        if self._sqlite and words:
            statements.append(("INSERT INTO entry_words (entry_words) VALUES ('optimize')", ()))
        await self._db.atomic(statements)
        await self._scrub()
        logger.info(
            "forgot {}: {} sessions, {} entries, {} inbound, {} outbox, {} jobs",
            person,
            len(private),
            len(entry_ids),
            len(inbound),
            len(outbox),
            len(job_ids),
        )
        return Forgotten(len(private), len(entry_ids), len(inbound), len(outbox), len(job_ids))

    async def forget_taint(self, prefix: str) -> None:
        """Delete the taint marks of the files under `prefix` (a person's folder)."""
        like = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "/%"
        await self._db.execute("DELETE FROM taint WHERE path LIKE ? ESCAPE '\\'", (like,))

    async def _sessions(self, person: str) -> tuple[list[str], list[str]]:
        found = await PeopleStore(self._db).sessions(person)
        return [k for k, p in found.items() if p], [k for k, p in found.items() if not p]

    async def _inbound(self, ids: Sequence[str]) -> list[int]:
        """The inbound journal's rows of messages sent by any of `ids`."""
        wanted = {tuple(i.split(":", 1)) for i in ids}
        found = []
        for row in await self._db.fetchall("SELECT id, channel, message FROM inbound"):
            try:
                sender = str(json.loads(row["message"]).get("sender_id"))
            except (ValueError, AttributeError):
                continue
            if (str(row["channel"]), sender) in wanted:
                found.append(int(row["id"]))
        return found

    async def _outbox(self, private: Sequence[str]) -> list[int]:
        """The outbox's rows to the private chats `private` (session keys)."""
        chats = {tuple(k.split(":", 1)) for k in private}
        found = []
        for row in await self._db.fetchall("SELECT id, channel, message FROM outbox"):
            try:
                record = json.loads(row["message"])
            except ValueError:
                continue
            if any((str(row["channel"]), c) in chats for c in _chat_ids(record)):
                found.append(int(row["id"]))
        return found

    async def _entry_rows(
        self, private: Sequence[str], groups: Sequence[str], inbound: Sequence[int]
    ) -> list[Any]:
        rows: list[Any] = []
        select = (
            "SELECT e.id, e.kind, e.data, e.created_at, s.key FROM entries e"
            " JOIN sessions s ON s.id = e.session_id WHERE "
        )
        for sql, params in _chunked(select + "s.key IN ({}) ORDER BY e.id", private):
            rows += await self._db.fetchall(sql, params)
        if groups and inbound:
            for sql, params in _chunked(select + "e.inbound_id IN ({}) ORDER BY e.id", inbound):
                rows += [r for r in await self._db.fetchall(sql, params) if r["key"] in groups]
        return sorted(rows, key=lambda r: int(r["id"]))

    def _unindex(self, words: Iterable[tuple[int, str | None]]) -> Iterator[Statement]:
        if self._sqlite:
            for entry_id, text in words:
                if text is not None:
                    yield (
                        "INSERT INTO entry_words (entry_words, rowid, words)"
                        " VALUES ('delete', ?, ?)",
                        (entry_id, text),
                    )
            return
        yield from _chunked("DELETE FROM entry_words WHERE entry_id IN ({})", [i for i, _ in words])

    async def _scrub(self) -> None:
        if self._sqlite:
            await self._db.execute("VACUUM")
            await self._db.fetchall("PRAGMA wal_checkpoint(TRUNCATE)")


def _chat_ids(record: object) -> Iterator[str]:
    """Every `chat_id` a JSON record names, at any depth."""
    if isinstance(record, dict):
        for key, value in record.items():
            if key == "chat_id" and isinstance(value, str):
                yield value
            else:
                yield from _chat_ids(value)
    elif isinstance(record, list):
        for value in record:
            yield from _chat_ids(value)


def _chunked(sql: str, values: Sequence[SqlValue]) -> list[Statement]:
    """`sql` with `{}` filled by placeholders, for `values` in batches (none when empty)."""
    return [
        (sql.format(", ".join("?" * len(values[i : i + _BATCH]))), tuple(values[i : i + _BATCH]))
        for i in range(0, len(values), _BATCH)
    ]
