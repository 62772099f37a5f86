"""The state store's backends for tests: a fresh SQLite file, or a fresh PostgreSQL database
on 127.0.0.1:5432, made for one test and dropped after it.

PostgreSQL is reached as `$PGUSER` (else `postgres`) without a password (the local server's
trust authentication). Where none answers, every PostgreSQL case is skipped with one line,
`UNREACHABLE`; `.ci/run` starts the local server when one is installed.

A test's database is a copy of a template migrated once (`CREATE DATABASE … TEMPLATE`), so
no test pays for the migrations; a test of migrations asks for an empty one
(`fresh_database(migrated=False)`). The template is named for the schema it holds
(`template_name()`: the schema version and a digest of what builds it), so every run, every
xdist worker and every checkout with the same migrations shares it, and it is kept between
runs rather than dropped: a changed migration gets a template of its own, and one that no
run has used for a day is dropped by the next run. It is built under the session advisory
lock `TEMPLATE_LOCK` (taken in the server's `postgres` database, where every admin
connection is), under a temporary name that becomes the template's only once migrated: a
template that exists is complete, and a build a crash cut off is dropped by the next one.
No one can connect to a template (ALLOW_CONNECTIONS false): `CREATE DATABASE … TEMPLATE`
refuses a source that anyone is connected to.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

import asyncpg
import pytest

from nanobot.store import Database, migrations
from nanobot.store.dialect import POSTGRESQL
from nanobot.store.postgres import PostgresDatabase

Backend = Literal["sqlite", "postgres"]
BACKENDS: Final[tuple[Backend, ...]] = ("sqlite", "postgres")

HOST: Final = "127.0.0.1"
PORT: Final = 5432
USER: Final = os.environ.get("PGUSER") or "postgres"
UNREACHABLE: Final = (
    f"no PostgreSQL answers on {HOST}:{PORT} as {USER}: the store's PostgreSQL cases are "
    "skipped (.ci/run starts a local server when one is installed)"
)

PATIENCE: Final = 20.0  # seconds a server that answered may take to answer again
_UNANSWERED: Final = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)

# What a test asks for that makes it a PostgreSQL case (conftest's fixtures).
_POSTGRES_FIXTURES: Final = frozenset({"postgres_server", "postgres_url", "empty_postgres_url"})

_unreachable: set[str] = set()  # the URL no server answered, once asked
_answered: set[str] = set()  # the URL a server answered


def url(database: str, *, user: str = USER, password: str | None = None) -> str:
    """A URL of `database` on the test server."""
    secret = f":{password}" if password is not None else ""
    return f"postgresql://{user}{secret}@{HOST}:{PORT}/{database}"


async def admin() -> Any:
    """A connection to the server's `postgres` database; skips the test when none answers.

    A server that answered before in this run and fails now (restarted by someone, out of
    connections) is asked again for `PATIENCE` seconds, then its error is raised: a test
    fails, rather than this and every later PostgreSQL case of the process being skipped."""
    deadline = asyncio.get_running_loop().time() + (PATIENCE if _answered else 0)
    while not _unreachable:
        try:
            conn = await asyncpg.connect(url("postgres"), timeout=5)
        except _UNANSWERED:
            if asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.5)
                continue
            if _answered:
                raise
            _unreachable.add(url("postgres"))
        else:
            _answered.add(url("postgres"))
            return conn
    pytest.skip(UNREACHABLE)  # one place: the skips add up to one line of the summary


def reachable() -> bool:
    """Whether the server answers (asked once per run, before the tests)."""
    if not _unreachable and not _answered:

        async def probe() -> None:
            conn = await asyncpg.connect(url("postgres"), timeout=5)
            await conn.close()

        try:
            asyncio.run(probe())
            _answered.add(url("postgres"))
        except _UNANSWERED:
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
    return bool(_POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())))


TEMPLATE_PREFIX: Final = "nanobot_template_"
TEMPLATE_LOCK: Final = "nanobot tests: making the migrated template"
TEMPLATE_KEPT: Final = timedelta(days=1)  # a template of other migrations unused this long goes
_USED: Final = "nanobot tests: migrated template, last used "  # + ISO time, its comment

_templates: set[str] = set()  # the templates this process has found or made


def template_name() -> str:
    """The name of the template holding this code's schema: its version and a digest of the
    scripts as PostgreSQL runs them and of the code that applies them and records the
    version (editing any of them, even an unshipped migration, makes a new template)."""
    digest = hashlib.sha256()
    for version in range(1, len(migrations.MIGRATIONS) + 1):
        digest.update(migrations.script(version, POSTGRESQL).encode())
    digest.update(inspect.getsource(migrations).encode())
    digest.update(inspect.getsource(PostgresDatabase.set_schema_version).encode())
    return f"{TEMPLATE_PREFIX}v{len(migrations.MIGRATIONS)}_{digest.hexdigest()[:12]}"


async def _template() -> str:
    """The migrated template's name, made first if no run has made it yet."""
    name = template_name()
    if name in _templates:
        return name
    conn = await admin()
    try:
        # A session lock: released by the server, too, if this process dies holding it.
        await conn.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", TEMPLATE_LOCK)
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await _build(conn, name)
        await conn.execute(
            f"COMMENT ON DATABASE \"{name}\" IS '{_USED}{datetime.now(UTC).isoformat()}'"
        )
        await _prune(conn, keep=name)
    finally:
        await conn.close()  # which ends the lock
    _templates.add(name)
    return name


async def _build(conn: Any, name: str) -> None:
    """Make the template `name` (under the lock, through the admin connection `conn`)."""
    building = f"{TEMPLATE_PREFIX}building_{secrets.token_hex(6)}"
    await conn.execute(f'CREATE DATABASE "{building}"')
    try:
        async with await Database.open(url(building)):
            pass
        await conn.execute(
            f'ALTER DATABASE "{building}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false'
        )
        # The server waits a few seconds for the migration's sessions to end first.
        await conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
    except BaseException:
        await _drop(conn, building)
        raise


async def _prune(conn: Any, *, keep: str) -> None:
    """Drop the builds a crash cut off, and the templates of other migrations that no run
    has used for `TEMPLATE_KEPT` (under the lock: no build is under way)."""
    rows = await conn.fetch(
        "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database"
        " WHERE starts_with(datname, $1) AND datname <> $2",
        TEMPLATE_PREFIX,
        keep,
    )
    now = datetime.now(UTC)
    for name, comment in rows:
        used = comment[len(_USED) :] if comment and comment.startswith(_USED) else None
        if used is None or now - datetime.fromisoformat(used) > TEMPLATE_KEPT:
            await _drop(conn, name)


async def _drop(conn: Any, name: str) -> None:
    await conn.execute(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE false')  # else refused
    await conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@asynccontextmanager
async def fresh_database(*, migrated: bool = True) -> AsyncIterator[str]:
    """The URL of a new database with a random name, at this code's schema (a copy of the
    template), or `migrated=False` empty; dropped (with whatever is still connected to it)
    when the block ends."""
    template = await _template() if migrated else "template1"
    name = f"nanobot_test_{secrets.token_hex(6)}"
    conn = await admin()
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
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
