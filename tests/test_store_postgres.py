"""What only the PostgreSQL store does: several connections (as several processes would)
racing on one compare-and-set or one lock, migrating at once, a newer schema refused
untouched, the reasons a database cannot be used (its password never shown), and a pool
that outlives its connections. Each test has a database of its own (`postgres_url`, already
migrated; `empty_postgres_url` where the migrations are the subject); without a reachable
server they are skipped with one line. The pure parts (placeholders, URLs) need no server."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import asyncpg
import pytest

from nanobot.errors import StoreError
from nanobot.store import Access, Database, Journal, NewEntry, SessionStore, migrations
from nanobot.store import url as store_url
from nanobot.store._placeholders import numbered
from tests import _stores

ROOT = Path(__file__).resolve().parents[1]


# --- pure: placeholders and URLs -------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT ?", "SELECT $1"),
        ("UPDATE t SET a = ?, b = ? WHERE c = ?", "UPDATE t SET a = $1, b = $2 WHERE c = $3"),
        ("SELECT '?', ? FROM t", "SELECT '?', $1 FROM t"),
        ("SELECT 'it''s ?', ?", "SELECT 'it''s ?', $1"),
        ('SELECT "odd?name", ?', 'SELECT "odd?name", $1'),
        ("SELECT ? -- why?\n, ?", "SELECT $1 -- why?\n, $2"),
        ("SELECT ? /* what? */ , ?", "SELECT $1 /* what? */ , $2"),
        ("SELECT ? -- to the end?", "SELECT $1 -- to the end?"),
        (
            "SELECT x::jsonb #>> '{a,b}' FROM t WHERE y = ?",
            "SELECT x::jsonb #>> '{a,b}' FROM t WHERE y = $1",
        ),
    ],
)
def test_placeholders_are_numbered_outside_literals_and_comments(sql: str, expected: str) -> None:
    assert numbered(sql) == expected


def test_an_unterminated_literal_is_refused() -> None:
    with pytest.raises(ValueError, match="unterminated string literal"):
        numbered("SELECT 'oops, ?")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://bot:s3cret@db:5432/nano", "postgresql://bot:***@db:5432/nano"),
        (
            "postgres://bot:p%40ss@db/nano?sslmode=require",
            "postgres://bot:***@db/nano?sslmode=require",
        ),
        (
            "postgresql://bot@db/nano?password=s3cret&sslmode=disable",
            "postgresql://bot@db/nano?password=***&sslmode=disable",
        ),
        ("postgresql://db/nano", "postgresql://db/nano"),
        ("sqlite:///home/me/state.db", "sqlite:///home/me/state.db"),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert store_url.redact(url) == shown


def test_store_urls_name_their_backend_or_are_refused_without_their_secrets() -> None:
    assert store_url.backend("sqlite:///var/lib/nanobot/state.db") == "sqlite"
    assert store_url.sqlite_path("sqlite:///var/lib/nanobot/state.db") == Path(
        "/var/lib/nanobot/state.db"
    )
    assert store_url.backend("postgresql://u:p@h/d") == "postgresql"
    with pytest.raises(StoreError, match=r"unsupported store URL \(mysql://…\)") as raised:
        store_url.backend("mysql://root:hunter2@db/nano")
    assert "hunter2" not in str(raised.value)
    with pytest.raises(StoreError, match="absolute path"):
        store_url.backend("sqlite://state.db")


# --- several connections at once ---------------------------------------------------------------


async def test_one_compare_and_set_from_two_connections_wins_once(postgres_url: str) -> None:
    async with await Database.open(postgres_url) as one, await Database.open(postgres_url) as two:
        await one.execute("CREATE TABLE claims (id INTEGER PRIMARY KEY, state TEXT NOT NULL)")
        await one.execute(
            "INSERT INTO claims (id, state) SELECT g, 'pending' FROM generate_series(1, 50) g"
        )
        claim = "UPDATE claims SET state = ? WHERE id = ? AND state = 'pending' RETURNING id"
        results = await asyncio.gather(
            *(
                db.fetchone(claim, (name, n))
                for n in range(1, 51)
                for db, name in ((one, "one"), (two, "two"))
            )
        )
    assert sum(row is not None for row in results) == 50  # each row claimed exactly once


async def test_blocks_with_one_lock_never_overlap_across_connections(postgres_url: str) -> None:
    async with await Database.open(postgres_url) as one, await Database.open(postgres_url) as two:
        inside, release = asyncio.Event(), asyncio.Event()
        order: list[str] = []

        async def first() -> None:
            async with one.transaction(lock="pairing:telegram"):
                order.append("first in")
                inside.set()
                await release.wait()
                order.append("first out")

        async def second() -> None:
            await inside.wait()
            async with two.transaction(lock="pairing:telegram"):
                order.append("second in")

        async def other_lock() -> None:
            await inside.wait()
            async with two.transaction(lock="pairing:discord"):
                order.append("other lock in")

        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(first())
            waiting = tasks.create_task(second())
            await tasks.create_task(other_lock())  # another name does not wait
            await asyncio.sleep(0.05)  # a "not yet" check: a false pass at worst
            assert not waiting.done()
            release.set()
    assert order == ["first in", "other lock in", "first out", "second in"]


async def test_two_processes_asking_for_one_users_code_get_the_same_one(postgres_url: str) -> None:
    async with await Database.open(postgres_url) as one, await Database.open(postgres_url) as two:
        issued = await asyncio.gather(
            *(Access(db).request("telegram", "7", "7", "Eve") for db in (one, two, one, two))
        )
        assert len({i.code for i in issued}) == 1
        assert sum(i.new for i in issued) == 1
        assert len(await Access(one).pending()) == 1


async def test_appends_from_two_processes_keep_each_batch_together(postgres_url: str) -> None:
    async with await Database.open(postgres_url) as one, await Database.open(postgres_url) as two:
        session = await SessionStore(one).live("k")
        batches = await asyncio.gather(
            *(
                SessionStore(db).append(
                    session, [NewEntry("note", {"b": b, "i": i}) for i in range(5)]
                )
                for b in range(20)
                for db in (one, two)
            )
        )
        stored = await SessionStore(one).tail(session, 1000)
    for batch in batches:
        ids = [entry.id for entry in batch]
        assert ids == list(range(ids[0], ids[0] + 5))
    assert [e.id for e in stored] == sorted(e.id for e in stored) and len(stored) == 200


# --- migrations -------------------------------------------------------------------------------

OPENER = """
import asyncio, sys
from nanobot.store import Database

