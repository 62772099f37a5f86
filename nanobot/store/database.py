"""The state database: one SQLite file in WAL mode, reached through one connection that lives
in a thread of its own.

The thread runs sqlite3 for the event loop (no statement blocks it): statements queue up and
run one at a time, in the order they were sent, and their results go back to the loop in
batches, one wake-up for all that finished together. Several processes (the gateway and CLI
commands) may use the same file at once: WAL lets readers and one writer proceed together,
writers wait up to the busy timeout for each other, and every multi-statement write is a
short `BEGIN IMMEDIATE` transaction.

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
import os
import queue
import sqlite3
import stat
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from contextvars import ContextVar
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self, TypeVar

from nanobot.errors import StoreError
from nanobot.store import migrations

SqlValue = str | int | float | bytes | None
"""A value that can be bound to a `?` placeholder."""

Statement = tuple[str, Sequence[SqlValue]]
"""SQL and its parameters."""

Check = Literal["quick", "full"]
"""How thoroughly `Database.open` checks the file: SQLite's `quick_check` (every page and
b-tree is well formed; about 0.25 s per 100 MB with the file in the page cache, 2.5 s from
a cold disk) or its `integrity_check` (also that every index matches its table and every
constraint holds; about four times as long)."""

BUSY_TIMEOUT_MS: Final = 5000
PRIVATE_FILE_MODE: Final = 0o600
"""The mode of the database and its -wal and -shm files: they hold every conversation."""
# Results go back to the loop at least this often while statements keep coming.
_SETTLE_EVERY: Final = 64
# The most problems a check reports, and how many of them an error message shows.
_FINDINGS: Final = 100
_SHOWN: Final = 5

_T = TypeVar("_T")

# The token of the transaction the current context runs in, if any.
_transaction: ContextVar[object | None] = ContextVar("nanobot_store_transaction", default=None)


class Database:
    """An open state database; obtain one with `Database.open(path)`.

    Every method raises `StoreError` (naming the file and the reason) when SQLite fails; the
    original `sqlite3.Error` is chained as its cause. A cancelled transaction is rolled back
    (the cancellation completes once it is, which can take up to the busy timeout if it was
    waiting for the write lock); a cancelled standalone statement (or `atomic` group) may or
    may not have run.
    """

    def __init__(self, worker: _Worker, path: Path) -> None:
        """Wrap a connection's open worker thread; use `open()` instead."""
        self._worker = worker
        self._path = path
        self._lock = asyncio.Lock()  # held by a transaction() block for its whole length
        self._active: object | None = None  # token of the transaction in progress
        self._savepoints = 0
        self._closed = False

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @classmethod
    async def open(cls, path: Path, *, check: Check | None = "quick") -> Self:
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
        """
        path, uri = await asyncio.to_thread(_locate, path)
        try:
            worker = await _Worker.start(uri)
        except sqlite3.Error as exc:
            raise StoreError(_describe(path, exc)) from exc
        db = cls(worker, path)
        try:
            await db._probe()
            if check is not None and (findings := await db.damage(full=check == "full")):
                raise StoreError(_damaged(path, check, findings))
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

        def run(conn: sqlite3.Connection) -> int:
            # The schema has no triggers, so the change in total_changes is the statement's
            # rowcount (which sqlite3 leaves at -1 for some statements); nothing else runs
            # on the connection in between.
            before = conn.total_changes
            conn.execute(sql, params).fetchall()
            return conn.total_changes - before

        return await self._run(run)

    async def write(self, sql: str, params: Sequence[SqlValue] = ()) -> None:
        """Run one statement whose rows and count are not needed."""
        await self.fetchall(sql, params)

    async def fetchall(self, sql: str, params: Sequence[SqlValue] = ()) -> list[sqlite3.Row]:
        """Run one statement and return all its rows (columns by index or by name)."""

        def run(conn: sqlite3.Connection) -> list[sqlite3.Row]:
            return conn.execute(sql, params).fetchall()

        return await self._run(run)

    async def fetchone(self, sql: str, params: Sequence[SqlValue] = ()) -> sqlite3.Row | None:
        """Run one statement and return its first row, or None if it returned none.

        All rows are consumed, so an `INSERT … RETURNING` always completes.
        """
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def atomic(self, statements: Sequence[Statement]) -> list[list[sqlite3.Row]]:
        """Run `statements` as one transaction, sent to the thread as one; returns each
        statement's rows, in order.

        All or nothing: if one fails, none of them is kept and the error is raised. Unlike a
        `transaction()` block it never holds the connection while the event loop is busy
        elsewhere, so prefer it when the statements do not depend on each other's results.
        Inside `transaction()` (in the same task) it becomes a savepoint of that transaction.
        """
        nested = self._in_transaction()
        begin, end, undo = (
            ("SAVEPOINT atomic", "RELEASE atomic", ("ROLLBACK TO atomic", "RELEASE atomic"))
            if nested
            else ("BEGIN IMMEDIATE", "COMMIT", ("ROLLBACK",))
        )

        def run(conn: sqlite3.Connection) -> list[list[sqlite3.Row]]:
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
    async def transaction(self) -> AsyncIterator[None]:
        """Make the statements run in the block one atomic write.

        Statements from this task, and from tasks it starts inside the block, join the
        transaction; every other task's statements wait until the block ends, so keep it
        short (and see `atomic`). Starts with `BEGIN IMMEDIATE`: the write lock is taken up
        front (waiting up to the busy timeout for other processes), so the transaction never
        fails half-way for want of it. Commits when the block ends; rolls back if the block
        raises or is cancelled before the commit. Nested blocks become savepoints: an inner
        block that raises undoes only its own statements.
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
        with the file, one problem a line (at most `_FINDINGS`); empty when it is sound.

        Reads every page, writing nothing; other statements wait meanwhile (see `Check`
        for how long it takes). Where damage stops the check itself, each table is checked
        on its own, so the lines name the damaged tables.
        """
        pragma = "integrity_check" if full else "quick_check"
        return await self._run(lambda conn: _check(conn, pragma))

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
        await self._worker.submit(lambda conn: _rollback(conn, sql))

    async def _statement(self, sql: str) -> None:
        try:
            await self._worker.submit(lambda conn: conn.execute(sql).fetchall())
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
        return self._worker.submit(call)

    async def _probe(self) -> None:
        """Read the header and schema, writing nothing, before anything else touches the file."""
        await self._statement(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        await self._statement("SELECT count(*) FROM sqlite_master")
        row = await self.fetchone("PRAGMA user_version")
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


class _Worker:
    """The thread that owns the sqlite3 connection and runs calls on it, one at a time, in
    the order they were submitted."""

    def __init__(self, loop: asyncio.AbstractEventLoop, uri: str) -> None:
        self._loop = loop
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._opened: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(
            target=self._serve, args=(uri,), name="nanobot-sqlite", daemon=True
        )

    @classmethod
    async def start(cls, uri: str) -> _Worker:
        """Open `uri` (autocommit; rows by index or by name) in a new thread.

        Raises:
            sqlite3.Error: it could not be opened (the thread has ended).
        """
        worker = cls(asyncio.get_running_loop(), uri)
        worker._thread.start()
        await worker._opened
        return worker

    def submit(self, call: Callable[[sqlite3.Connection], _T]) -> asyncio.Future[_T]:
        """Queue `call(connection)`; the future gets its result or exception. Never blocks."""
        future: asyncio.Future[_T] = self._loop.create_future()
        self._queue.put((call, future))
        return future

    async def stop(self) -> None:
        """Close the connection once every call submitted so far has run; end the thread."""
        try:
            await self.submit(_close)
        finally:
            self._queue.put(None)

    def _serve(self, uri: str) -> None:
        try:
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
        except BaseException as exc:  # noqa: BLE001 - handed to the task opening it
            self._settle([(self._opened, None, exc)])
            return
        done: list[_Done] = [(self._opened, None, None)]
        while True:
            try:
                job = self._queue.get(block=not done)
            except queue.Empty:  # nothing more for now: hand back what has finished
                self._settle(done)
                done = []
                continue
            if job is None:
                self._settle(done)
                return
            call, future = job
            try:
                done.append((future, call(conn), None))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                done.append((future, None, exc))
            if len(done) >= _SETTLE_EVERY:
                self._settle(done)
                done = []

    def _settle(self, done: list[_Done]) -> None:
        # One wake-up of the loop for every result that is ready.
        if done:
            with suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                self._loop.call_soon_threadsafe(_resolve, done)


_Job = tuple[Callable[[sqlite3.Connection], Any], "asyncio.Future[Any]"]
_Done = tuple["asyncio.Future[Any]", Any, BaseException | None]


def _resolve(done: list[_Done]) -> None:
    for future, result, exc in done:
        if future.cancelled():  # its task was cancelled while the call ran
            continue
        if exc is None:
            future.set_result(result)
        else:
            future.set_exception(exc)


def _close(conn: sqlite3.Connection) -> None:
    conn.close()


def _rollback(conn: sqlite3.Connection, sql: str) -> None:
    # After SQLITE_FULL or an I/O error SQLite may already have rolled the whole
    # transaction back, and then ROLLBACK itself fails; the original error is the one
    # worth reporting, and the connection is out of the transaction either way.
    with suppress(sqlite3.Error):
        conn.execute(sql).fetchall()


def _check(conn: sqlite3.Connection, pragma: str) -> list[str]:
    try:
        return _findings(conn.execute(f"PRAGMA {pragma}({_FINDINGS})").fetchall())
    except sqlite3.DatabaseError as exc:
        if not _is_damage(exc):
            raise
        stopped = str(exc)
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    findings = []
    for (table,) in tables:
        quoted = '"' + str(table).replace('"', '""') + '"'
        try:
            found = _findings(conn.execute(f"PRAGMA {pragma}({quoted})").fetchall())
        except sqlite3.DatabaseError as exc:
            if not _is_damage(exc):
                raise
            found = [str(exc)]
        findings += [f"table {table}: {line}" for line in found]
    return findings or [stopped]


def _findings(rows: list[sqlite3.Row]) -> list[str]:
    """A check's rows as problems, one a line; none for its single "ok"."""
    lines = [
        line.strip()
        for row in rows
        for line in str(row[0]).splitlines()
        if line.strip() and not line.startswith("*** in database")
    ]
    return [] if lines == ["ok"] else lines


