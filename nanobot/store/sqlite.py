"""The embedded state database: one SQLite file in WAL mode, reached through one connection
that lives in a thread of its own.

The thread (`_sqlite_thread.Worker`) runs sqlite3 for the event loop (no statement blocks
it): statements queue up and run one at a time, in the order they were sent, and their
results go back to the loop in batches, one wake-up for all that finished together. Several
processes (the gateway and CLI commands) may use the same file at once: WAL lets readers and
one writer proceed together, writers wait up to the busy timeout for each other, and every
multi-statement write is a short `BEGIN IMMEDIATE` transaction.

Within one process the connection is shared by all tasks. Single statements, and `atomic`
groups of them (one transaction, sent as one), go to the thread as they come: each runs
whole before the next, so nothing interleaves with them. A `transaction()` block, whose
statements the task sends one by one, has the connection to itself: it takes a lock, and
until it ends every other task's statements wait, so it sees only its own statements and no
other task's half-finished writes. Which transaction a statement belongs to is carried in a
ContextVar, so it follows the task into the tasks it starts (`wait_for`, `gather`) instead
of deadlocking them on the lock.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from contextvars import ContextVar
from pathlib import Path
from typing import Self, TypeVar

from nanobot.errors import StoreError
from nanobot.reserve import DiskReserve
from nanobot.store import migrations
from nanobot.store._sqlite_file import (
    BUSY_TIMEOUT_MS,
    damaged,
    describe,
    file_sizes,
    find_damage,
    is_full,
    locate,
    storage_failure,
)
from nanobot.store._sqlite_thread import Worker
from nanobot.store.database import Check, Database, Row, SqlValue, Statement
from nanobot.store.dialect import SQLITE

_T = TypeVar("_T")

# The token of the transaction the current context runs in, if any.
_transaction: ContextVar[object | None] = ContextVar("nanobot_store_transaction", default=None)


class SqliteDatabase(Database):
    """An open SQLite state database; obtain one with `Database.open(path)`.

    Every method raises `StoreError` (naming the file and the reason) when SQLite fails; the
    original `sqlite3.Error` is chained as its cause. A cancelled transaction is rolled back
    (the cancellation completes once it is, which can take up to the busy timeout if it was
    waiting for the write lock); a cancelled standalone statement (or `atomic` group) may or
    may not have run.
    """

    def __init__(self, worker: Worker, path: Path, reserve: DiskReserve | None = None) -> None:
        """Wrap a connection's open worker thread; use `open()` instead."""
        self._worker = worker
        self._path = path
        self._reserve = reserve
        self._lock = asyncio.Lock()  # held by a transaction() block for its whole length
        self._active: object | None = None  # token of the transaction in progress
        self._savepoints = 0
        self._closed = False
        self._checked: Check | None = None

    dialect = SQLITE

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @property
    def name(self) -> str:
        return str(self._path)

    @property
    def checked(self) -> Check | None:
        return self._checked

    @classmethod
    async def connect(
        cls, path: Path, *, check: Check | None = "quick", reserve: DiskReserve | None = None
    ) -> Self:
        """Open (or create) the database at `path`, check it, and bring its schema up to date.

        Creates the parent directory (0700) and the file only if they are missing. The file
        and its -wal and -shm companions are readable by their owner only (0600), whatever
        the umask; existing ones that are more open lose group and others' access. Raises
        `StoreError` if the file is not a readable SQLite database, if `check` finds it
        damaged (the message names what is wrong and how to restore it), if its schema is
        newer than this code, or if a migration fails. A file that exists is never deleted,
        truncated or replaced; on failure it is left exactly as it was found.

        The check runs before anything is written, for every caller by default (the
        gateway, the agent and every command): a damaged file is refused before a message
        is acknowledged or a command's change is written into it. `check=None` skips it.

        With `reserve`, a statement that meets a full disk (SQLITE_FULL) releases it, in the
        worker thread, and runs again once: a standalone statement or `atomic` group whole,
        a statement of a `transaction()` block (COMMIT included) when SQLite kept the
        transaction open; where SQLite rolled the transaction back, the block fails as
        without a reserve (its next attempt has the room).
        """
        path, uri = await asyncio.to_thread(locate, path)
        try:
            worker = await Worker.start(uri)
        except sqlite3.Error as exc:
            raise StoreError(describe(path, exc)) from exc
        db = cls(worker, path, reserve)
        try:
            await db._probe()
            if check is not None and (findings := await db.damage(full=check == "full")):
                raise StoreError(damaged(path, check, findings))
            db._checked = check
            await db._configure()
            await migrations.migrate(db)
        except BaseException:
            await worker.stop()
            raise
        return db

    async def close(self) -> None:
        """Wait for running statements and transactions to finish, then close. Idempotent."""
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            # Queued behind every statement already sent, which therefore all complete.
            await self._worker.stop()

    async def execute(self, sql: str, params: Sequence[SqlValue] = ()) -> int:
        def run(conn: sqlite3.Connection) -> int:
            # The schema has no triggers, so the change in total_changes is the statement's
            # rowcount (which sqlite3 leaves at -1 for some statements); nothing else runs
            # on the connection in between.
            before = conn.total_changes
            conn.execute(sql, params).fetchall()
            return conn.total_changes - before

        return await self._run(run)

    async def fetchall(self, sql: str, params: Sequence[SqlValue] = ()) -> list[Row]:
        def run(conn: sqlite3.Connection) -> list[Row]:
            return conn.execute(sql, params).fetchall()

        return await self._run(run)

    async def atomic(
        self, statements: Sequence[Statement], *, lock: str | None = None
    ) -> list[list[Row]]:
        """Sent to the thread as one: nothing else runs on the connection meanwhile, and
        `BEGIN IMMEDIATE` serialises it with every other writer, whatever its `lock`."""
        nested = self._in_transaction()
        begin, end, undo = (
            ("SAVEPOINT atomic", "RELEASE atomic", ("ROLLBACK TO atomic", "RELEASE atomic"))
            if nested
            else ("BEGIN IMMEDIATE", "COMMIT", ("ROLLBACK",))
        )

        def run(conn: sqlite3.Connection) -> list[list[Row]]:
            conn.execute(begin)
            try:
                rows = [conn.execute(sql, params).fetchall() for sql, params in statements]
                conn.execute(end)
            except BaseException:
                for sql in undo:
                    _rollback(conn, sql)
                raise
            return rows

        return await self._run(run)

    @asynccontextmanager
    async def transaction(self, *, lock: str | None = None) -> AsyncIterator[None]:
        """Every other task's statements wait until the block ends, so keep it short (and
        see `atomic`). Starts with `BEGIN IMMEDIATE`: the write lock is taken up front
        (waiting up to the busy timeout for other processes), so the transaction never fails
        half-way for want of it, and every block is serialised with every other writer,
        whatever its `lock`.
        """
        if self._in_transaction():
            async with self._savepoint():
                yield
            return
        async with self._lock:
            token = object()
            self._active = token
            context = _transaction.set(token)
            try:
                # Inside the try: a cancelled BEGIN still runs in the worker thread, and the
                # ROLLBACK queued behind it must undo it.
                await self._statement("BEGIN IMMEDIATE")
                yield
                await self._statement("COMMIT")
            except BaseException:
                await self._rollback("ROLLBACK")
                raise
            finally:
                self._active = None
                _transaction.reset(context)

    async def damage(self, *, full: bool = False) -> list[str]:
        """What SQLite's `quick_check` (or, with `full`, its `integrity_check`) finds wrong
        with the file, one problem a line (at most `FINDINGS`); empty when it is sound.

        Reads every page, writing nothing; other statements wait meanwhile (see `Check`
        for how long it takes). Where damage stops the check itself, each table is checked
        on its own, so the lines name the damaged tables.
        """
        pragma = "integrity_check" if full else "quick_check"
        return await self._run(lambda conn: find_damage(conn, pragma))

    async def size_bytes(self) -> int:
        """The size of the database file plus its write-ahead log, in bytes."""
        return await asyncio.to_thread(file_sizes, self._path)

    async def schema_version(self) -> int:
        row = await self.fetchone("PRAGMA user_version")
        return int(row[0]) if row else 0

    async def set_schema_version(self, version: int) -> None:
        await self.execute(f"PRAGMA user_version = {int(version)}")

    @asynccontextmanager
    async def _savepoint(self) -> AsyncIterator[None]:
        self._savepoints += 1
        name = f"sp{self._savepoints}"
        try:
            await self._statement(f"SAVEPOINT {name}")
            yield
            await self._statement(f"RELEASE {name}")
        except BaseException:
            await self._rollback(f"ROLLBACK TO {name}")
            await self._rollback(f"RELEASE {name}")
            raise
        finally:
            self._savepoints -= 1

    async def _rollback(self, sql: str) -> None:
        await self._worker.submit(lambda conn: _rollback(conn, sql))

    async def _statement(self, sql: str) -> None:
        try:
            await self._worker.submit(self._with_room(lambda conn: conn.execute(sql).fetchall()))
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _in_transaction(self) -> bool:
        return self._active is not None and _transaction.get() is self._active

    async def _run(self, call: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `call` in the thread: at once inside this task's transaction or when no
        transaction holds the connection; else as soon as the one that does has ended."""
        try:
            if self._in_transaction() or not self._lock.locked():
                return await self._send(call)
            async with self._lock:
                # Queued now, ahead of whatever takes the lock next; awaited without it.
                sent = self._send(call)
            return await sent
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _send(self, call: Callable[[sqlite3.Connection], _T]) -> asyncio.Future[_T]:
        if self._closed:
            raise StoreError(f"{self._path}: the database is already closed")
        return self._worker.submit(self._with_room(call))

    def _with_room(
        self, call: Callable[[sqlite3.Connection], _T]
    ) -> Callable[[sqlite3.Connection], _T]:
        """`call`, run once more after a full disk if releasing the reserve made room and
        the connection is in the transaction state it was in before (see `connect`)."""
        reserve = self._reserve
        if reserve is None:
            return call

        def run(conn: sqlite3.Connection) -> _T:
            was = conn.in_transaction
            try:
                return call(conn)
            except sqlite3.Error as exc:
                if not is_full(exc) or not reserve.release() or conn.in_transaction != was:
                    raise
            return call(conn)

        return run

    async def _probe(self) -> None:
        """Read the header and schema, writing nothing, before anything else touches the file."""
        await self._statement(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        await self._statement("SELECT count(*) FROM sqlite_master")
        migrations.check_version(self.name, await self.schema_version())

    async def _configure(self) -> None:
        row = await self.fetchone("PRAGMA journal_mode = WAL")
        if row is None or str(row[0]).lower() != "wal":
            raise StoreError(f"{self._path}: cannot switch to WAL mode (got {row and row[0]})")
        await self.execute("PRAGMA foreign_keys = ON")
        # NORMAL is durable against application crashes in WAL mode; only a power cut can
        # lose the last commits, never corrupt the file.
        await self.execute("PRAGMA synchronous = NORMAL")

    def _error(self, exc: sqlite3.Error) -> StoreError:
        error = StoreError(describe(self._path, exc))
        return self._storage_failed(error) if storage_failure(exc) else error


def _rollback(conn: sqlite3.Connection, sql: str) -> None:
    # After SQLITE_FULL or an I/O error SQLite may already have rolled the whole
    # transaction back, and then ROLLBACK itself fails; the original error is the one
    # worth reporting, and the connection is out of the transaction either way.
    with suppress(sqlite3.Error):
        conn.execute(sql).fetchall()