async def main(url: str) -> None:
    async with await Database.open(url) as db:
        print(await db.schema_version())

print("ready", flush=True)
sys.stdin.readline()
asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.process
async def test_processes_opening_a_new_database_at_once_migrate_it_once(
    empty_postgres_url: str,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            OPENER,
            empty_postgres_url,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        for _ in range(3)
    ]
    for proc in procs:  # go together once every interpreter has imported the store
        assert proc.stdout is not None
        assert await proc.stdout.readline() == b"ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
    outputs = await asyncio.gather(*(proc.communicate() for proc in procs))
    for proc, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert (proc.returncode, stderr.decode()) == (0, "")
        assert stdout.decode().strip() == str(len(migrations.MIGRATIONS))
    async with await Database.open(empty_postgres_url) as db:
        # Migration 4 inserts cron_state's one row: run twice, it would have failed.
        assert [tuple(r) for r in await db.fetchall("SELECT id, version FROM cron_state")] == [
            (1, 0)
        ]


async def test_a_copy_of_the_template_holds_what_migrating_makes(
    postgres_url: str, empty_postgres_url: str
) -> None:
    """The tests' databases are copies of a template migrated once (`tests._stores`): the
    same schema as migrating a new one now, or the template's name missed a change."""
    async with await Database.open(empty_postgres_url):
        pass
    copied, migrated = await _schema(postgres_url), await _schema(empty_postgres_url)
    assert copied == migrated
    assert (len(migrations.MIGRATIONS),) in copied


