"""The memory search's full-text index of the sessions' entries (`recall` says what is
indexed and how words are cut).

SQLite keeps it in an FTS5 table without content (`entry_words`, its rowid the entry's id),
PostgreSQL in a table of tsvectors under a GIN index; both hold the words `recall.words`
made, so both find the same entries. An entry's words are written in the transaction that
appends it (`SessionStore.append`): the index never drifts from the entries, whatever crash
comes. On SQLite they wait there in the entry's own row (`unindexed_words`), and reach FTS5
`SQLITE_BATCH` entries at a time (moved by an append) or before a search (see the
migration's `SQLITE_EXTRA` for why). Entries are never changed otherwise, nor is the index.

Entries from before the index (an upgraded database) are indexed by `backfill`, a batch at a
time, newest first, in the background; until it is done a search says it may be incomplete.

A search gathers candidates from the index alone (of the newest `RANKED_MATCHES` matches the
most relevant, and the newest; for several terms, those holding the exact phrase too),
reads those entries, and ranks them in Python (`recall.ranking`): its cost depends on how
many entries match, up to a bound, not on how many there are. A time range becomes a range
of entry ids first (ids grow with time).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from loguru import logger

from nanobot.errors import StoreError
from nanobot.outage import DEFAULT_BACKOFF, Backoff, Outage, Sleep, sleep_or_wake
from nanobot.recall import (
    EVERYTHING,
    INDEXED_CHARS,
    Candidate,
    Found,
    Hit,
    Scope,
    Search,
    Term,
    index_text,
    ranked,
    said,
)
from nanobot.store._times import from_text, to_text
from nanobot.store.database import Database, Row, SqlValue, Statement

BACKFILL_BATCH: Final = 2000
"""Entries indexed per backfill transaction."""
BACKFILL_PAUSE: Final = 0.01
"""Seconds between backfill batches."""
_CANDIDATES: Final = 60  # per list, at least (3 × limit when more)
RANKED_MATCHES: Final = 5000
"""Of the entries matching a query, relevance is scored for the newest this many: scoring
every match costs ~100 ms on PostgreSQL for a word in 10,000 entries (and seconds for one in
most), and what is found ranks by recency too (one older than these has lost a third of
its score or more). At a million entries, a hundred queries found what scoring every
match found, but for one (docs/benchmarks.md)."""
WINDOW: Final = 4 * RANKED_MATCHES
"""How many of the newest ids PostgreSQL looks among first (`SearchIndex._matching`)."""
_BACKFILL_LOCK: Final = "search.backfill"
# Entries are stamped just before they are inserted, so ids and times may disagree by the
# length of an insert; a time range's ids are found with this much to spare, then the times
# themselves are compared.
_SLACK: Final = timedelta(minutes=1)
_ALPHANUMERIC: Final = re.compile(r"[^\W_]")


def words_of(kind: str, data: dict[str, Any]) -> str | None:
    """What the index holds for an entry of `kind` with `data`; None when it is not indexed."""
    found = said(kind, data)
    if found is None:
        return None
    text = index_text(found.text)
    return text or None


def sqlite_words_of(kind: str, data: dict[str, Any]) -> str | int | None:
    """What an entry's row keeps for SQLite's index until its words move into FTS5
    (`SQLITE_MOVE_WORDS`): None when it is not indexed; for ASCII text that ends the
    message's content, where in the content it starts (most messages: nothing copied,
    FTS5's `unicode61` cuts and folds ASCII into exactly the words `index_text` makes, runs
    of letters and digits, lower case); else the words (`words_of`)."""
    found = said(kind, data)
    if found is None:
        return None
    text = found.text
    if text.isascii():
        if not _ALPHANUMERIC.search(text):
            return None
        content = data.get("content")
        if isinstance(content, str) and content.endswith(text):
            return len(content) - len(text)
        return text[:INDEXED_CHARS]
    return index_text(text) or None


SQLITE_BATCH: Final = 64
"""How many entries' words an append leaves waiting outside FTS5 (SQLite) before the next
one moves them in (with them, those of other processes)."""
SQLITE_MOVE_WORDS: Final[Sequence[Statement]] = (
    (
        "INSERT INTO entry_words (rowid, words) SELECT id, CASE typeof(unindexed_words)"
        " WHEN 'integer' THEN substr(json_extract(data, '$.content'), unindexed_words + 1,"
        f" {INDEXED_CHARS:d}) ELSE unindexed_words END FROM entries"
        " WHERE id > (SELECT through FROM entry_words_moved) AND unindexed_words IS NOT NULL",
        (),
    ),
    (
        "UPDATE entries SET unindexed_words = NULL"
        " WHERE id > (SELECT through FROM entry_words_moved) AND unindexed_words IS NOT NULL",
        (),
    ),
    ("UPDATE entry_words_moved SET through = (SELECT MAX(id) FROM entries) WHERE id = 1", ()),
)
"""Every entry's words that wait in its row into FTS5 (SQLite), in one transaction: none is
lost or indexed twice, whoever moves them."""
POSTGRES_INSERT_WITH_WORDS: Final = (
    "WITH added AS (INSERT INTO entries (session_id, kind, data, run_id, created_at, inbound_id)"
    " VALUES (?, ?, ?, ?, ?, ?) RETURNING id),"
    " indexed AS (INSERT INTO entry_words (entry_id, words)"
    " SELECT id, to_tsvector('simple', CAST(? AS TEXT)) FROM added)"
    " SELECT id FROM added"
)
"""An entry's insert with its words, in one statement (PostgreSQL)."""


