"""`Database.open(watch=…)`: storage failures are reported to the watcher, whoever met them; what a
statement itself got wrong is not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nanobot.errors import StoreError
from nanobot.store import Database


class Watcher:
    def __init__(self) -> None:
        self.errors: list[StoreError] = []

    def store_failed(self, error: StoreError) -> None:
        self.errors.append(error)


@pytest.fixture
def watcher() -> Watcher:
    return Watcher()


@pytest.fixture
async def db(tmp_path: Path, watcher: Watcher) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db", watch=watcher) as database:
        await database.execute("CREATE TABLE t (x TEXT UNIQUE)")
        yield database


async def full(db: Database) -> None:
    """The file may grow no more: SQLite's own SQLITE_FULL, as on a full disk."""
    pages = await db.fetchone("PRAGMA page_count")
    assert pages is not None
    await db.fetchall(f"PRAGMA max_page_count = {pages[0]}")


async def test_a_full_disk_is_reported_with_the_error_the_caller_gets(
    db: Database, watcher: Watcher
) -> None:
    await full(db)
    with pytest.raises(StoreError, match="disk full") as raised:
        await db.execute("INSERT INTO t VALUES (?)", ("x" * 40_000,))
    assert watcher.errors == [raised.value]

    async with db.transaction():  # a statement of a transaction, and a transaction's end
        await db.execute("INSERT INTO t VALUES ('small')")
    with pytest.raises(StoreError, match="disk full"):
        async with db.transaction():
            await db.execute("INSERT INTO t VALUES (?)", ("y" * 40_000,))
    with pytest.raises(StoreError, match="disk full"):
        await db.atomic([("INSERT INTO t VALUES (?)", ("z" * 40_000,))])
    assert len(watcher.errors) == 3


async def test_a_read_only_database_is_reported(db: Database, watcher: Watcher) -> None:
    await db.fetchall("PRAGMA query_only = ON")
    with pytest.raises(StoreError, match="readonly"):
        await db.execute("INSERT INTO t VALUES ('a')")
    assert len(watcher.errors) == 1


async def test_what_a_statement_got_wrong_is_not_a_storage_failure(
    db: Database, watcher: Watcher
) -> None:
    await db.execute("INSERT INTO t VALUES ('a')")
    with pytest.raises(StoreError, match="UNIQUE"):
        await db.execute("INSERT INTO t VALUES ('a')")
    with pytest.raises(StoreError, match="no such table"):
        await db.fetchall("SELECT * FROM missing")
    assert watcher.errors == []