async def _schema(url: str) -> list[tuple[object, ...]]:
    """The columns, the indexes, the version and the rows of `cron_state`."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT table_name, column_name, data_type, column_default, is_nullable, is_identity"
            " FROM information_schema.columns WHERE table_schema = 'public'"
            " ORDER BY table_name, column_name"
        )
        rows += await conn.fetch(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY indexdef"
        )
        rows += await conn.fetch("SELECT version FROM schema_version")
        rows += await conn.fetch("SELECT id, version FROM cron_state")
    finally:
        await conn.close()
    return [tuple(r) for r in rows]


async def test_a_database_from_a_newer_version_is_refused_untouched(postgres_url: str) -> None:
    async with await Database.open(postgres_url) as db:
        await SessionStore(db).live("k")
        await db.execute("UPDATE schema_version SET version = 99")
    conn = await asyncpg.connect(postgres_url)
    try:
        before = await _contents(conn)
        with pytest.raises(StoreError, match="schema version 99") as raised:
            await Database.open(postgres_url)
        assert "left untouched" in str(raised.value)
        assert await _contents(conn) == before
    finally:
        await conn.close()


async def _contents(conn: asyncpg.Connection) -> list[tuple[object, ...]]:
    """The tables, the version and the rows of sessions: what a migration would change."""
    tables = await conn.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        " ORDER BY table_name"
    )
    rows = await conn.fetch(
        "SELECT version FROM schema_version UNION ALL SELECT count(*) FROM sessions"
    )
    return [tuple(r) for r in [*tables, *rows]]


async def test_a_failing_migration_leaves_the_last_good_version(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await Database.open(postgres_url) as db:
        session = await SessionStore(db).live("k")
    broken = (*migrations.MIGRATIONS, "CREATE TABLE extra (x TEXT); CREATE TABLE broken (")
    monkeypatch.setattr(migrations, "MIGRATIONS", broken)
    with pytest.raises(StoreError, match=f"migration {len(broken)} failed"):
        await Database.open(postgres_url)
    monkeypatch.undo()
    async with await Database.open(postgres_url) as db:
        assert await SessionStore(db).live("k") == session
        extra = await db.fetchone("SELECT to_regclass('extra')")
        assert extra is not None and extra[0] is None  # its DDL was rolled back too
        assert await db.schema_version() == len(migrations.MIGRATIONS)


async def test_the_schema_holds_what_sqlite_holds(postgres_url: str) -> None:
    async with await Database.open(postgres_url) as db:
        journal = Journal(db)
        snowflake = 1_300_000_000_000_000_000  # a Discord message id: beyond 32 bits
        await journal.stream_started("discord-1", snowflake)
        assert await journal.open_streams() == {"discord-1": snowflake}


# --- what makes a database unusable -----------------------------------------------------------


async def test_unusable_databases_say_why_without_the_password(postgres_server: None) -> None:
    host = f"{_stores.HOST}:{_stores.PORT}"
    # None of them names a database that exists: a mistake here must not migrate one.
    cases = {
        f"postgresql://nobody_here:hunter2@{host}/nanobot_none": "PostgreSQL refused the login",
        f"postgresql://{_stores.USER}:hunter2@{host}/nanobot_none": "does not exist",
        "postgresql://bot:hunter2@127.0.0.1:1/nanobot_none": "cannot reach the server",
        f"postgresql://{_stores.USER}:hunter2@127.0.0.1:99999/nanobot_none": "not a usable",
    }
    for url, reason in cases.items():
        with pytest.raises(StoreError) as raised:
            await Database.open(url)
        text = str(raised.value)
        assert reason in text, text
        assert "hunter2" not in text and "***" in text, text
        assert text.startswith("cannot use the store at postgresql://")


# --- connections that end --------------------------------------------------------------------


async def test_the_pool_reconnects_after_the_server_ends_its_connections(postgres_url: str) -> None:
    async with await Database.open(postgres_url) as db:
        store = SessionStore(db)
        session = await store.live("k")
        await asyncio.gather(*(store.count(session) for _ in range(5)))  # a few connections
        for _ in range(3):
            ended = await _end_connections(postgres_url)
            assert ended >= 1
            await store.append(session, [NewEntry("note", {"after": "restart"})])
            assert await store.count(session) >= 1
        with pytest.raises(StoreError, match="lost the connection"):
            async with db.transaction():
                await store.count(session)
                await _end_connections(postgres_url)
                await store.count(session)
        assert await store.count(session) == 3  # the connection after it is a new one


async def test_a_lost_server_is_a_storage_failure_told_to_the_watchers(
    postgres_url: str,
) -> None:
    """The gate watches the store and stops intake on storage failures (a lost server, a
    full disk), not on a statement's own mistakes."""
    told: list[StoreError] = []

    class Watcher:
        def store_failed(self, error: StoreError) -> None:
            told.append(error)

    async with await Database.open(postgres_url, watch=Watcher()) as db:
        with pytest.raises(StoreError):
            await db.execute("SELECT * FROM no_such_table")
        assert told == []
        store = SessionStore(db)
        session = await store.live("telegram:1")
        with pytest.raises(StoreError, match="lost the connection") as raised:
            async with db.transaction():
                await store.count(session)
                await _end_connections(postgres_url)
                await store.count(session)
        assert told == [raised.value]


