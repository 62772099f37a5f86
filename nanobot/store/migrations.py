"""How the state database's schema evolves, for both backends.

The scripts are in `store.schema`: `MIGRATIONS[n]` takes the database from schema version
`n` to `n + 1`. Each script runs in its own transaction together with the version bump, so a
failing script leaves the database exactly at the previous version. The version lives in
SQLite's `PRAGMA user_version`, and in PostgreSQL's one-row table `schema_version`.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Final

from nanobot.errors import StoreError
from nanobot.store.dialect import Dialect
from nanobot.store.schema import MIGRATIONS, POSTGRESQL_EXTRA, SQLITE_EXTRA

if TYPE_CHECKING:
    from nanobot.store.database import Database

MIGRATING: Final = "nanobot.migrate"
"""The lock (`Database.transaction`) under which every migration step runs: several
processes starting at once on a fresh database migrate it once."""

__all__ = ["MIGRATING", "MIGRATIONS", "POSTGRESQL_EXTRA", "check_version", "migrate", "script"]


def script(version: int, dialect: Dialect) -> str:
    """The script that takes a database to `version` (from `version - 1`), in `dialect`."""
    text = dialect.render(MIGRATIONS[version - 1])
    extra = POSTGRESQL_EXTRA if dialect.name == "postgresql" else SQLITE_EXTRA
    if version in extra:
        text += "\n" + extra[version]
    return text


def check_version(name: str, version: int) -> None:
    """Raise `StoreError` if the database `name` is newer than this code understands."""
    if version > len(MIGRATIONS):
        raise StoreError(
            f"{name} has schema version {version}, but this nanobot only knows versions up to "
            f"{len(MIGRATIONS)}; it was left untouched. Upgrade nanobot to use it."
        )


async def migrate(db: Database) -> int:
    """Apply the missing migrations in order and return the resulting schema version.

    Safe when several processes open a fresh database at once: each step runs under the
    `MIGRATING` lock and re-reads the version first, so every script runs exactly once.
    Raises `StoreError` if a script fails (the database stays at the last good version) or
    if the schema is newer than this code (checked before anything is written).
    """
    version = await db.schema_version()
    check_version(db.name, version)
    while version < len(MIGRATIONS):
        async with db.transaction(lock=MIGRATING):
            version = await db.schema_version()
            check_version(db.name, version)
            if version < len(MIGRATIONS):
                await _apply(db, version)
                version += 1
    return version


async def _apply(db: Database, version: int) -> None:
    try:
        for statement in _statements(script(version + 1, db.dialect)):
            await db.execute(statement)
        await db.set_schema_version(version + 1)
    except StoreError as exc:
        raise StoreError(
            f"schema migration {version + 1} failed, {db.name} was left at version {version}: {exc}"
        ) from exc


def _statements(text: str) -> list[str]:
    """Split a script into statements; `complete_statement` knows about strings and triggers."""
    statements: list[str] = []
    pending = ""
    for piece in text.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\n;"):
                statements.append(pending.strip())
            pending = ""
    if pending.strip(" \t\n;"):
        statements.append(pending.strip())
    return statements