@dataclass(frozen=True, slots=True)
class Backfill:
    """How far the indexing of entries from before the index has come: entries with an id
    below `below` are not indexed yet (0: all are)."""

    below: int

    @property
    def done(self) -> bool:
        return self.below == 0


class SearchIndex:
    """Searches the index and fills it in for old entries (see the module). Every method
    raises `StoreError` when the database fails; all are safe from several tasks and
    processes at once."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._sqlite = db.dialect.name == "sqlite"
        self._complete = False  # once done, never undone

    async def search(self, search: Search) -> Found:
        now = datetime.now(UTC)
        await self._move_pending()
        low, high = await self._ids(search.since, search.until)
        complete = await self._is_complete()
        if low > high:
            return Found((), complete)
        for any_term in (False, True):  # all terms; failing that, any of them
            candidates = await self._candidates(search, low, high, any_term=any_term)
            if candidates:
                break
        hits = ranked(candidates, search.terms, now, search.limit)
        return Found(tuple(hits), complete)

    async def around(
        self, entry_id: int, *, before: int, after: int, scope: Scope = EVERYTHING
    ) -> list[Hit] | None:
        row = await self._db.fetchone(
            "SELECT e.session_id, s.key FROM entries e JOIN sessions s ON s.id = e.session_id"
            " WHERE e.id = ?",
            (entry_id,),
        )
        if row is None or not scope.allows(str(row["key"])):
            return None
        session_id, key = int(row["session_id"]), str(row["key"])
        # Read in pages: tool results between the said entries are skipped.
        earlier = await self._said(session_id, key, entry_id, before, backwards=True)
        later = await self._said(session_id, key, entry_id - 1, after + 1, backwards=False)
        return [*reversed(earlier), *later]

    async def progress(self) -> Backfill:
        row = await self._db.fetchone("SELECT below FROM search_backfill WHERE id = 1")
        return Backfill(int(row["below"]) if row is not None else 0)

    async def backfill(self, batch: int = BACKFILL_BATCH) -> Backfill:
        """Index the next `batch` of old entries (the newest of those left) and say how far
        it has come. The words are made in a thread; the batch is written in one
        transaction that also moves the mark, under a lock, so processes sharing the
        database each index a batch once."""
        start = await self.progress()
        if start.done:
            return start
        rows = await self._db.fetchall(
            "SELECT id, kind, data FROM entries WHERE id < ? ORDER BY id DESC LIMIT ?",
            (start.below, batch),
        )
        made = await asyncio.to_thread(_words_of_rows, rows)
        below = int(rows[-1]["id"]) if len(rows) == batch else 0
        async with self._db.transaction(lock=_BACKFILL_LOCK):
            if (await self.progress()).below != start.below:
                return await self.progress()  # another process indexed this batch
            for entry_id, words in made:
                await self._db.execute(*self._add(entry_id, words))
            await self._db.execute("UPDATE search_backfill SET below = ? WHERE id = 1", (below,))
        return Backfill(below)

    async def backfill_all(
        self,
        pause: float = BACKFILL_PAUSE,
        *,
        retry: Backoff = DEFAULT_BACKOFF,
        sleep: Sleep = sleep_or_wake,
    ) -> None:
        """Index every old entry, a batch at a time with `pause` seconds between (the
        database serves turns meanwhile); returns at once when none is left. A store that
        fails is tried again after `retry`'s pauses (`store.retry_seconds`, said once in the
        log, and when it answers again); `sleep` waits them out (tests pass their own).
        Cancelling it loses at most the batch under way (rolled back; the next start resumes
        there)."""
        outage = Outage(
            failing="memory search: the state database failed while indexing older entries",
            effect="they wait to be indexed, and searches say they may miss some",
            back="memory search: the state database answers again, indexing goes on",
            backoff=retry,
            sleep=sleep,
        )
        progress = await _tried(outage, self.progress)
        if progress.done:
            return
        logger.info(
            "memory search: indexing the entries from before it (ids below {}), newest first",
            progress.below,
        )
        started = time.monotonic()
        while not progress.done:
            progress = await _tried(outage, self.backfill)
            await asyncio.sleep(pause)
        logger.info("memory search: every entry is indexed ({:.1f} s)", time.monotonic() - started)

    async def _move_pending(self) -> None:
        """Put the words that wait outside FTS5 (SQLite, fewer than a batch) into it, so
        that the search finds every entry appended before it, ranked as if they had always
        been there."""
        if not self._sqlite:
            return
        # Entries above the mark may hold words (tool results between them do not, and a
        # search that looked for words among them would walk them all): any entry above
        # it, and they move, the mark with them.
        row = await self._db.fetchone(
            "SELECT (SELECT MAX(id) FROM entries) > (SELECT through FROM entry_words_moved)"
        )
        if row is not None and row[0]:
            await self._db.atomic(SQLITE_MOVE_WORDS)

    def _add(self, entry_id: int, words: str) -> Statement:
        if self._sqlite:
            return ("INSERT INTO entry_words (rowid, words) VALUES (?, ?)", (entry_id, words))
        return (
            "INSERT INTO entry_words (entry_id, words) VALUES (?, to_tsvector('simple', ?))"
            " ON CONFLICT (entry_id) DO NOTHING",
            (entry_id, words),
        )

    async def _is_complete(self) -> bool:
        if not self._complete:
            self._complete = (await self.progress()).done
        return self._complete

    async def _candidates(
        self, search: Search, low: int, high: int, *, any_term: bool
    ) -> list[Candidate]:
        size = max(_CANDIDATES, 3 * search.limit)
        queries = [self._match(search.terms, any_term=any_term)]
        if len(search.terms) > 1 and not any_term:
            phrase: tuple[Term, ...] = (tuple(w for term in search.terms for w in term),)
            queries.append(self._match(phrase, any_term=False))
        scores: dict[int, float] = {}
        for query in queries:
            for row in await self._matching(query, (low, high), size, search.scope):
                entry_id, relevance = int(row[0]), float(row[1] or 0.0)
                scores[entry_id] = max(scores.get(entry_id, 0.0), relevance)
        if not scores:
            return []
        return await self._read(scores, search)

    async def _matching(
        self, query: str, ids: tuple[int, int], size: int, scope: Scope
    ) -> list[Row]:
        """The rows of `_candidate_sql` for the ids `ids`.

        PostgreSQL reads every match it sorts by id from the table (SQLite's FTS5 walks its
        index in id order), ~1-3 µs each: seconds for a word in most of a million entries.
        So it looks among the newest `WINDOW` ids first: a window holding `RANKED_MATCHES`
        matches holds the newest of them all, and gives the rows the whole range would.
        Short of them, a second window is sized by how often the word came in the first,
        then the whole range. The windows are read with the planner's plain index scans
        off: it would walk the primary key through the window testing every entry's words
        (50 ms for 160,000 ids), where a bitmap of the window's ids ANDed with the word's
        from the GIN index costs a tenth of that."""
        low, high = ids
        if self._sqlite:
            return await self._db.fetchall(*self._candidate_sql(query, ids, size, scope))
        row = await self._db.fetchone(
            "SELECT MAX(entry_id) FROM entry_words WHERE entry_id <= ?", (high,)
        )
        if row is None or row[0] is None:
            return []
        top, span = int(row[0]), WINDOW
        async with self._db.transaction():
            await self._db.execute("SET LOCAL enable_indexscan = off")
            while top - span + 1 > low:
                window = (top - span + 1, top)
                rows = await self._db.fetchall(*self._candidate_sql(query, window, size, scope))
                found = int(rows[0]["found"]) if rows else 0
                if found >= RANKED_MATCHES:
                    return rows
                if found == 0 or span > WINDOW:
                    break
                span = WINDOW * math.ceil(1.5 * RANKED_MATCHES / found)
        return await self._db.fetchall(*self._candidate_sql(query, ids, size, scope))

    def _match(self, terms: tuple[Term, ...], *, any_term: bool) -> str:
        """The backend's query for `terms`: each a phrase, all (or any) of them. The words
        are letters and digits only (`recall.words`), and quoted anyway: no query syntax of
        the person's reaches the database."""
        if self._sqlite:
            joiner = " OR " if any_term else " AND "
            return joiner.join('"' + " ".join(term).replace('"', "") + '"' for term in terms)
        joiner = " | " if any_term else " & "
        return joiner.join(
            "(" + " <-> ".join("'" + word.replace("'", "") + "'" for word in term) + ")"
            for term in terms
        )

    def _candidate_sql(
        self, query: str, ids: tuple[int, int], size: int, scope: Scope
    ) -> tuple[str, list[SqlValue]]:
        """The entries matching `query` (with their relevance) that are among the `size`
        most relevant of the newest `RANKED_MATCHES` matches, or among the `size` newest."""
        low, high = ids
        params: list[SqlValue] = [query, low, high] if self._sqlite else []
        within = ""
        if scope.keys is not None:
            keys = sorted(scope.keys)
            marks = ", ".join("?" * len(keys))
            column = "entry_words.rowid" if self._sqlite else "w.entry_id"
            within = (
                " AND EXISTS (SELECT 1 FROM entries e JOIN sessions s ON s.id = e.session_id"
                f" WHERE e.id = {column} AND s.key IN ({marks}))"
            )
            params += keys
        # With each row, how many matches were scored (`found`, at most RANKED_MATCHES).
        choose = (
            " SELECT id, relevance, (SELECT count(*) FROM matched) AS found FROM"
            f" (SELECT * FROM matched ORDER BY relevance DESC LIMIT {size:d}) AS best"
            " UNION SELECT id, relevance, (SELECT count(*) FROM matched) AS found FROM"
            f" (SELECT * FROM matched ORDER BY id DESC LIMIT {size:d}) AS newest"
        )
        if self._sqlite:
            return (
                "WITH matched AS MATERIALIZED (SELECT rowid AS id, -bm25(entry_words) AS relevance"
                " FROM entry_words"
                f" WHERE entry_words MATCH ? AND rowid BETWEEN ? AND ?{within}"
                f" ORDER BY rowid DESC LIMIT {RANKED_MATCHES:d})" + choose,
                params,
            )
        # PostgreSQL gets the query and the ids as literals: with parameters, a prepared
        # statement's generic plan (from its sixth run on) cannot know how rare the words
        # are, or how many ids a window holds, and walks the primary key through every
        # entry for a rare word (0.5 s at a million entries, against 1 ms). The literal holds
        # only letters, digits, quotes (doubled), spaces and the operators `_match` wrote.
        # The matches are found through the GIN index and sorted (`+ 0`): in id order
        # through the primary key, the planner would walk backwards through hundreds of
        # thousands of entries for a word in a few hundred (0.2 s). Only their ids and
        # scores are sorted (with the words, 5,000 of them spill to disk).
        tsquery = "to_tsquery('simple', '" + query.replace("'", "''") + "')"
        return (
            "WITH matched AS MATERIALIZED (SELECT w.entry_id AS id,"
            f" ts_rank(w.words, {tsquery}) AS relevance FROM entry_words w"
            f" WHERE w.words @@ {tsquery} AND w.entry_id BETWEEN {low:d} AND {high:d}{within}"
            f" ORDER BY w.entry_id + 0 DESC LIMIT {RANKED_MATCHES:d})" + choose,
            params,
        )

    async def _read(self, scores: dict[int, float], search: Search) -> list[Candidate]:
        ids = sorted(scores)
        rows = await self._db.fetchall(
            "SELECT e.id, e.kind, e.data, e.created_at, s.key FROM entries e"
            " JOIN sessions s ON s.id = e.session_id"
            f" WHERE e.id IN ({', '.join('?' * len(ids))})",
            ids,
        )
        candidates = []
        for row in rows:
            hit = _hit(row)
            if hit is None or not search.scope.allows(hit.session_key):
                continue
            if search.since is not None and hit.created_at < search.since:
                continue
            if search.until is not None and hit.created_at >= search.until:
                continue
            candidates.append(Candidate(hit, scores[hit.entry_id]))
        return candidates

    async def _said(
        self, session_id: int, key: str, entry_id: int, count: int, *, backwards: bool
    ) -> list[Hit]:
        """Up to `count` indexed entries of the session before `entry_id` (or from just after
        `entry_id`), nearest first."""
        found: list[Hit] = []
        cursor = entry_id
        compare, order = ("<", "DESC") if backwards else (">", "")
        for _ in range(5):  # pages of entries, most of them skipped tool results at worst
            if len(found) >= count:
                break
            rows = await self._db.fetchall(
                "SELECT e.id, e.kind, e.data, e.created_at, ? AS key FROM entries e"
                f" WHERE e.session_id = ? AND e.id {compare} ? ORDER BY e.id {order} LIMIT 50",
                (key, session_id, cursor),
            )
            for row in rows:
                hit = _hit(row)
                if hit is not None:
                    found.append(hit)
            if len(rows) < 50:
                break
            cursor = int(rows[-1]["id"])
        return found[:count]

    async def _ids(self, since: datetime | None, until: datetime | None) -> tuple[int, int]:
        """The range of entry ids that can hold entries from `since` until before `until`."""
        low = 0 if since is None else await self._first_id_at(since - _SLACK)
        high = 2**63 - 1 if until is None else await self._first_id_at(until + _SLACK) - 1
        return low, high

    async def _first_id_at(self, moment: datetime) -> int:
        """The smallest entry id stamped at or after `moment` (ids grow with time), found by
        halving the id range: a few dozen primary-key reads, however many entries."""
        row = await self._db.fetchone("SELECT MIN(id), MAX(id) FROM entries")
        if row is None or row[0] is None:
            return 0
        low, high, stamp = int(row[0]), int(row[1]) + 1, to_text(moment)
        while low < high:
            middle = (low + high) // 2
            found = await self._db.fetchone(
                "SELECT id, created_at FROM entries WHERE id >= ? ORDER BY id LIMIT 1", (middle,)
            )
            assert found is not None, "an id at or below MAX(id) has one at or after it"
            if str(found["created_at"]) >= stamp:
                high = middle
            else:
                low = int(found["id"]) + 1
        return low


async def _tried(outage: Outage, step: Callable[[], Awaitable[Backfill]]) -> Backfill:
    """What `step` returns, tried until the store answers (see `backfill_all`)."""
    while True:
        try:
            done = await step()
        except StoreError as exc:
            outage.failed(exc)
            await outage.wait()
            continue
        outage.recovered()
        return done


def _hit(row: Row) -> Hit | None:
    try:
        data = json.loads(row["data"])
    except ValueError:
        return None
    found = said(str(row["kind"]), data) if isinstance(data, dict) else None
    if found is None:
        return None
    return Hit(int(row["id"]), str(row["key"]), from_text(row["created_at"]), found)


def _words_of_rows(rows: Sequence[Row]) -> list[tuple[int, str]]:
    made = []
    for row in rows:
        try:
            data = json.loads(row["data"])
        except ValueError:
            continue
        words = words_of(str(row["kind"]), data) if isinstance(data, dict) else None
        if words is not None:
            made.append((int(row["id"]), words))
    return made