def _is_damage(exc: sqlite3.Error) -> bool:
    return _primary(exc) in {"SQLITE_NOTADB", "SQLITE_CORRUPT"}


def _primary(exc: sqlite3.Error) -> str:
    """The primary error code's name: extended codes (SQLITE_IOERR_WRITE, …) share its meaning."""
    return "_".join(getattr(exc, "sqlite_errorname", "").split("_")[:2])


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
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not exists:
            _create_private(path)
    except OSError as exc:
        raise StoreError(f"cannot create {exc.filename or path}: {exc.strerror}") from exc
    for file in (path, *_companions(path)):
        _make_private(file)
    # mode=rw refuses to create: if the file vanishes between this check and the connect,
    # opening fails loudly instead of starting over with an empty database.
    return path, f"{path.as_uri()}?mode=rw"


def _companions(path: Path) -> tuple[Path, Path]:
    """The -wal and -shm files SQLite keeps beside the database in WAL mode."""
    return path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")


def _create_private(path: Path) -> None:
    """Create `path` empty (SQLite takes an empty file for an empty database), readable and
    writable by its owner only whatever the umask. SQLite gives the -wal and -shm files it
    creates the mode of the database file, so they are private too."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    except FileExistsError:  # another process made it meanwhile: it is opened like any other
        return
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)


def _make_private(file: Path) -> None:
    """Take group and others' access to `file` away, if it exists and has any (a database
    made by an older nanobot, or copied in)."""
    # PermissionError: not its owner, yet allowed to read and write it; it is left as it is.
    with suppress(FileNotFoundError, PermissionError):
        mode = stat.S_IMODE(file.stat().st_mode)
        if mode & 0o077:
            file.chmod(mode & 0o700)


def _describe(path: Path, exc: sqlite3.Error) -> str:
    """One line for a human: which file, what went wrong, and what to do if it is obvious."""
    name = _primary(exc)
    if name == "SQLITE_FULL":
        return f"disk full while writing {path}; the write was not saved"
    if name == "SQLITE_IOERR":
        return f"disk I/O error on {path} ({exc})"
    if _is_damage(exc):
        return f"{path} is not a usable nanobot database ({exc}). {_restoring(path)}"
    if name == "SQLITE_BUSY":
        return (
            f"{path} stayed locked by another process for over {BUSY_TIMEOUT_MS // 1000} s ({exc})"
        )
    if name in {"SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_READONLY", "SQLITE_AUTH"}:
        return f"cannot open {path} for reading and writing ({exc})"
    return f"{path}: {exc}"


def _damaged(path: Path, check: Check, findings: list[str]) -> str:
    """The refusal of a damaged file: which, what the check found, how to restore it."""
    shown = [f"  {line}" for line in findings[:_SHOWN]]
    if len(findings) > _SHOWN:
        more = len(findings) - _SHOWN
        shown.append(f"  (and {more}{'+' if len(findings) >= _FINDINGS else ''} more)")
    return "\n".join(
        [
            f"{path} is damaged; SQLite's {check} check found:",
            *shown,
            f"It was left as it is, unused. {_restoring(path)}",
        ]
    )


def _restoring(path: Path) -> str:
    """How to get going again with a damaged database, and what each way loses."""
    return (
        f"To restore: stop nanobot, keep a copy of {path.name} (with {path.name}-wal and "
        f"{path.name}-shm if present), then put back a backup of {path.name}, or move it "
        "aside to start with an empty one, which loses the sessions (conversations), the "
        "messages still waiting for an answer or a delivery, cron jobs, pairings, approval "
        "rules and the usage history."
    )


def _file_sizes(path: Path) -> int:
    total = 0
    for file in (path, path.with_name(path.name + "-wal")):
        with suppress(FileNotFoundError):
            total += file.stat().st_size
    return total
