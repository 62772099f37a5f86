"""What only the SQLite store does: its file (created private, checked for damage, never
touched when refused), its pragmas, its single connection's ordering, and several processes
sharing one file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import stat
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import closing
from datetime import timedelta
from pathlib import Path

import pytest

from nanobot.errors import StoreError
from nanobot.store import (
    Access,
    ApprovalStore,
    Entry,
    Journal,
    NewEntry,
    Row,
    SessionStore,
    SqlValue,
    UsageLedger,
    migrations,
)
from nanobot.store.cron import CronStore
from nanobot.store.members import Members
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


# --- transactions --------------------------------------------------------------------------


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


async def test_stats_count_the_file_and_its_log(db: SqliteDatabase, store: SessionStore) -> None:
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


@pytest.mark.process
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


# --- a database made by an earlier nanobot -------------------------------------------------

EARLIER = ROOT / "tests" / "data" / "state_49e2274.sql"


def shape(path: Path) -> dict[str, object]:
    """Every table's columns, indexes and foreign keys, as SQLite reports them."""
    with closing(sqlite3.connect(path)) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
                " AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        found: dict[str, object] = {}
        for table in tables:
            indexes = {
                index[1]: (
                    index[2],
                    index[4],
                    conn.execute(f"PRAGMA index_info({index[1]})").fetchall(),
                )
                for index in conn.execute(f"PRAGMA index_list({table})")
            }
            found[table] = (
                conn.execute(f"PRAGMA table_info({table})").fetchall(),
                indexes,
                conn.execute(f"PRAGMA foreign_key_list({table})").fetchall(),
            )
        return found


async def test_a_database_made_by_the_previous_code_opens_migrates_and_reads(
    tmp_path: Path,
) -> None:
    path, fresh = tmp_path / "state.db", tmp_path / "fresh.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(EARLIER.read_text(encoding="utf-8"))
    async with await SqliteDatabase.connect(path, check="full") as db:
        assert await db.schema_version() == len(migrations.MIGRATIONS)
        store = SessionStore(db)
        [archived, live] = await store.sessions("telegram:1")
        assert archived.archived_at is not None and live.archived_at is None
        assert contents(await store.tail(archived.id, 10)) == ["hi", "hello"]
        journal = Journal(db)
        assert [p.message["text"] for p in await journal.pending_inbound()] == ["still owed"]
        owed = [(o.message["text"], o.parts_sent) for o in await journal.pending_outbox()]
        assert owed == [("hello", 0), ("a reply still owed", 1)]
        assert await journal.open_streams() == {"telegram-9": 42}
        assert await journal.last_seen("telegram", timedelta(days=36500)) == {"1": "101"}
        assert [u.user_id for u in await Access(db).allowed()] == ["1"]
        [job] = await CronStore(db).list()
        [run] = await CronStore(db).runs(job.id)
        assert (job.name, run.status) == ("daily", "ok")
        assert job.to == "@1"  # a Telegram private chat, named for its user since schema 16
        approvals = ApprovalStore(db)
        [rule] = await approvals.rules()
        assert rule.rule_key == "ls"
        places = await db.fetchall("SELECT DISTINCT request_id FROM approval_places")
        for (request_id,) in places:
            request = await approvals.get(request_id)
            assert request is not None and len(request.asked.places) == 2
        assert (await UsageLedger(db).totals()).cost == 0.25
        assert [m.pid for m in await Members(db).all()] == [42]
    await (await SqliteDatabase.connect(fresh)).close()
    assert shape(path) == shape(fresh)
