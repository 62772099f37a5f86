"""The state database, behind one interface with two backends.

- `SqliteDatabase` (`nanobot.store.sqlite`): the embedded default, one file in WAL mode,
  reached through one connection in a thread of its own. Several processes may share it.
- `PostgresDatabase` (`nanobot.store.postgres`): a PostgreSQL database through a pool of
  asyncpg connections, for several gateways on one state (imported only when a
  `postgresql://` URL is opened).

`Database.open(target)` picks the backend. The stores write their SQL once, with `?`
placeholders, in what both dialects understand; the rest comes from `Database.dialect`.
Rows come back as `Row`s: columns by index or by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, Self, TypeVar

from nanobot.reserve import DiskReserve
from nanobot.store import url as store_url
from nanobot.store._together import MOST, Together
from nanobot.store.dialect import Dialect
from nanobot.store.failures import FailureWatcher, Watched

T = TypeVar("T")
R = TypeVar("R")

SqlValue = str | int | float | bytes | None
"""A value that can be bound to a `?` placeholder. PostgreSQL takes each as the type of the
column or expression it meets (an int for an INTEGER column, a str for a TEXT one); SQLite
converts more freely, so tests run on both."""

Statement = tuple[str, Sequence[SqlValue]]
"""SQL and its parameters."""

Check = Literal["quick", "full"]
"""How thoroughly `Database.open` checks a SQLite file: SQLite's `quick_check` (every page
and b-tree is well formed; about 0.25 s per 100 MB with the file in the page cache, 2.5 s
from a cold disk) or its `integrity_check` (also that every index matches its table and
every constraint holds; about four times as long). PostgreSQL has no such check: the server
keeps its own pages."""


class Row(Protocol):
    """A result row: `row[0]` or `row["column"]`, and its values in order (sqlite3.Row and
    asyncpg.Record both)."""

    def __getitem__(self, key: int | str, /) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...


class Database(Watched, ABC):
    """An open state database; obtain one with `Database.open(target)`.

    Every method raises `StoreError` (naming the database, its password redacted, and the
    reason) when the backend fails; the driver's error is chained as its cause. A storage
    failure (disk full, an I/O error, …) is told to its watcher first (`open`'s `watch`, see
    `nanobot.store.failures`).

    Concurrency, on both backends: a single statement, and an `atomic` group, is atomic; a
    `transaction()` block is atomic and sees no other writer's half-finished work. Blocks
    with the same `lock` name never overlap, across processes (SQLite serialises every
    write transaction anyway; PostgreSQL runs under READ COMMITTED, where a block that reads
    and then writes what it read must either name a lock or make each write a
    compare-and-set, `UPDATE … WHERE state = ?`).
    """

    dialect: Dialect

    @classmethod
    async def open(
        cls,
        target: Path | str,
        *,
        check: Check | None = "quick",
        reserve: DiskReserve | None = None,
        watch: FailureWatcher | None = None,
    ) -> Database:
        """Open the state database at `target`, check it where the backend can, and bring
        its schema up to date.

        `target` is a SQLite file's path, or a store URL (`sqlite:///<path>` or
        `postgresql://…`). Raises `StoreError` if it cannot be opened (unreachable, refused
        login, missing database, unreadable or damaged file; the message says which, and how
        to restore a damaged file), if its schema is newer than this code (it is left
        untouched), or if a migration fails (it is left at the last good version).
        `check` is for SQLite (see `Check`); None skips it. `reserve` too: a SQLite store
        that meets a full disk releases it and writes again (see `nanobot.reserve`). `watch`
        is told of every storage failure, whichever task's statement met it (none while
        opening: `open` raises those itself).
        """
        database: Database
        if isinstance(target, str) and store_url.backend(target) == "postgresql":
            from nanobot.store.postgres import PostgresDatabase  # asyncpg only when used

            database = await PostgresDatabase.connect(target)
        else:
            from nanobot.store.sqlite import SqliteDatabase

            path = store_url.sqlite_path(target) if isinstance(target, str) else target
            database = await SqliteDatabase.connect(path, check=check, reserve=reserve)
        database._watcher = watch
        return database

    @property
    @abstractmethod
    def name(self) -> str:
        """Where the database is, for messages: the file, or the URL with its password
        replaced by `***`."""

    @property
    @abstractmethod
    def checked(self) -> Check | None:
        """How thoroughly `open` checked the database; None when it did not (skipped, or
        the backend has no check)."""

    @abstractmethod
    async def close(self) -> None:
        """Wait for running statements and transactions to finish, then close. Idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @abstractmethod
    async def execute(self, sql: str, params: Sequence[SqlValue] = ()) -> int:
        """Run one statement; return the number of rows it inserted, updated or deleted.

        Inside `transaction()` (in the same task, or a task it started) the statement joins
        the transaction; otherwise it commits on its own.
        """

    async def write(self, sql: str, params: Sequence[SqlValue] = ()) -> None:
        """Run one statement whose rows and count are not needed."""
        await self.fetchall(sql, params)

    @abstractmethod
    async def fetchall(self, sql: str, params: Sequence[SqlValue] = ()) -> list[Row]:
        """Run one statement and return all its rows."""

    async def fetchone(self, sql: str, params: Sequence[SqlValue] = ()) -> Row | None:
        """Run one statement and return its first row, or None if it returned none.

        All rows are consumed, so an `INSERT … RETURNING` always completes.
        """
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    @abstractmethod
    async def atomic(
        self, statements: Sequence[Statement], *, lock: str | None = None
    ) -> list[list[Row]]:
        """Run `statements` as one transaction; return each statement's rows, in order.

        All or nothing: if one fails, none of them is kept and the error is raised. Prefer
        it to a `transaction()` block when the statements do not depend on each other's
        results: it is sent whole, never holding a connection while the task waits for
        something else. Inside `transaction()` it becomes a savepoint of that transaction.
        `lock` as for `transaction()`.
        """

    @abstractmethod
    def transaction(self, *, lock: str | None = None) -> AbstractAsyncContextManager[None]:
        """A block whose statements are one atomic write.

        Statements from this task, and from tasks it starts inside the block, join the
        transaction. Commits when the block ends; rolls back if the block raises or is
        cancelled before the commit. Nested blocks become savepoints: an inner block that
        raises undoes only its own statements. `lock` names what the block serialises on
        (see the class): another block with the same name, in any process, waits for this
        one to end.
        """

    def together(
        self,
        name: str,
        write: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        *,
        most: int = MOST,
    ) -> Together[T, R] | None:
        """Where tasks may hand in items that `write` writes many at once (`Together`), its
        writes waited for when the database closes; None where a statement costs too little
        for that to gain anything (SQLite: a call in this process). The store then writes
        each item on its own, as it also does where `Together.applies` says no."""
        return None

    @abstractmethod
    async def size_bytes(self) -> int:
        """How much space the database takes: the file and its write-ahead log, or the
        PostgreSQL database."""

    @abstractmethod
    async def schema_version(self) -> int:
        """The schema version the database is at (0 for a new one); writes nothing."""

    @abstractmethod
    async def set_schema_version(self, version: int) -> None:
        """Record `version`; only inside the migration's transaction."""
