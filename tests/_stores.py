"""The state store's backends for tests: a fresh SQLite file, or a fresh PostgreSQL database
on 127.0.0.1:5432, made for one test and dropped after it.

PostgreSQL is reached as `$PGUSER` (else `postgres`) without a password (the local server's
trust authentication). Where none answers, every PostgreSQL case is skipped with one line,
`UNREACHABLE`; `.ci/run` starts the local server when one is installed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, Literal

import asyncpg
import pytest

Backend = Literal["sqlite", "postgres"]
BACKENDS: Final[tuple[Backend, ...]] = ("sqlite", "postgres")

HOST: Final = "127.0.0.1"
PORT: Final = 5432
USER: Final = os.environ.get("PGUSER") or "postgres"
UNREACHABLE: Final = (
    f"no PostgreSQL answers on {HOST}:{PORT} as {USER}: the store's PostgreSQL cases are "
    "skipped (.ci/run starts a local server when one is installed)"
)

_unreachable: set[str] = set()  # the URL no server answered, once asked
_answered: set[str] = set()  # the URL a server answered


def url(database: str, *, user: str = USER, password: str | None = None) -> str:
    """A URL of `database` on the test server."""
    secret = f":{password}" if password is not None else ""
    return f"postgresql://{user}{secret}@{HOST}:{PORT}/{database}"


async def admin() -> Any:
    """A connection to the server's `postgres` database; skips the test when none answers."""
    conn = None
    if not _unreachable:
        try:
            conn = await asyncpg.connect(url("postgres"), timeout=5)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            _unreachable.add(url("postgres"))
    if conn is None:
        pytest.skip(UNREACHABLE)  # one place: the skips add up to one line of the summary
    return conn


def reachable() -> bool:
    """Whether the server answers (asked once per run, before the tests)."""
    if not _unreachable and not _answered:

        async def probe() -> None:
            conn = await asyncpg.connect(url("postgres"), timeout=5)
            await conn.close()

        try:
            asyncio.run(probe())
            _answered.add(url("postgres"))
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            _unreachable.add(url("postgres"))
    return not _unreachable


def skip_unreachable(items: list[pytest.Item]) -> None:
    """Mark the PostgreSQL cases among `items` skipped when no server answers: the summary
    then folds them into one line per file, with one reason."""
    cases = [item for item in items if on_postgres(item)]
    if cases and not reachable():
        for item in cases:
            item.add_marker(pytest.mark.skip(reason=UNREACHABLE))


def on_postgres(item: pytest.Item) -> bool:
    """Whether `item` runs on the PostgreSQL server (by the fixtures it takes)."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("store_target") == "postgres":
        return True
    return "postgres_url" in getattr(item, "fixturenames", ())


@asynccontextmanager
async def fresh_database() -> AsyncIterator[str]:
    """The URL of a new, empty database with a random name, dropped (with whatever is still
    connected to it) when the block ends."""
    name = f"nanobot_test_{secrets.token_hex(6)}"
    conn = await admin()
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield url(name)
    finally:
        # A connection of its own: a test may have restarted the server meanwhile.
        conn = await admin()
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


@asynccontextmanager
async def target(backend: Backend, tmp_path: Path) -> AsyncIterator[Path | str]:
    """What `Database.open` takes for a fresh state on `backend`."""
    if backend == "sqlite":
        yield tmp_path / "state.db"
        return
    async with fresh_database() as database:
        yield database
