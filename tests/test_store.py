"""The state store against real SQLite files in a temporary directory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import stat
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import closing
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest

from nanobot.errors import StoreError
from nanobot.store import (
    Access,
    Entry,
    Journal,
    NewEntry,
    Row,
    SessionStore,
    SqlValue,
    migrations,
)
from nanobot.store.access import MAX_PENDING
from nanobot.store.journal import FailedReplies
from nanobot.store.sqlite import SqliteDatabase

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[SqliteDatabase]:
    async with await SqliteDatabase.connect(tmp_path / "state.db") as database:
        yield database


@pytest.fixture
def store(db: SqliteDatabase) -> SessionStore:
    return SessionStore(db)


def message(content: str, role: str = "user") -> NewEntry:
    return NewEntry("message", {"role": role, "content": content})


def contents(entries: Sequence[Entry]) -> list[str]:
    return [str(entry.data["content"]) for entry in entries]


# --- opening -------------------------------------------------------------------------------


async def test_open_creates_directory_and_configures_connection(tmp_path: Path) -> None:
    path = tmp_path / "data" / "nested" / "state.db"
    async with await SqliteDatabase.connect(path) as db:
        assert path.is_file()
        assert db.path == path
        pragmas = {
            name: (await db.fetchone(f"PRAGMA {name}") or [None])[0]
            for name in ("journal_mode", "foreign_keys", "busy_timeout", "synchronous")
        }
        assert pragmas == {
            "journal_mode": "wal",
            "foreign_keys": 1,
            "busy_timeout": 5000,
            "synchronous": 1,  # NORMAL
        }
        version = await db.fetchone("PRAGMA user_version")
        assert version is not None
        assert version[0] == len(migrations.MIGRATIONS)


async def test_reopening_keeps_data_and_does_not_migrate_again(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with await SqliteDatabase.connect(path) as db:
        store = SessionStore(db)
        session = await store.live("telegram:1")
        await store.append(session, [message("hello")])
    async with await SqliteDatabase.connect(path) as db:
        store = SessionStore(db)
        assert await store.live("telegram:1") == session
        assert contents(await store.tail(session, 10)) == ["hello"]


async def test_closed_database_raises_store_error(tmp_path: Path) -> None:
    db = await SqliteDatabase.connect(tmp_path / "state.db")
    await db.close()
    await db.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await db.fetchall("SELECT 1")


# --- entries -------------------------------------------------------------------------------


async def test_append_returns_stored_entries_and_tail_reads_them_back(
    store: SessionStore,
) -> None:
    session = await store.live("discord:42")
    tool_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "ö.md"}'},
            }
        ],
    }
    appended = await store.append(
        session,
        [
            message("grüß dich 👋"),
            NewEntry("message", tool_call, run_id="run-1"),
            NewEntry("message", {"role": "tool", "tool_call_id": "call_1", "content": "…"}),
            NewEntry("note", {"text": "model switched"}),
        ],
    )
    assert [entry.id for entry in appended] == sorted(entry.id for entry in appended)
    assert await store.tail(session, 10) == appended
    first = appended[0]
    assert first.session_id == session
    assert first.created_at.tzinfo is not None
    assert first.created_at.utcoffset() == UTC.utcoffset(None)
    assert appended[1].data == tool_call
    assert appended[1].run_id == "run-1"
    assert await store.count(session) == 4


async def test_tail_returns_most_recent_entries_oldest_first(store: SessionStore) -> None:
    session = await store.live("k")
    other = await store.live("other")
    for i in range(7):
        await store.append(session, [message(f"m{i}")])
        await store.append(other, [message(f"x{i}")])
    assert contents(await store.tail(session, 3)) == ["m4", "m5", "m6"]
    assert contents(await store.tail(session, 100)) == [f"m{i}" for i in range(7)]
    assert await store.tail(session, 0) == []


async def test_tail_pages_backwards_with_before_id(store: SessionStore) -> None:
    session = await store.live("k")
    await store.append(session, [message(f"m{i}") for i in range(25)])
    pages: list[list[str]] = []
    before: int | None = None
    while page := await store.tail(session, 10, before_id=before):
        pages.append(contents(page))
        before = page[0].id
    assert [len(page) for page in pages] == [10, 10, 5]
    assert [text for page in reversed(pages) for text in page] == [f"m{i}" for i in range(25)]


async def test_since_reads_forward_from_an_id(store: SessionStore) -> None:
    session = await store.live("k")
    other = await store.live("other")
    first = await store.append(session, [message(f"m{i}") for i in range(5)])
    await store.append(other, [message("x")])
    await store.append(session, [message("m5")])
    assert contents(await store.since(session, first[2].id, 10)) == ["m3", "m4", "m5"]
    assert contents(await store.since(session, first[2].id, 2)) == ["m3", "m4"]
    assert contents(await store.since(session, 0, 1)) == ["m0"]


async def test_tail_of_a_long_session_reads_only_the_index_range(
    db: SqliteDatabase, store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await store.live("long")
    other = await store.live("other")
    for target in (session, other):
        await db.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10000)"
            " INSERT INTO entries (session_id, kind, data, created_at)"
            " SELECT ?, 'message', json_object('role', 'user', 'content', 'm' || i),"
            " '2025-01-01T00:00:00.000000+00:00' FROM n",
            (target,),
        )
    assert await store.count(session) == 10_000

    issued: list[tuple[str, Sequence[SqlValue]]] = []
    fetchall = type(db).fetchall

    async def recording(
        self: SqliteDatabase, sql: str, params: Sequence[SqlValue] = ()
    ) -> list[Row]:
        issued.append((sql, params))
        return await fetchall(self, sql, params)

    monkeypatch.setattr(type(db), "fetchall", recording)
    assert contents(await store.tail(session, 3)) == ["m9998", "m9999", "m10000"]
    newest = await store.tail(session, 1)
    assert contents(await store.tail(session, 2, before_id=newest[0].id)) == ["m9998", "m9999"]
    queries = issued[:]
    assert len(queries) == 3

    for analyzed in (False, True):
        if analyzed:  # the planner must still pick the index once it has statistics
            await db.execute("ANALYZE")
        for sql, params in queries:
            plan = [
                row["detail"] for row in await fetchall(db, f"EXPLAIN QUERY PLAN {sql}", params)
            ]
            assert plan == ["SEARCH entries USING INDEX entries_session_id (session_id=? AND id<?)"]


async def test_append_to_a_missing_session_raises_and_writes_nothing(
    db: SqliteDatabase, store: SessionStore
) -> None:
    with pytest.raises(StoreError, match="FOREIGN KEY") as raised:
        await store.append(999, [message("lost")])
    assert str(db.path) in str(raised.value)
    assert (await store.stats()).entries == 0


async def test_append_is_all_or_nothing(store: SessionStore) -> None:
    session = await store.live("k")
    with pytest.raises(TypeError):
        await store.append(session, [message("ok"), NewEntry("note", {"bad": {1, 2}})])
    assert await store.count(session) == 0
    assert await store.append(session, []) == []


async def test_concurrent_appends_in_one_process_keep_each_batch_together(
    store: SessionStore,
) -> None:
    session = await store.live("k")
    batches = await asyncio.gather(
        *(store.append(session, [message(f"{b}.{i}") for i in range(5)]) for b in range(20))
    )
    for batch in batches:
        ids = [entry.id for entry in batch]
        assert ids == list(range(ids[0], ids[0] + 5))
    assert await store.count(session) == 100


# --- transactions --------------------------------------------------------------------------


async def test_transaction_rolls_back_everything_when_the_block_raises(
    db: SqliteDatabase, store: SessionStore
) -> None:
    session = await store.live("k")
    with pytest.raises(RuntimeError):
        async with db.transaction():
            await store.append(session, [message("a")])
            await store.archive("k")
            raise RuntimeError("boom")
    assert await store.count(session) == 0
    assert await store.live("k") == session


async def test_nested_transaction_that_raises_undoes_only_itself(
    db: SqliteDatabase, store: SessionStore
) -> None:
    session = await store.live("k")
    async with db.transaction():
        await store.append(session, [message("kept")])
        with pytest.raises(RuntimeError):
            async with db.transaction():
                await store.append(session, [message("undone")])
                raise RuntimeError("inner")
        await store.append(session, [message("also kept")])
    assert contents(await store.tail(session, 10)) == ["kept", "also kept"]


async def test_tasks_started_inside_a_transaction_join_it(
    db: SqliteDatabase, store: SessionStore
) -> None:
    session = await store.live("k")
    with pytest.raises(RuntimeError):
        async with db.transaction():
            await asyncio.wait_for(store.append(session, [message("a")]), timeout=10)
            await asyncio.gather(store.count(session), store.count(session))
            raise RuntimeError("boom")
    assert await store.count(session) == 0


async def test_a_cancelled_transaction_rolls_back_and_releases_the_write_lock(
    db: SqliteDatabase, store: SessionStore
) -> None:
    session = await store.live("k")
    inside = asyncio.Event()

    async def writer() -> None:
        async with db.transaction():
            await store.append(session, [message("pending")])
            inside.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(writer())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.count(session) == 0
    # Another connection (as another process would) gets the write lock at once.
    with closing(sqlite3.connect(db.path, timeout=0, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    assert len(await store.append(session, [message("after")])) == 1


async def statement_started(db: SqliteDatabase, prefix: str) -> asyncio.Event:
    """An event set once the store's thread starts a statement beginning with `prefix`
    (SQLite's trace hook fires as the statement starts, before it waits for any lock)."""
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    def trace(statement: str) -> None:
        if statement.startswith(prefix):
            loop.call_soon_threadsafe(started.set)

    await db._run(lambda conn: conn.set_trace_callback(trace))
    return started


async def test_cancelling_a_transaction_that_waits_for_the_lock_leaves_none_open(
    db: SqliteDatabase, store: SessionStore
) -> None:
    session = await store.live("k")

    async def two() -> None:
        async with db.transaction():
            await store.append(session, [message("x")])
            await store.append(session, [message("y")])

    begun = await statement_started(db, "BEGIN IMMEDIATE")
    with closing(sqlite3.connect(db.path, timeout=0, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        task = asyncio.create_task(two())
        await begun.wait()  # our BEGIN IMMEDIATE is now waiting in the worker thread
        task.cancel()
        other.execute("ROLLBACK")
    with pytest.raises(asyncio.CancelledError):
        await task
    # The abandoned BEGIN then succeeds in the worker thread; it must not stay open.
    assert await store.count(session) == 0
    with closing(sqlite3.connect(db.path, timeout=0, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")


async def test_a_cancelled_atomic_write_is_whole_or_absent_and_leaves_none_open(
    db: SqliteDatabase, store: SessionStore
) -> None:
    # Sent as one: cancelling the caller does not stop it half-way in the worker thread.
    session = await store.live("k")
    begun = await statement_started(db, "BEGIN IMMEDIATE")
    with closing(sqlite3.connect(db.path, timeout=0, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        task = asyncio.create_task(store.append(session, [message("x"), message("y")]))
        await begun.wait()  # the write is in the worker thread, waiting for the lock
        task.cancel()
        other.execute("ROLLBACK")
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.count(session) in (0, 2)
    with closing(sqlite3.connect(db.path, timeout=0, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")


async def test_other_tasks_do_not_see_a_transaction_in_progress(
    db: SqliteDatabase, store: SessionStore
) -> None:
    session = await store.live("k")
    inside = asyncio.Event()
    release = asyncio.Event()

    async def writer() -> None:
        async with db.transaction():
            await store.append(session, [message("pending")])
            inside.set()
            await release.wait()

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(writer())
        await inside.wait()
        reader = tasks.create_task(store.count(session))
        # A "not yet" check: a read that wrongly went ahead would be back from the
        # store's thread well within this (and a false pass here, never a false failure).
        await asyncio.sleep(0.05)
        assert not reader.done()  # it waits for the transaction instead of reading into it
        release.set()
    assert reader.result() == 1


# --- sessions ------------------------------------------------------------------------------


async def test_live_returns_the_same_session_until_archived(store: SessionStore) -> None:
    first = await store.live("telegram:1")
    assert await store.live("telegram:1") == first
    assert await store.live("telegram:2") != first
    await store.append(first, [message("old")])

    assert await store.archive("telegram:1") == first
    assert await store.archive("telegram:1") is None
    second = await store.live("telegram:1")
    assert second != first
    await store.append(second, [message("new")])

    assert contents(await store.tail(first, 10)) == ["old"]
    infos = await store.sessions("telegram:1")
    assert [(info.id, info.entry_count) for info in infos] == [(first, 1), (second, 1)]
    assert infos[0].archived_at is not None
    assert infos[0].archived_at >= infos[0].created_at
    assert infos[1].archived_at is None
    assert len(await store.sessions()) == 3
    assert await store.sessions("nobody") == []


async def test_concurrent_live_calls_agree_on_one_session(store: SessionStore) -> None:
    ids = await asyncio.gather(*(store.live("k") for _ in range(10)))
    assert len(set(ids)) == 1


async def test_execute_returns_the_rows_it_changed(db: SqliteDatabase) -> None:
    await db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)")
    assert await db.execute("INSERT INTO t VALUES ('a', 1), ('b', 1), ('c', 2)") == 3
    assert await db.execute("INSERT INTO t VALUES ('a', 9) ON CONFLICT DO NOTHING") == 0
    async with db.transaction():
        assert await db.execute("UPDATE t SET v = 3 WHERE v = 1") == 2
        assert await db.execute("DELETE FROM t WHERE k = ?", ("zzz",)) == 0
    assert await db.execute("DELETE FROM t") == 3
    assert await db.execute("PRAGMA synchronous = NORMAL") == 0


async def test_statements_sent_at_once_keep_counts_and_transactions_exact(
    db: SqliteDatabase,
) -> None:
    # Statements from many tasks go to the thread without waiting for each other; each
    # `execute` counts only its own changes, and a transaction sees only its own statements.
    await db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    await db.execute("INSERT INTO t VALUES (0, 'x')")

    async def insert(k: int) -> None:
        assert await db.fetchone("INSERT INTO t VALUES (?, 'y') RETURNING k", (k,)) is not None

    async def touch() -> int:
        return await db.execute("UPDATE t SET v = v WHERE k = 0")

    async def rolled_back() -> None:
        with contextlib.suppress(RuntimeError):
            async with db.transaction():
                await db.execute("INSERT INTO t VALUES (-1, 'gone')")
                raise RuntimeError("undo")

    work: list[Coroutine[Any, Any, int | None]] = [insert(k) for k in range(1, 201)]
    work[50:50] = [touch() for _ in range(20)]
    work.insert(100, rolled_back())
    results = await asyncio.gather(*work)
    assert [r for r in results if r is not None] == [1] * 20
    assert tuple(await db.fetchone("SELECT count(*), min(k) FROM t") or ()) == (201, 0)


async def test_atomic_returns_each_statements_rows_or_keeps_nothing(db: SqliteDatabase) -> None:
    await db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    rows = await db.atomic(
        [
            ("INSERT INTO t VALUES (1, 'a') RETURNING k", ()),
            ("INSERT INTO t VALUES (?, ?) RETURNING v", (2, "b")),
            ("UPDATE t SET v = 'c' WHERE k = 1", ()),
            ("SELECT k, v FROM t ORDER BY k", ()),
        ]
    )
    assert [[tuple(r) for r in result] for result in rows] == [
        [(1,)],
        [("b",)],
        [],
        [(1, "c"), (2, "b")],
    ]
    with pytest.raises(StoreError, match="NOT NULL"):
        await db.atomic(
            [("INSERT INTO t VALUES (3, 'd')", ()), ("INSERT INTO t VALUES (4, NULL)", ())]
        )
    assert await db.fetchall("SELECT k FROM t WHERE k > 2") == []  # the first was undone
    [[row]] = await db.atomic([("INSERT INTO t VALUES (3, 'd') RETURNING k", ())])
    assert row["k"] == 3


async def test_atomic_inside_a_transaction_is_a_savepoint_of_it(db: SqliteDatabase) -> None:
    await db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    async with db.transaction():
        await db.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(StoreError, match="UNIQUE"):
            await db.atomic([("INSERT INTO t VALUES (2)", ()), ("INSERT INTO t VALUES (1)", ())])
        await db.atomic([("INSERT INTO t VALUES (3)", ())])
    assert [r[0] for r in await db.fetchall("SELECT k FROM t ORDER BY k")] == [1, 3]


async def test_atomic_waits_for_another_tasks_transaction(db: SqliteDatabase) -> None:
    await db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    inside, release = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        async with db.transaction():
            await db.execute("INSERT INTO t VALUES (1)")
            inside.set()
            await release.wait()
            await db.execute("DELETE FROM t WHERE k = 1")

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(writer())
        await inside.wait()
        other = tasks.create_task(db.atomic([("SELECT count(*) FROM t", ())]))
        await asyncio.sleep(0.05)  # a "not yet" check, as in the test of `transaction()`
        assert not other.done()
        release.set()
    assert other.result()[0][0][0] == 0  # it ran after the transaction, not inside it


async def test_close_lets_statements_already_sent_finish(tmp_path: Path) -> None:
    db = await SqliteDatabase.connect(tmp_path / "state.db")
    await db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    inserts = [
        asyncio.ensure_future(db.fetchone("INSERT INTO t VALUES (?) RETURNING k", (k,)))
        for k in range(100)
    ]
    await asyncio.sleep(0)  # each task runs to its first wait: its statement is sent
    await db.close()
    assert [tuple(row or ()) for row in await asyncio.gather(*inserts)] == [
        (k,) for k in range(100)
    ]
    async with await SqliteDatabase.connect(tmp_path / "state.db") as again:
        assert tuple(await again.fetchone("SELECT count(*) FROM t") or ()) == (100,)


async def test_streams_are_remembered_until_finished_and_pruned_when_stale(
    db: SqliteDatabase,
) -> None:
    journal = Journal(db)
    await journal.stream_started("telegram-7", 41)
    await journal.stream_started("telegram-7", 42)  # posted again: the newer message counts
    await journal.stream_started("discord-8", 99)
    assert await journal.open_streams() == {"telegram-7": 42, "discord-8": 99}
    await journal.stream_finished("discord-8")
    await journal.stream_finished("never-started")
    assert await journal.open_streams() == {"telegram-7": 42}
    # Pruning forgets finished journal rows and streams older than the window, nothing else.
    inbound = await journal.accept("telegram", "m1", {"text": "hi"})
    assert inbound is not None
    await journal.complete([inbound], ("telegram", {"text": "hello"}))
    pending = await journal.accept("telegram", "m2", {"text": "still owed"})
    assert await journal.prune(timedelta(days=7)) == 0
    assert await journal.prune(timedelta(seconds=-1)) == 2  # the answered message, the stream
    assert await journal.open_streams() == {}
    assert [p.id for p in await journal.pending_inbound()] == [pending]
    assert [o.message for o in await journal.pending_outbox()] == [{"text": "hello"}]


async def test_a_reply_refused_for_good_is_failed_with_its_reason_and_never_owed(
    db: SqliteDatabase,
) -> None:
    journal = Journal(db)
    assert await journal.failed_replies() == FailedReplies(0)
    blocked = await journal.enqueue("telegram", {"text": "to a blocked chat"})
    gone = await journal.enqueue("discord", {"text": "to a deleted channel"})
    owed = await journal.enqueue("telegram", {"text": "still owed"})
    await journal.fail(blocked, "sendMessage: Internal Server Error")  # a try that may pass
    await journal.give_up(blocked, "Forbidden: bot was blocked by the user")
    await journal.give_up(gone, "404 Not Found (error code: 10003): Unknown Channel")
    await journal.confirm(owed)
    await journal.give_up(owed, "too late: it was delivered")  # only a pending reply fails
    assert await journal.pending_outbox() == []
    failed = await journal.failed_replies()
    assert (failed.count, failed.last_reason) == (
        2,
        "404 Not Found (error code: 10003): Unknown Channel",
    )
    assert failed.last_at is not None and failed.last_at.tzinfo is not None
    row = await db.fetchone("SELECT state, attempts FROM outbox WHERE id = ?", (blocked,))
    assert row is not None and tuple(row) == ("failed", 2)
    # Kept like delivered replies: pruned once older than the window, and not before.
    assert await journal.prune(timedelta(days=7)) == 0
    assert await journal.prune(timedelta(seconds=-1)) == 3
    assert await journal.failed_replies() == FailedReplies(0)


async def test_stats_count_sessions_entries_and_bytes(
    db: SqliteDatabase, store: SessionStore
) -> None:
    session = await store.live("a")
    await store.live("b")
    await store.archive("b")
    await store.append(session, [message("x" * 1000) for _ in range(3)])
    stats = await store.stats()
    assert (stats.sessions, stats.live_sessions, stats.entries) == (2, 1, 3)
    assert stats.size_bytes >= db.path.stat().st_size > 0


# --- several processes ---------------------------------------------------------------------

WRITER = """
import asyncio, sys
from pathlib import Path
from nanobot.store import Database, NewEntry, SessionStore

async def main(path: str, name: str, count: int) -> None:
    async with await Database.open(Path(path)) as db:
        store = SessionStore(db)
        session = await store.live("shared")
        for i in range(count):
            entries = [NewEntry("note", {"writer": name, "i": i})]
            await store.append(session, entries)
    print(session)

print("ready", flush=True)
sys.stdin.readline()
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def test_processes_appending_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.db"  # fresh: the writers also race to create and migrate it
    writers, count = ("a", "b", "c"), 200
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WRITER,
            str(path),
            name,
            str(count),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        for name in writers
    ]
    for proc in procs:  # start together once every interpreter has imported the store
        assert proc.stdout is not None
        assert await proc.stdout.readline() == b"ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
    outputs = await asyncio.gather(*(proc.communicate() for proc in procs))

    for proc, (_, stderr) in zip(procs, outputs, strict=True):
        assert stderr.decode() == ""  # in particular, no "database is locked"
        assert proc.returncode == 0
    assert len({stdout for stdout, _ in outputs}) == 1  # one shared live session
    async with await SqliteDatabase.connect(path) as db:
        store = SessionStore(db)
        session = await store.live("shared")
        entries = await store.tail(session, 10 * count)
    assert len(entries) == len(writers) * count
    for name in writers:
        assert [e.data["i"] for e in entries if e.data["writer"] == name] == list(range(count))


# --- files that must not be touched --------------------------------------------------------


def _real_database(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE t (x TEXT)")
        conn.executemany("INSERT INTO t VALUES (?)", [("x" * 200,)] * 500)
        conn.commit()


def _random_bytes(path: Path) -> None:
    path.write_bytes(os.urandom(8192))


def _text(path: Path) -> None:
    path.write_text("sessions:\n  - hello\n")


def _truncated(path: Path) -> None:
    _real_database(path)
    path.write_bytes(path.read_bytes()[:6000])


@pytest.mark.parametrize("damage", [_random_bytes, _text, _truncated])
async def test_a_corrupt_file_stops_open_and_is_left_untouched(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    path = tmp_path / "state.db"
    damage(path)
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not a usable nanobot database") as raised:
        await SqliteDatabase.connect(path)
    assert str(path) in str(raised.value)
    assert path.read_bytes() == before


async def test_an_outbox_from_before_part_counting_is_upgraded_intact(tmp_path: Path) -> None:
    # Schema 4 had no outbox.parts_sent: a reply still pending there comes back with 0.
    path = tmp_path / "state.db"
    with closing(sqlite3.connect(path)) as conn:
        for version, script in enumerate(migrations.MIGRATIONS[:4], start=1):
            conn.executescript(script)
            conn.execute(f"PRAGMA user_version = {version}")
        conn.execute(
            "INSERT INTO outbox (channel, message, created_at) VALUES ('telegram', ?, ?)",
            ('{"text": "from before the upgrade"}', "2026-01-01T00:00:00+00:00"),
        )
        conn.commit()
    async with await SqliteDatabase.connect(path) as db:
        journal = Journal(db)
        [pending] = await journal.pending_outbox()
        assert (pending.message["text"], pending.parts_sent) == ("from before the upgrade", 0)
        await journal.progress(pending.id, 2)
        [pending] = await journal.pending_outbox()
        assert pending.parts_sent == 2
        await journal.confirm(pending.id)
        await journal.progress(pending.id, 3)  # late: a delivered reply is left alone
        row = await db.fetchone("SELECT parts_sent FROM outbox WHERE id = ?", (pending.id,))
        assert row is not None and row[0] == 2


@pytest.mark.parametrize("wal", [False, True])
async def test_a_database_from_a_newer_version_is_refused_untouched(
    tmp_path: Path, wal: bool
) -> None:
    path = tmp_path / "state.db"
    if wal:
        await (await SqliteDatabase.connect(path)).close()
    else:
        _real_database(path)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA user_version = 99")
    before = path.read_bytes()
    with pytest.raises(StoreError, match="schema version 99") as raised:
        await SqliteDatabase.connect(path)
    assert str(path) in str(raised.value)
    assert path.read_bytes() == before


async def test_a_failing_migration_leaves_the_last_good_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.db"
    async with await SqliteDatabase.connect(path) as db:
        session = await SessionStore(db).live("k")
    broken = (*migrations.MIGRATIONS, "CREATE TABLE extra (x); CREATE TABLE broken (")
    monkeypatch.setattr(migrations, "MIGRATIONS", broken)
    failing = len(broken)
    with pytest.raises(StoreError, match=f"migration {failing} failed") as raised:
        await SqliteDatabase.connect(path)
    assert str(path) in str(raised.value)

    monkeypatch.undo()
    async with await SqliteDatabase.connect(path) as db:
        assert await SessionStore(db).live("k") == session
        assert await db.fetchone("SELECT name FROM sqlite_master WHERE name = 'extra'") is None
        version = await db.fetchone("PRAGMA user_version")
        assert version is not None
        assert version[0] == failing - 1


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


async def test_the_database_its_wal_and_shm_and_a_new_folder_are_private(tmp_path: Path) -> None:
    path = tmp_path / "data" / "state.db"
    with umask(0):  # the most open umask: the modes must not depend on it
        async with await SqliteDatabase.connect(path) as db:
            await SessionStore(db).live("k")
            files = [path, path.with_name("state.db-wal"), path.with_name("state.db-shm")]
            assert {file.name: mode(file) for file in files} == {
                "state.db": 0o600,
                "state.db-wal": 0o600,
                "state.db-shm": 0o600,
            }
    assert mode(path.parent) == 0o700


async def test_opening_takes_others_access_to_an_existing_database_away(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with umask(0o022):
        async with await SqliteDatabase.connect(path) as first:
            await SessionStore(first).live("k")
            # Made by an older nanobot, or another process, with the usual 0644.
            for file in (path, path.with_name("state.db-wal"), path.with_name("state.db-shm")):
                file.chmod(0o644)
            async with await SqliteDatabase.connect(path) as second:
                assert await SessionStore(second).live("k")
            for file in (path, path.with_name("state.db-wal"), path.with_name("state.db-shm")):
                assert mode(file) == 0o600, file.name


async def test_a_directory_in_place_of_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.mkdir()
    with pytest.raises(StoreError, match="is a directory") as raised:
        await SqliteDatabase.connect(path)
    assert str(path) in str(raised.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes any file")
async def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    await (await SqliteDatabase.connect(path)).close()
    path.chmod(0)
    try:
        with pytest.raises(StoreError, match="permission denied") as raised:
            await SqliteDatabase.connect(path)
        assert str(path) in str(raised.value)
    finally:
        path.chmod(0o600)


async def test_disk_full_raises_a_clear_error_and_keeps_earlier_entries(
    db: SqliteDatabase, store: SessionStore
) -> None:
    session = await store.live("k")
    earlier = await store.append(session, [message(f"m{i}") for i in range(10)])
    pages = await db.fetchone("PRAGMA page_count")
    assert pages is not None
    await db.fetchall(f"PRAGMA max_page_count = {pages[0]}")

    big = [message("x" * 20_000) for _ in range(5)]
    with pytest.raises(StoreError) as raised:
        await store.append(session, big)
    assert str(raised.value).startswith(f"disk full while writing {db.path}")

    assert await store.tail(session, 100) == earlier
    await db.fetchall("PRAGMA max_page_count = 1073741823")
    assert len(await store.append(session, big)) == 5  # the connection is usable again


# --- access: pairing requests ----------------------------------------------------------------


async def test_a_user_keeps_one_pairing_code_while_it_is_valid(db: SqliteDatabase) -> None:
    access = Access(db)
    first = await access.request("telegram", "7", "7", "Eve")
    again = await access.request("telegram", "7", "7", "Eve")
    assert first.new and not again.new and again.code == first.code
    assert [r.user_id for r in await access.pending()] == ["7"]


async def test_a_full_channel_replaces_its_oldest_request(db: SqliteDatabase) -> None:
    access = Access(db)
    users = [str(n) for n in range(MAX_PENDING)]
    issued = [await access.request("telegram", user, user, None) for user in users]
    await access.request("discord", "1", "1", None)  # another channel's count is its own
    assert [i.evicted for i in issued] == [0] * MAX_PENDING
    newcomer = await access.request("telegram", "new", "new", None)
    assert newcomer.new and newcomer.evicted == 1
    telegram = [r.user_id for r in await access.pending() if r.channel == "telegram"]
    assert telegram == [*users[1:], "new"]
    assert await access.waiting() == {"discord": 1, "telegram": MAX_PENDING}
    assert await access.approve(issued[0].code) is None  # its code no longer works
    assert await access.approve(newcomer.code) is not None
    back = await access.request("telegram", "0", "0", None)  # writing again: a fresh code
    assert back.new and back.code != issued[0].code and back.evicted == 0


async def test_expired_requests_neither_wait_nor_take_room(db: SqliteDatabase) -> None:
    access = Access(db)
    for user in range(MAX_PENDING):
        await access.request("telegram", str(user), str(user), None)
    await db.execute("UPDATE pairing_requests SET expires_at = '2000-01-01T00:00:00+00:00'")
    assert await access.waiting() == {} and await access.pending() == []
    assert (await access.request("telegram", "new", "new", None)).evicted == 0


# --- damage found at open ------------------------------------------------------------------


async def filled(path: Path) -> None:
    """A database with one session of 50 entries (about 40 pages of them), then closed: the
    write-ahead log is folded into the file, so its pages hold everything."""
    async with await SqliteDatabase.connect(path) as db:
        store = SessionStore(db)
        session = await store.live("telegram:1")
        await store.append(session, [message("x" * 3000) for _ in range(50)])
        await Journal(db).accept("telegram", "1", {"text": "waiting"})
    assert not path.with_name(path.name + "-wal").exists()


def overwrite(path: Path, table: str) -> list[int]:
    """Overwrite every page of `table` (not of its indexes) with junk; returns their numbers."""
    with closing(sqlite3.connect(path)) as conn:
        pages = [
            row[0] for row in conn.execute("SELECT pageno FROM dbstat WHERE name = ?", (table,))
        ]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    with path.open("r+b") as file:
        for page in pages:
            file.seek((page - 1) * size)
            file.write(b"\xa5" * size)
    return pages


@pytest.mark.parametrize("table", ["entries", "inbound", "sessions"])
async def test_a_table_with_overwritten_pages_is_refused_with_how_to_restore(
    tmp_path: Path, table: str
) -> None:
    path = tmp_path / "state.db"
    await filled(path)
    assert overwrite(path, table)
    before = path.read_bytes()
    with pytest.raises(StoreError) as raised:
        await SqliteDatabase.connect(path)
    text = str(raised.value)
    assert text.startswith(f"{path} is damaged; SQLite's quick check found:\n")
    assert f"table {table}: database disk image is malformed" in text
    for advice in (
        "stop nanobot",
        "keep a copy of state.db",
        "put back a backup of state.db",
        "move it aside",
        "loses the sessions",
        "cron jobs",
        "approval rules",
    ):
        assert advice in text
    assert path.read_bytes() == before


def skip_index(path: Path, index: str, on: bool) -> None:
    """Make writes skip (or use again) index `index`, through the schema text: rows written
    meanwhile are missing from it, which only the full check notices."""
    with closing(sqlite3.connect(path)) as conn:
        (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (index,)).fetchone()
        conn.execute("PRAGMA writable_schema = ON")
        sql = sql + " WHERE 0" if on else sql.removesuffix(" WHERE 0")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (sql, index))
        conn.commit()


async def test_an_index_that_misses_rows_is_found_by_the_full_check_only(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    await filled(path)
    skip_index(path, "entries_session_id", on=True)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(
            "INSERT INTO entries (session_id, kind, data, created_at)"
            " VALUES (1, 'message', '{}', '2025-01-01')"
        )
        conn.commit()
    skip_index(path, "entries_session_id", on=False)

    async with await SqliteDatabase.connect(path) as db:  # the quick check sees well-formed pages
        assert await db.damage() == []
        assert "row 51 missing from index entries_session_id" in await db.damage(full=True)
    with pytest.raises(StoreError, match="SQLite's full check found:\n  row 51 missing from"):
        await SqliteDatabase.connect(path, check="full")
