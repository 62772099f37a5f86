"""The state database: one SQLite file in WAL mode, reached through one aiosqlite connection.

aiosqlite runs sqlite3 in its own thread, so no statement blocks the event loop. Several
processes (the gateway and CLI commands) may use the same file at once: WAL lets readers and
one writer proceed together, writers wait up to the busy timeout for each other, and every
multi-statement write is a short `BEGIN IMMEDIATE` transaction.

Within one process the connection is shared by all tasks. A transaction has it to itself:
it takes a lock, waits for statements already sent to finish, and until it ends every other
statement waits, so it sees only its own statements and no other task's half-finished
writes. Reads and single-statement writes that return rows (`fetchall`, `fetchone`) do not
wait for each other: outside transactions they go to aiosqlite's thread as they come (it
runs them one at a time, in order), instead of each waiting a round trip through the busy
event loop for the one before. Which transaction a statement belongs to is carried in a
ContextVar, so it follows the task into the tasks it starts (`wait_for`, `gather`) instead
of deadlocking them on the lock.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from contextvars import ContextVar
from pathlib import Path
from types import TracebackType
from typing import Final, Self, TypeVar

import aiosqlite

from nanobot.errors import StoreError
from nanobot.store import migrations

SqlValue = str | int | float | bytes | None
"""A value that can be bound to a `?` placeholder."""

BUSY_TIMEOUT_MS: Final = 5000

_T = TypeVar("_T")

# The token of the transaction the current context runs in, if any.
_transaction: ContextVar[object | None] = ContextVar("nanobot_store_transaction", default=None)


class Database:
    """An open state database; obtain one with `Database.open(path)`.

    Every method raises `StoreError` (naming the file and the reason) when SQLite fails; the
    original `sqlite3.Error` is chained as its cause. A cancelled transaction is rolled back
    (the cancellation completes once it is, which can take up to the busy timeout if it was
    waiting for the write lock); a cancelled standalone statement may or may not have run.
    """

    def __init__(self, connection: aiosqlite.Connection, path: Path) -> None:
        """Wrap an already open connection; use `open()` instead."""
        self._conn = connection
        self._path = path
        self._lock = asyncio.Lock()  # held by a transaction, or an `execute` (see there)
        self._sent = 0  # statements sent without the lock and not finished
        self._idle = asyncio.Event()  # set when _sent is 0
        self._idle.set()
        self._active: object | None = None  # token of the transaction in progress
        self._savepoints = 0
        self._closed = False

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @classmethod
    async def open(cls, path: Path) -> Self:
        """Open (or create) the database at `path` and bring its schema up to date.

        Creates the parent directory and the file only if they are missing. Raises
        `StoreError` if the file is not a readable SQLite database, if its schema is newer
        than this code, or if a migration fails. A file that exists is never deleted,
        truncated or replaced; on failure it is left exactly as it was found.
        """
        path, uri = await asyncio.to_thread(_locate, path)
        connection = await _connect(path, uri)
        db = cls(connection, path)
        try:
            await db._probe()
            await db._configure()
            await migrations.migrate(db)
        except BaseException:
            await connection.close()
            raise
        return db

    async def close(self) -> None:
        """Wait for running statements and transactions to finish, then close. Idempotent."""
        async with self._lock:
            await self._idle.wait()
            self._closed = True
            await self._conn.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def execute(self, sql: str, params: Sequence[SqlValue] = ()) -> int:
        """Run one statement that returns no rows; return the number of rows it changed.

        Inside `transaction()` (in the same task) the statement joins the transaction;
        otherwise it commits on its own.
        """

        async def run() -> int:
            # One trip to aiosqlite's thread instead of two (a cursor needs closing in a
            # second one). The schema has no triggers, so the change in total_changes is the
            # statement's rowcount: it runs under the lock, with no other statement sent.
            before = self._conn.total_changes
            await self._conn.execute_fetchall(sql, params)
            return self._conn.total_changes - before

        return await self._run(run)

    async def write(self, sql: str, params: Sequence[SqlValue] = ()) -> None:
        """Run one statement whose rows and count are not needed.

        Like `fetchall`, it does not wait for other statements outside transactions, where
        `execute` (which must count) does.
        """
        await self.fetchall(sql, params)

    async def fetchall(self, sql: str, params: Sequence[SqlValue] = ()) -> list[sqlite3.Row]:
        """Run one statement and return all its rows (columns by index or by name)."""

        async def run() -> list[sqlite3.Row]:
            return list(await self._conn.execute_fetchall(sql, params))

        return await self._run(run, shared=True)

    async def fetchone(self, sql: str, params: Sequence[SqlValue] = ()) -> sqlite3.Row | None:
        """Run one statement and return its first row, or None if it returned none.

        All rows are consumed, so an `INSERT … RETURNING` always completes.
        """
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """Make the statements run in the block one atomic write.

        Statements from this task, and from tasks it starts inside the block, join the
        transaction; every other task's statements wait until the block ends, so keep it
        short. Starts with `BEGIN IMMEDIATE`: the write lock is taken up front (waiting up
        to the busy timeout for other processes), so the transaction never fails half-way
        for want of it. Commits when the block ends; rolls back if the block raises or is
        cancelled before the commit. Nested blocks become savepoints: an inner block that
        raises undoes only its own statements.
        """
        if self._in_transaction():
            async with self._savepoint():
                yield
            return
        async with self._lock:
            await self._idle.wait()
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

    async def size_bytes(self) -> int:
        """The size of the database file plus its write-ahead log, in bytes."""
        return await asyncio.to_thread(_file_sizes, self._path)

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
        # After SQLITE_FULL or an I/O error SQLite may already have rolled the whole
        # transaction back, and then ROLLBACK itself fails; the original error is the one
        # worth reporting, and the connection is out of the transaction either way.
        with suppress(sqlite3.Error):
            await self._conn.execute_fetchall(sql)

    async def _statement(self, sql: str) -> None:
        try:
            await self._conn.execute_fetchall(sql)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _in_transaction(self) -> bool:
        return self._active is not None and _transaction.get() is self._active

    async def _run(self, operation: Callable[[], Awaitable[_T]], *, shared: bool = False) -> _T:
        """Run `operation` inside this task's transaction; else, if `shared` and no
        transaction holds or awaits the connection, at once; else alone under the lock."""
        try:
            if self._in_transaction():
                return await operation()
            if shared and not self._lock.locked():
                return await self._send(operation)
            async with self._lock:
                await self._idle.wait()
                return await self._send(operation)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    async def _send(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        if self._closed:
            raise StoreError(f"{self._path}: the database is already closed")
        # Counted from here: `operation` hands its statement to aiosqlite's queue before it
        # first suspends, so a transaction that finds nothing counted is next in that queue.
        self._sent += 1
        self._idle.clear()
        try:
            return await operation()
        finally:
            self._sent -= 1
            if not self._sent:
                self._idle.set()

    async def _probe(self) -> None:
        """Read the header and schema, writing nothing, before anything else touches the file."""
        try:
            await self._conn.execute_fetchall(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            await self._conn.execute_fetchall("SELECT count(*) FROM sqlite_master")
            row = await self.fetchone("PRAGMA user_version")
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        version = int(row[0]) if row else 0
        migrations.check_version(self._path, version)

    async def _configure(self) -> None:
        row = await self.fetchone("PRAGMA journal_mode = WAL")
        if row is None or str(row[0]).lower() != "wal":
            raise StoreError(f"{self._path}: cannot switch to WAL mode (got {row and row[0]})")
        await self.execute("PRAGMA foreign_keys = ON")
        # NORMAL is durable against application crashes in WAL mode; only a power cut can
        # lose the last commits, never corrupt the file.
        await self.execute("PRAGMA synchronous = NORMAL")

    def _error(self, exc: sqlite3.Error) -> StoreError:
        return StoreError(_describe(self._path, exc))


def _locate(path: Path) -> tuple[Path, str]:
    """Return the absolute path and the URI to open it with, creating only the directory.

    Raises `StoreError` for problems SQLite would report less clearly.
    """
    path = path.absolute()
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a database file")
    exists = path.exists()
    # SQLite would silently open an unwritable file read-only and fail at the first write.
    if exists and not os.access(path, os.R_OK | os.W_OK):
        raise StoreError(
            f"cannot open {path}: permission denied (it must be readable and writable)"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the directory for {path}: {exc.strerror}") from exc
    # mode=rw refuses to create: if the file vanishes between this check and the connect,
    # opening fails loudly instead of starting over with an empty database.
    return path, f"{path.as_uri()}?mode={'rw' if exists else 'rwc'}"


async def _connect(path: Path, uri: str) -> aiosqlite.Connection:
    try:
        connection = await aiosqlite.connect(uri, uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreError(_describe(path, exc)) from exc
    connection.row_factory = sqlite3.Row
    return connection


def _describe(path: Path, exc: sqlite3.Error) -> str:
    """One line for a human: which file, what went wrong, and what to do if it is obvious."""
    # Extended codes (SQLITE_IOERR_WRITE, SQLITE_BUSY_RECOVERY, …) share their primary's meaning.
    name = "_".join(getattr(exc, "sqlite_errorname", "").split("_")[:2])
    if name == "SQLITE_FULL":
        return f"disk full while writing {path}; the write was not saved"
    if name == "SQLITE_IOERR":
        return f"disk I/O error on {path} ({exc})"
    if name in {"SQLITE_NOTADB", "SQLITE_CORRUPT"}:
        return (
            f"{path} is not a usable nanobot database ({exc}); it was left untouched. "
            "Move it aside or restore a backup, then start again."
        )
    if name == "SQLITE_BUSY":
        return (
            f"{path} stayed locked by another process for over {BUSY_TIMEOUT_MS // 1000} s ({exc})"
        )
    if name in {"SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_READONLY", "SQLITE_AUTH"}:
        return f"cannot open {path} for reading and writing ({exc})"
    return f"{path}: {exc}"


def _file_sizes(path: Path) -> int:
    total = 0
    for file in (path, path.with_name(path.name + "-wal")):
        with suppress(FileNotFoundError):
            total += file.stat().st_size
    return total
