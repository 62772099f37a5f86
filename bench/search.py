"""Issue 30 §1, memory search: queries over a large index, the append's cost, the index's size
and the backfill's speed, on SQLite and on PostgreSQL.

The corpus is made here, deterministic (seeded): ENTRIES entries in 2,000 sessions over a
year, user and assistant in turn, ~25 words each from a Zipf-distributed vocabulary of
30,000 made-up words, one entry in ten in Chinese (a pool of 800 characters). It goes in with
bulk SQL (`executemany` on SQLite, COPY on PostgreSQL), not through the app's append path,
words made by `recall.words` as an append makes them.

1. Queries: QUERIES through `SearchIndex.search` (what `memory_search` calls, default limit
   10): single words of ranks 200-20,000, two words, quoted phrases, Chinese of 1, 2 and 3
   characters; after a warm-up pass, PASSES passes, each query's time the median of its
   passes; the median and worst of those, and per kind.
2. Append: a turn's two entries (a user message and the assistant's answer, ~200
   characters each) through `SessionStore.append`, with the index and with it left out
   (`words_of` and `sqlite_words_of` answering None), alternately in rounds in one
   process; median per append (and the means, which hold SQLite's batches into FTS5 and
   the checkpoints of the write-ahead log).
3. Size: the index's bytes (SQLite: the FTS5 shadow tables' pages via `dbstat` or the
   file's growth; PostgreSQL: `pg_total_relation_size`), per million entries.
4. Backfill: BACKFILL entries without words, then `SearchIndex.backfill` until done; time
   per million entries.

``python -m bench search``; NANOBOT_BENCH_ENTRIES (default 1,000,000) and
NANOBOT_BENCH_PG (default postgresql://postgres@127.0.0.1:5432/, skipped when none answers).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nanobot.recall import Search, index_text, terms
from nanobot.store import Database, NewEntry, SessionStore
from nanobot.store import sessions as sessions_module
from nanobot.store.search import SearchIndex

ENTRIES = int(os.environ.get("NANOBOT_BENCH_ENTRIES", "1000000"))
BACKFILL = min(ENTRIES, 200_000)
QUERIES = 100
PASSES = 3
PG = os.environ.get("NANOBOT_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/")
_START = datetime(2025, 1, 1, tzinfo=UTC)
_SYLLABLES = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
_HAN = [chr(0x4E00 + i * 7) for i in range(800)]


def _vocabulary(rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < 30_000:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))))
    ordered = sorted(words)  # a set's order changes from process to process
    rng.shuffle(ordered)
    return ordered


def _corpus(count: int, seed: int = 30) -> Iterator[tuple[int, str, str, str]]:
    """(session, data JSON, created_at, words) for each entry, oldest first."""
    rng = random.Random(seed)
    vocabulary = _vocabulary(random.Random(seed))
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    cumulative = list(_accumulate(weights))
    span = 365 * 86_400 / count
    for n in range(count):
        role = "user" if n % 2 == 0 else "assistant"
        if rng.random() < 0.1:
            text = "".join(rng.choices(_HAN, k=rng.randint(10, 40))) + "。"
        else:
            text = " ".join(rng.choices(vocabulary, cum_weights=cumulative, k=rng.randint(8, 40)))
        stamp = (_START + timedelta(seconds=n * span)).isoformat(timespec="microseconds")
        data = json.dumps({"role": role, "content": text}, ensure_ascii=False)
        yield rng.randrange(1, 2001), data, stamp, index_text(text)


def _accumulate(values: list[float]) -> Iterator[float]:
    total = 0.0
    for value in values:
        total += value
        yield total


def _queries(seed: int = 31) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    vocabulary = _vocabulary(random.Random(30))
    chosen: list[tuple[str, str]] = []
    for _ in range(50):
        chosen.append(("word", vocabulary[rng.randint(200, 20_000)]))
    for _ in range(20):
        chosen.append(
            (
                "two words",
                f"{vocabulary[rng.randint(50, 5000)]} {vocabulary[rng.randint(50, 5000)]}",
            )
        )
    for _ in range(10):
        chosen.append(
            ("phrase", f'"{vocabulary[rng.randint(0, 300)]} {vocabulary[rng.randint(0, 300)]}"')
        )
    for size in (1, 2, 3):
        for _ in range(7 if size == 2 else 6 if size == 1 else 7):
            chosen.append((f"Chinese {size}", "".join(rng.choices(_HAN, k=size))))
    return chosen[:QUERIES]


async def _fill_sqlite(path: Path, count: int, *, words: bool) -> None:
    async with await Database.open(path):
        pass  # migrated
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executemany(
        "INSERT INTO sessions (id, key, created_at) VALUES (?, ?, ?)",
        [(i, f"telegram:{i}", _START.isoformat()) for i in range(1, 2001)],
    )
    batch: list[tuple[int, str, str, str]] = []
    for item in _corpus(count):
        batch.append(item)
        if len(batch) == 20_000:
            _write_sqlite(conn, batch, words)
            batch = []
    _write_sqlite(conn, batch, words)
    if words:  # indexed as they went in: none waits in its row
        conn.execute("UPDATE entry_words_moved SET through = (SELECT MAX(id) FROM entries)")
    else:
        conn.execute("UPDATE search_backfill SET below = (SELECT MAX(id) + 1 FROM entries)")
    conn.commit()
    conn.close()


def _write_sqlite(
    conn: sqlite3.Connection, batch: list[tuple[int, str, str, str]], words: bool
) -> None:
    start = conn.execute("SELECT COALESCE(MAX(id), 0) FROM entries").fetchone()[0] + 1
    conn.executemany(
        "INSERT INTO entries (id, session_id, kind, data, created_at)"
        " VALUES (?, ?, 'message', ?, ?)",
        [(start + i, s, d, c) for i, (s, d, c, _) in enumerate(batch)],
    )
    if words:
        conn.executemany(
            "INSERT INTO entry_words (rowid, words) VALUES (?, ?)",
            [(start + i, w) for i, (_, _, _, w) in enumerate(batch) if w],
        )


async def _fill_postgres(url: str, count: int, *, words: bool) -> None:
    import asyncpg

    async with await Database.open(url):
        pass
    conn = await asyncpg.connect(url)
    try:
        await conn.copy_records_to_table(
            "sessions",
            records=[(i, f"telegram:{i}", _START.isoformat()) for i in range(1, 2001)],
            columns=["id", "key", "created_at"],
        )
        await conn.execute("CREATE TEMP TABLE w (entry_id BIGINT, words TEXT)")
        batch: list[tuple[int, str, str, str]] = []
        n = 0
        for item in _corpus(count):
            batch.append(item)
            if len(batch) == 50_000:
                n = await _write_postgres(conn, batch, n, words)
                batch = []
        await _write_postgres(conn, batch, n, words)
        if words:
            await conn.execute("DROP INDEX entry_words_gin")
            await conn.execute(
                "INSERT INTO entry_words SELECT entry_id, to_tsvector('simple', words) FROM w"
            )
            await conn.execute("CREATE INDEX entry_words_gin ON entry_words USING GIN (words)")
        else:
            await conn.execute(
                "UPDATE search_backfill SET below = (SELECT MAX(id) + 1 FROM entries)"
            )
        for table in ("entries", "sessions"):
            await conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                f" (SELECT MAX(id) FROM {table}))"
            )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def _write_postgres(
    conn: Any, batch: list[tuple[int, str, str, str]], n: int, words: bool
) -> int:
    await conn.copy_records_to_table(
        "entries",
        records=[(n + i + 1, s, "message", d, c) for i, (s, d, c, _) in enumerate(batch)],
        columns=["id", "session_id", "kind", "data", "created_at"],
    )
    if words:
        await conn.copy_records_to_table(
            "w", records=[(n + i + 1, w) for i, (_, _, _, w) in enumerate(batch)]
        )
    return n + len(batch)


async def _query_times(target: Path | str) -> dict[str, Any]:
    async with await Database.open(target) as db:
        index = SearchIndex(db)
        by_kind: dict[str, list[float]] = {}
        every: list[float] = []
        hits = 0
        for _, query in _queries():
            await index.search(Search(terms(query)))  # warm
        passes: list[list[float]] = []
        for _ in range(PASSES):
            passes.append([])
            for _, query in _queries():
                started = time.perf_counter()
                found = await index.search(Search(terms(query)))
                passes[-1].append((time.perf_counter() - started) * 1000)
                hits += len(found.hits)
        for (kind, _), times in zip(_queries(), zip(*passes, strict=True), strict=True):
            elapsed = statistics.median(times)  # each query's median of the passes
            every.append(elapsed)
            by_kind.setdefault(kind, []).append(elapsed)
        size = await _index_bytes(db, target)
    return {
        "median_ms": statistics.median(every),
        "worst_ms": max(every),
        "by_kind": {k: (statistics.median(v), max(v)) for k, v in by_kind.items()},
        "hits": hits,
        "index_bytes": size,
    }


async def _index_bytes(db: Database, target: Path | str) -> int:
    if isinstance(target, str):
        row = await db.fetchone("SELECT pg_total_relation_size('entry_words')")
        return int(row[0]) if row else 0
    try:
        row = await db.fetchone("SELECT SUM(pgsize) FROM dbstat WHERE name LIKE 'entry_words%'")
        return int(row[0]) if row and row[0] else 0
    except Exception:
        row = await db.fetchone(
            "SELECT (SELECT SUM(length(block)) FROM entry_words_data)"
            " + (SELECT SUM(length(sz)) + 8 * COUNT(*) FROM entry_words_docsize)"
        )
        return int(row[0]) if row and row[0] else 0


async def _append_times(
    target: Path | str, rounds: int = 6, per_round: int = 300
) -> dict[str, float]:
    text = "please remind me to water the plants on the balcony every second morning " * 3
    answer = "Sure: I will remind you at eight each second morning, starting tomorrow. " * 3
    names = vars(sessions_module)  # the append's own names for it, swapped for "without"
    originals = {name: names[name] for name in ("words_of", "sqlite_words_of")}
    times: dict[str, list[float]] = {"with": [], "without": []}
    async with await Database.open(target) as db:
        store = SessionStore(db)
        sid = await store.live("bench:append")
        for round_ in range(rounds):
            for mode in ("with", "without") if round_ % 2 == 0 else ("without", "with"):
                for name, original in originals.items():
                    names[name] = original if mode == "with" else (lambda kind, data: None)
                try:
                    for _ in range(per_round):
                        started = time.perf_counter()
                        await store.append(
                            sid,
                            [
                                NewEntry("message", {"role": "user", "content": text}),
                                NewEntry("message", {"role": "assistant", "content": answer}),
                            ],
                        )
                        times[mode].append(time.perf_counter() - started)
                finally:
                    names.update(originals)
    with_, without = statistics.median(times["with"]), statistics.median(times["without"])
    means = {mode: statistics.mean(values) for mode, values in times.items()}
    return {
        "with_us": with_ * 1e6,
        "without_us": without * 1e6,
        "ratio": with_ / without,
        "mean_with_us": means["with"] * 1e6,
        "mean_without_us": means["without"] * 1e6,
    }


async def _backfill_time(target: Path | str) -> float:
    async with await Database.open(target) as db:
        index = SearchIndex(db)
        started = time.perf_counter()
        while not (await index.backfill()).done:
            pass
        return time.perf_counter() - started


async def _postgres_db(name: str) -> str | None:
    import asyncpg

    try:
        conn = await asyncpg.connect(PG + "postgres", timeout=5)
    except (OSError, asyncpg.PostgresError):
        return None
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name}")
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return PG + name


async def _run() -> None:
    print(f"{ENTRIES:,} entries; backfill over {BACKFILL:,}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        backends: list[tuple[str, Path | str, Path | str]] = [
            ("sqlite", Path(tmp) / "search.db", Path(tmp) / "backfill.db")
        ]
        big, small = (
            await _postgres_db("nanobot_bench_search"),
            await _postgres_db("nanobot_bench_backfill"),
        )
        if big is not None and small is not None:
            backends.append(("postgresql", big, small))
        else:
            print("PostgreSQL: none answers, skipped")
        for name, target, other in backends:
            started = time.perf_counter()
            if isinstance(target, Path):
                await _fill_sqlite(target, ENTRIES, words=True)
            else:
                await _fill_postgres(target, ENTRIES, words=True)
            print(f"{name}: corpus made in {time.perf_counter() - started:.0f} s", flush=True)
            queries = await _query_times(target)
            print(
                f"{name}: search median {queries['median_ms']:.1f} ms,"
                f" worst {queries['worst_ms']:.1f} ms ({queries['hits'] // PASSES} hits in"
                f" {QUERIES} queries, each the median of {PASSES})"
            )
            for kind, (median, worst) in queries["by_kind"].items():
                print(f"  {kind:10} median {median:6.1f} ms  worst {worst:6.1f} ms")
            per_million = queries["index_bytes"] * 1_000_000 / ENTRIES
            print(f"{name}: index {per_million / 2**20:.0f} MiB per million entries")
            appends = await _append_times(target)
            print(
                f"{name}: a turn's append {appends['with_us']:.0f} µs with the index, "
                f"{appends['without_us']:.0f} µs without: {appends['ratio']:.2f}×"
                f" (means {appends['mean_with_us']:.0f} / {appends['mean_without_us']:.0f} µs)"
            )
            if isinstance(other, Path):
                await _fill_sqlite(other, BACKFILL, words=False)
            else:
                await _fill_postgres(other, BACKFILL, words=False)
            took = await _backfill_time(other)
            print(
                f"{name}: backfill {took:.1f} s for {BACKFILL:,}:"
                f" {took * 1_000_000 / BACKFILL:.0f} s per million",
                flush=True,
            )


def main() -> None:
    asyncio.run(_run())