async def _end_connections(url: str) -> int:
    """End every connection to `url`'s database (as a restart of the server would)."""
    database = url.rsplit("/", 1)[1]
    conn = await _stores.admin()
    try:
        rows = await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
    finally:
        await conn.close()
    return sum(bool(r[0]) for r in rows)


# --- the command line -------------------------------------------------------------------------


async def nanobot(tmp_path: Path, *args: str, store_url: str) -> tuple[int, str, str]:
    """Run `nanobot ARGS` with a config whose state is at `store_url`."""
    config = tmp_path / "config.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nstore:\n  url: '{store_url}'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANOBOT_")}
    env.update(HOME=str(tmp_path), NANOBOT_CONFIG=str(config), PYTHONPATH=str(ROOT))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nanobot",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.process
async def test_status_shows_the_store_in_use_without_its_password(
    postgres_url: str, tmp_path: Path
) -> None:
    with_password = postgres_url.replace(f"//{_stores.USER}@", f"//{_stores.USER}:hunter2@")
    code, out, err = await nanobot(tmp_path, "status", store_url=with_password)
    assert (code, err) == (0, "")
    assert f"state      {store_url.redact(with_password)} (" in out
    assert "***" in out and "hunter2" not in out
    assert "not checked here: the check is SQLite's" in out


@pytest.mark.process
async def test_a_store_that_cannot_be_used_stops_a_command_with_the_reason(
    tmp_path: Path, postgres_server: None
) -> None:
    unreachable = "postgresql://bot:hunter2@127.0.0.1:1/nanobot_none"
    code, out, err = await nanobot(tmp_path, "cron", "list", store_url=unreachable)
    assert code != 0
    assert "cannot use the store at postgresql://bot:***@127.0.0.1:1/nanobot_none" in err
    assert "cannot reach the server" in err
    assert "hunter2" not in out + err and "Traceback" not in err


async def test_the_migration_names_the_sender_of_entries_from_their_journal_row(
    empty_postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on SQLite (tests/test_store_search.py): entries from before senders were kept
    take theirs from the inbound journal's row, where it is still there."""
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:24])
    stamp = "2025-01-01T00:00:00.000000+00:00"
    said = '{"role": "user", "content": "hi"}'
    async with await Database.open(empty_postgres_url) as db:
        assert await db.schema_version() == 24
        await db.atomic(
            [
                (
                    "INSERT INTO sessions (id, key, created_at) VALUES (1, 'telegram:-5', ?)",
                    (stamp,),
                ),
                (
                    "INSERT INTO inbound (id, channel, message_id, message, received_at)"
                    " VALUES (7, 'telegram', '1', ?, ?)",
                    ('{"sender_id": "111", "text": "hi"}', stamp),
                ),
                *[
                    (
                        "INSERT INTO entries (session_id, kind, data, created_at, inbound_id)"
                        " VALUES (1, 'message', ?, ?, ?)",
                        (said, stamp, inbound),
                    )
                    for inbound in (7, 8, None)  # 8: its row was purged
                ],
            ]
        )
    monkeypatch.undo()
    async with await Database.open(empty_postgres_url) as db:
        rows = await db.fetchall("SELECT sender FROM entries ORDER BY id")
    assert [r["sender"] for r in rows] == ["telegram:111", None, None]
