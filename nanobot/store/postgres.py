"""The state database on PostgreSQL, through a pool of asyncpg connections.

For several gateways on one state (a cluster) or a state kept off the machine. Imported only
when a `postgresql://` store URL is opened: asyncpg is not loaded otherwise.

Statements run on pooled connections; each is prepared once per connection (asyncpg's
statement cache) with the stores' `?` placeholders numbered (`_placeholders`). A single
statement or an `atomic` group takes a connection for just that long. A `transaction()`
block holds one connection for its whole length: which block a statement belongs to is
carried in a ContextVar, as on SQLite, so it follows the task into the tasks it starts;
those take turns on the connection. Other tasks' statements run meanwhile on other
connections and see only what is committed (READ COMMITTED). A block's `lock` is a
transaction-level advisory lock on the name, so blocks with one name serialise across every
process on the database.

A connection the server ended (a restart, `pg_terminate_backend`) is replaced by the pool.
A statement outside a block that met such an end is sent again on another connection: the
server aborts what it ends, so it runs once. A connection lost without the server saying so
(the network) fails the statement, which may or may not have run, like any lost commit.
Which failure is which, and the line each becomes, is `_postgres_errors.py`.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final, Self, TypeVar

import asyncpg

from nanobot.errors import StoreError
from nanobot.store import migrations
from nanobot.store import url as store_url
from nanobot.store._placeholders import numbered
from nanobot.store._postgres_errors import (
    FAILURES,
    ended_by_server,
    is_storage_failure,
    reason_of,
    scrub,
    unusable,
)
from nanobot.store._together import MOST, Together
from nanobot.store.database import Check, Database, Row, SqlValue, Statement
from nanobot.store.dialect import POSTGRESQL

POOL_SIZE: Final = 10
"""Connections per process at most; one is opened at start, more as statements overlap."""
CONNECT_TIMEOUT: Final = 10.0
_STATEMENT_CACHE: Final = 512  # prepared statements kept per connection

_T = TypeVar("_T")
_R = TypeVar("_R")
_Connection = Any  # asyncpg ships no types


@dataclass(eq=False)
class _Block:
    """A `transaction()` block in progress: its connection, taken in turns by its tasks."""

    db: PostgresDatabase
    conn: _Connection
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    savepoints: int = 0


# The block the current context runs in, if any.
_block: ContextVar[_Block | None] = ContextVar("nanobot_postgres_block", default=None)


class PostgresDatabase(Database):
    """An open PostgreSQL state database; obtain one with `Database.open(url)`.

    A cancelled block is rolled back; a cancelled statement outside one may or may not have
    run (asyncpg asks the server to cancel it).
    """

    dialect = POSTGRESQL

    def __init__(self, pool: Any, url: str) -> None:
        """Wrap an open pool; use `Database.open()` instead."""
        self._pool = pool
        self._name = store_url.redact(url)
        self._secret = store_url.password(url)
        self._closed = False
        # Held by the stores that made them (one each): gone with a store no longer used.
        self._togethers: weakref.WeakSet[Together[Any, Any]] = weakref.WeakSet()
        self._users = 0  # operations under way: close() waits for them
        self._unused = asyncio.Event()
        self._unused.set()

    @property
    def name(self) -> str:
        return self._name

    @property
    def checked(self) -> Check | None:
        return None

    @classmethod
    async def connect(cls, url: str) -> Self:
        """Connect to the database at `url` and bring its schema up to date.

        Raises `StoreError` saying why it cannot be used (unreachable, login refused,
        database missing, schema newer than this code, a failed migration), with the URL's
        password replaced by `***`. The database is left as it was unless a migration ran.
        """
        try:
            pool = await asyncpg.create_pool(
                url,
                min_size=1,
                max_size=POOL_SIZE,
                timeout=CONNECT_TIMEOUT,
                statement_cache_size=_STATEMENT_CACHE,
                server_settings={"application_name": "nanobot"},
                reset=_reset,
            )
        except Exception as exc:  # whatever the URL or the server did, in one line
            raise StoreError(unusable(url, exc, timeout=CONNECT_TIMEOUT)) from exc
        db = cls(pool, url)
        try:
            await migrations.migrate(db)
        except BaseException:
            await db.close()
            raise
        return db

    async def close(self) -> None:
        """Refuse new statements, wait for the running ones and open blocks to finish, then
        close every connection. Idempotent."""
        if self._closed:
            return
        for together in list(self._togethers):  # what was handed in is written first
            await together.close()
        self._closed = True
        await self._unused.wait()
        await self._pool.close()

    def together(
        self,
        name: str,
        write: Callable[[Sequence[_T]], Awaitable[Sequence[_R]]],
        *,
        most: int = MOST,
    ) -> Together[_T, _R]:
        together = Together(write, name=name, most=most, applies=lambda: self._current() is None)
        self._togethers.add(together)
        return together

    async def execute(self, sql: str, params: Sequence[SqlValue] = ()) -> int:
        status = await self._run(lambda conn: conn.execute(numbered(sql), *params))
        return _rowcount(status)

    async def fetchall(self, sql: str, params: Sequence[SqlValue] = ()) -> list[Row]:
        rows: list[Row] = await self._run(lambda conn: conn.fetch(numbered(sql), *params))
        return rows

    async def atomic(
        self, statements: Sequence[Statement], *, lock: str | None = None
    ) -> list[list[Row]]:
        async def run(conn: _Connection) -> list[list[Row]]:
            # Inside a block, asyncpg makes this a savepoint of the block's transaction.
            async with conn.transaction():
                if lock is not None:
                    await conn.execute(_LOCK, lock)
                return [await conn.fetch(numbered(sql), *params) for sql, params in statements]

        async def alone(conn: _Connection) -> list[list[Row]]:
            # Each round trip counts (a statement on SQLite is a local call): one statement
            # without a lock is a transaction of its own; otherwise BEGIN and the lock go
            # out together.
            if lock is None and len(statements) == 1:
                [(sql, params)] = statements
                return [await conn.fetch(numbered(sql), *params)]
            begin = "BEGIN" if lock is None else f"BEGIN; {_LOCK_LITERAL.format(_literal(lock))}"
            await conn.execute(begin)
            try:
                rows = [await conn.fetch(numbered(sql), *params) for sql, params in statements]
                await conn.execute("COMMIT")
            except BaseException:
                if not conn.is_closed() and conn.is_in_transaction():
                    await _undo(conn)
                raise
            return rows

        return await self._run(run if self._current() is not None else alone)

    @asynccontextmanager
    async def transaction(self, *, lock: str | None = None) -> AsyncIterator[None]:
        """Holds one pooled connection for the block; see the module for what others see."""
        outer = self._current()
        if outer is not None:
            async with self._savepoint(outer):
                yield
            return
        async with self._use(), self._connection() as conn:
            tx = conn.transaction()
            await self._finish(tx.start)
            block = _Block(self, conn)
            context = _block.set(block)
            try:
                if lock is not None:
                    await self._run(lambda conn: conn.execute(_LOCK, lock))
                yield
                async with block.turn:
                    await self._finish(tx.commit)
            except BaseException:
                await _undo(conn, tx)
                raise
            finally:
                _block.reset(context)

    async def size_bytes(self) -> int:
        row = await self.fetchone("SELECT pg_database_size(current_database())")
        return int(row[0]) if row else 0

    async def schema_version(self) -> int:
        # Read without creating anything: a newer database must be refused untouched. The
        # catalog is read as a table (this statement's snapshot): to_regclass() would answer
        # from the backend's cache, which may not know yet of a table another migrating
        # process has just committed.
        exists = await self.fetchone(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relname = 'schema_version' AND n.nspname = current_schema())"
        )
        if exists is None or not exists[0]:
            return 0
        row = await self.fetchone("SELECT version FROM schema_version WHERE id = 1")
        return int(row[0]) if row else 0

    async def set_schema_version(self, version: int) -> None:
        await self.execute(
            "CREATE TABLE IF NOT EXISTS schema_version"
            " (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)"
        )
        await self.execute(
            "INSERT INTO schema_version (id, version) VALUES (1, ?)"
            " ON CONFLICT (id) DO UPDATE SET version = excluded.version",
            (version,),
        )

    def _current(self) -> _Block | None:
        block = _block.get()
        return block if block is not None and block.db is self else None

    @asynccontextmanager
    async def _savepoint(self, block: _Block) -> AsyncIterator[None]:
        async with block.turn:
            tx = block.conn.transaction()  # nested in the block's: a savepoint
            await self._finish(tx.start)
        try:
            yield
            async with block.turn:
                await self._finish(tx.commit)
        except BaseException:
            async with block.turn:
                await _undo(block.conn, tx)
            raise

    async def _finish(self, step: Callable[[], Awaitable[None]]) -> None:
        try:
            await step()
        except FAILURES as exc:
            raise self._error(exc) from exc

    @asynccontextmanager
    async def _use(self) -> AsyncIterator[None]:
        """One operation under way (a statement with its retries, or a block)."""
        if self._closed:
            raise StoreError(f"{self._name}: the database is already closed")
        self._users += 1
        self._unused.clear()
        try:
            yield
        finally:
            self._users -= 1
            if not self._users:
                self._unused.set()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[_Connection]:
        try:
            conn = await self._pool.acquire()
        except (*FAILURES, TimeoutError) as exc:
            why = unusable(self._name, exc, timeout=CONNECT_TIMEOUT, secret=self._secret)
            error = StoreError(why)
            raise self._storage_failed(error) from exc  # the server cannot be reached
        try:
            yield conn
        finally:
            await self._pool.release(conn)

    async def _run(self, call: Callable[[_Connection], Awaitable[_T]]) -> _T:
        """Run `call` on this context's block's connection, or on a pooled one; again on
        another when the server ended the connection under it (see the module)."""
        block = self._current()
        if block is not None:
            async with block.turn:
                try:
                    return await call(block.conn)
                except FAILURES as exc:
                    raise self._error(exc) from exc
        async with self._use():
            for attempt in range(POOL_SIZE + 1):
                async with self._connection() as conn:
                    try:
                        return await call(conn)
                    except FAILURES as exc:
                        if attempt < POOL_SIZE and ended_by_server(exc):
                            continue
                        raise self._error(exc) from exc
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _error(self, exc: BaseException) -> StoreError:
        error = StoreError(scrub(f"{self._name}: {reason_of(exc)}", self._secret))
        return self._storage_failed(error) if is_storage_failure(exc) else error


_LOCK: Final = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"
_LOCK_LITERAL: Final = "SELECT pg_advisory_xact_lock(hashtextextended({}, 0))"


def _literal(text: str) -> str:
    """`text` as an SQL string literal (standard_conforming_strings, the default since
    PostgreSQL 9.1: a quote is doubled, a backslash is itself)."""
    return "'" + text.replace("'", "''") + "'"


async def _reset(conn: _Connection) -> None:
    """What a connection going back to the pool needs: only an unfinished transaction ended.

    asyncpg's own reset (advisory unlock, CLOSE ALL, UNLISTEN *, RESET ALL) is a round trip
    on every release, that is on every statement: nanobot leaves nothing else on a pooled
    connection (its locks end with their transaction, it listens on a connection of its own,
    it sets no session settings)."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def _undo(conn: _Connection, tx: Any = None) -> None:
    """Roll `tx` back (or, without it, the transaction `atomic` began by hand); a connection
    that cannot do even that is closed (the pool opens another), which ends the transaction
    on the server too."""
    try:
        await (tx.rollback() if tx is not None else conn.execute("ROLLBACK"))
    except FAILURES:
        with suppress(asyncpg.InterfaceError):  # already gone back to the pool, closed
            conn.terminate()


def _rowcount(status: str) -> int:
    """The row count of a command status ("INSERT 0 3", "UPDATE 2", "DELETE 0", "SELECT 1")."""
    verb, _, rest = status.partition(" ")
    if verb not in {"INSERT", "UPDATE", "DELETE", "MERGE"} or not rest:
        return 0
    return int(rest.rsplit(" ", 1)[-1])
