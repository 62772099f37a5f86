"""The schema of the state database and how it evolves.

`MIGRATIONS[n]` is the SQL script that takes the database from schema version `n` to `n + 1`.
The version lives in `PRAGMA user_version`. To change the schema, append one script; never
edit or reorder one that has shipped. Each script runs in its own transaction together with
the version bump, so a failing script leaves the database exactly at the previous version.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from nanobot.errors import StoreError

if TYPE_CHECKING:
    from nanobot.store.database import Database

MIGRATIONS: tuple[str, ...] = (
    # 1: sessions and their append-only entries.
    """
    CREATE TABLE sessions (
        id INTEGER PRIMARY KEY,
        key TEXT NOT NULL,
        created_at TEXT NOT NULL,
        archived_at TEXT
    );
    -- One live session per key. Archived sessions keep their key, as history.
    CREATE UNIQUE INDEX sessions_live_key ON sessions (key) WHERE archived_at IS NULL;
    CREATE TABLE entries (
        -- AUTOINCREMENT: ids are never reused, so an id is a stable paging cursor.
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id INTEGER NOT NULL REFERENCES sessions (id),
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        run_id TEXT,
        created_at TEXT NOT NULL
    );
    -- The tail of a session is a short backwards range scan of this index.
    CREATE INDEX entries_session_id ON entries (session_id, id);
    """,
    # 2: durable delivery (inbound journal, outbox) and access (allowed users, pairing).
    """
    -- The journal row a user message entry came from, so a restart can tell whether an
    -- accepted message already reached its session.
    ALTER TABLE entries ADD COLUMN inbound_id INTEGER;
    CREATE INDEX entries_inbound_id ON entries (inbound_id) WHERE inbound_id IS NOT NULL;
    CREATE TABLE inbound (
        id INTEGER PRIMARY KEY,
        channel TEXT NOT NULL,
        message_id TEXT NOT NULL,
        message TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        received_at TEXT NOT NULL,
        done_at TEXT
    );
    -- A redelivered platform message is recognised by this key and ignored.
    CREATE UNIQUE INDEX inbound_platform_id ON inbound (channel, message_id);
    CREATE INDEX inbound_pending ON inbound (id) WHERE state = 'pending';
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY,
        channel TEXT NOT NULL,
        message TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        created_at TEXT NOT NULL,
        delivered_at TEXT
    );
    CREATE INDEX outbox_pending ON outbox (id) WHERE state = 'pending';
    CREATE TABLE allowed_users (
        channel TEXT NOT NULL,
        user_id TEXT NOT NULL,
        name TEXT,
        approved_at TEXT NOT NULL,
        PRIMARY KEY (channel, user_id)
    );
    CREATE TABLE pairing_requests (
        code TEXT PRIMARY KEY,
        channel TEXT NOT NULL,
        user_id TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        name TEXT,
        created_at TEXT NOT NULL,
        expires_at TEXT NOT NULL
    );
    CREATE UNIQUE INDEX pairing_requests_user ON pairing_requests (channel, user_id);
    """,
    # 3: the usage ledger, one row per run.
    """
    CREATE TABLE usage (
        id INTEGER PRIMARY KEY,
        session_key TEXT NOT NULL,
        run_id TEXT NOT NULL,
        model TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        cost REAL NOT NULL,
        at TEXT NOT NULL
    );
    CREATE INDEX usage_session_key ON usage (session_key, at);
    """,
    # 4: cron jobs, their bounded run history, and the counter that tells processes of changes.
    """
    CREATE TABLE cron_jobs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        message TEXT NOT NULL,
        schedule TEXT NOT NULL,  -- JSON: {"kind": "at" | "every" | "cron", ...}
        enabled INTEGER NOT NULL,
        channel TEXT,
        chat_id TEXT,
        owner TEXT,  -- the session key of the chat that made it; NULL from the CLI
        created_at TEXT NOT NULL,
        next_run TEXT,  -- UTC; NULL exactly when disabled
        last_run TEXT,
        last_status TEXT,
        CHECK (enabled = (next_run IS NOT NULL))
    );
    CREATE INDEX cron_jobs_next_run ON cron_jobs (next_run) WHERE enabled = 1;
    CREATE INDEX cron_jobs_owner ON cron_jobs (owner, created_at);
    CREATE TABLE cron_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id TEXT NOT NULL REFERENCES cron_jobs (id) ON DELETE CASCADE,
        due_at TEXT,
        started_at TEXT NOT NULL,
        ended_at TEXT,
        status TEXT NOT NULL,
        error TEXT,
        delivered INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX cron_runs_job ON cron_runs (job_id, id);
    CREATE INDEX cron_runs_running ON cron_runs (id) WHERE status = 'running';
    -- One row; `version` grows in the same transaction as every change to cron_jobs.
    CREATE TABLE cron_state (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        version INTEGER NOT NULL
    );
    INSERT INTO cron_state (id, version) VALUES (1, 0);
    """,
    # 5: how many parts of a long reply are already on the platform, so a restart between
    # parts sends only the rest.
    """
    ALTER TABLE outbox ADD COLUMN parts_sent INTEGER NOT NULL DEFAULT 0;
    """,
    # 6: the platform message showing a reply while it streams, until the reply is out, so
    # after a restart the final text replaces it instead of following it.
    """
    CREATE TABLE streams (
        stream_id TEXT PRIMARY KEY,
        message_id INTEGER NOT NULL,
        created_at TEXT NOT NULL
    );
    """,
    # 7: approvals: each request for a person's decision, the chats it is asked in, the
    # saved rules ("always"), the chat-scope grants (until /new) and the decision log.
    """
    CREATE TABLE approval_requests (
        id TEXT PRIMARY KEY,
        session_key TEXT NOT NULL,
        run_id TEXT NOT NULL,
        tool_call_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        arguments TEXT NOT NULL,  -- canonical JSON, as the card shows it
        args_hash TEXT NOT NULL,
        rule_key TEXT NOT NULL,  -- what a saved rule made from it binds to
        scopes TEXT NOT NULL,  -- the approvals it may get, space-separated: 'once chat always'
        reason TEXT NOT NULL,  -- why it asks, for the card
        deciders TEXT NOT NULL,  -- JSON list of the platform user ids who may decide
        state TEXT NOT NULL DEFAULT 'pending'
            CHECK (state IN ('pending', 'approved', 'denied', 'expired', 'cancelled')),
        scope TEXT CHECK (scope IN ('once', 'chat', 'always')),
        created_at TEXT NOT NULL,
        expires_at TEXT NOT NULL,
        decided_by TEXT,
        decided_at TEXT,
        note TEXT,
        CHECK ((state = 'approved') = (scope IS NOT NULL))
    );
    CREATE INDEX approval_requests_pending ON approval_requests (expires_at)
        WHERE state = 'pending';
    CREATE INDEX approval_requests_run ON approval_requests (run_id);
    -- The chats a request is asked in (its cards), and the card's message once it is out.
    CREATE TABLE approval_places (
        request_id TEXT NOT NULL REFERENCES approval_requests (id) ON DELETE CASCADE,
        channel TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        message_id TEXT,
        PRIMARY KEY (request_id, channel, chat_id)
    );
    CREATE TABLE approval_rules (
        id TEXT PRIMARY KEY,
        tool TEXT NOT NULL,
        rule_key TEXT NOT NULL,
        arguments TEXT NOT NULL,
        created_at TEXT NOT NULL,
        created_by TEXT,
        request_id TEXT
    );
    CREATE UNIQUE INDEX approval_rules_key ON approval_rules (tool, rule_key);
    CREATE TABLE approval_grants (
        session_key TEXT NOT NULL,
        tool TEXT NOT NULL,
        rule_key TEXT NOT NULL,
        created_at TEXT NOT NULL,
        created_by TEXT,
        request_id TEXT,
        PRIMARY KEY (session_key, tool, rule_key)
    );
    -- Every decision, kept: answers, expiries, refusals at once, revoked rules.
    CREATE TABLE approval_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        request_id TEXT,
        session_key TEXT,
        tool TEXT NOT NULL,
        arguments TEXT NOT NULL,
        outcome TEXT NOT NULL,
        scope TEXT,
        decided_by TEXT,
        reason TEXT
    );
    """,
    # 8: replies the platform refused for good: state 'failed', with the reason in
    # last_error and the moment here, so `nanobot status` can say how many and why.
    """
    ALTER TABLE outbox ADD COLUMN failed_at TEXT;
    CREATE INDEX outbox_failed ON outbox (failed_at) WHERE state = 'failed';
    """,
    # 9: the platform's id of a delivered message, so a later record can edit it (a card
    # shows how it was decided).
    """
    ALTER TABLE outbox ADD COLUMN sent_id TEXT;
    """,
    # 10: the gateway processes using this database, one row each while it runs (a cluster's
    # members), refreshed every few seconds, so `nanobot status --check` can tell whether one
    # is alive.
    """
    CREATE TABLE members (
        id TEXT PRIMARY KEY,  -- random, new at each start of a process
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        version TEXT NOT NULL,
        started_at TEXT NOT NULL,
        beat_at TEXT NOT NULL
    );
    """,
    # 11: whether a cron run's answer reached its chat, kept on the run by the outbox: the
    # reply's row names its run (`cron_run`), and queueing, confirming or giving it up sets
    # the run's `delivery` in the same transaction. It replaces `delivered`, which was set
    # when the reply was only queued: those runs count as delivered (most were; nothing
    # tells which were not).
    """
    ALTER TABLE outbox ADD COLUMN cron_run INTEGER;
    CREATE INDEX outbox_cron_run ON outbox (cron_run) WHERE cron_run IS NOT NULL;
    ALTER TABLE cron_runs ADD COLUMN delivery TEXT
        CHECK (delivery IN ('pending', 'delivered', 'failed'));
    ALTER TABLE cron_runs ADD COLUMN delivery_error TEXT;
    UPDATE cron_runs SET delivery = 'delivered' WHERE delivered = 1;
    ALTER TABLE cron_runs DROP COLUMN delivered;
    """,
)


def check_version(path: Path, version: int) -> None:
    """Raise `StoreError` if the database at `path` is newer than this code understands."""
    if version > len(MIGRATIONS):
        raise StoreError(
            f"{path} has schema version {version}, but this nanobot only knows versions up to "
            f"{len(MIGRATIONS)}; it was left untouched. Upgrade nanobot to use it."
        )


async def migrate(db: Database) -> int:
    """Apply the missing migrations in order and return the resulting schema version.

    Safe when several processes open a fresh database at once: the version is re-read under
    the write lock before each step, so every script runs exactly once. Raises `StoreError`
    if a script fails (the database stays at the last good version) or if the schema is newer
    than this code.
    """
    version = await _user_version(db)
    while version < len(MIGRATIONS):
        async with db.transaction():
            version = await _user_version(db)
            check_version(db.path, version)
            if version < len(MIGRATIONS):
                await _apply(db, version)
                version += 1
    check_version(db.path, version)
    return version


async def _apply(db: Database, version: int) -> None:
    try:
        for statement in _statements(MIGRATIONS[version]):
            await db.execute(statement)
        await db.execute(f"PRAGMA user_version = {version + 1}")
    except StoreError as exc:
        raise StoreError(
            f"schema migration {version + 1} failed, {db.path} was left at version {version}: {exc}"
        ) from exc


async def _user_version(db: Database) -> int:
    row = await db.fetchone("PRAGMA user_version")
    return int(row[0]) if row else 0


def _statements(script: str) -> list[str]:
    """Split a script into statements; `complete_statement` knows about strings and triggers."""
    statements: list[str] = []
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\n;"):
                statements.append(pending.strip())
            pending = ""
    if pending.strip(" \t\n;"):
        statements.append(pending.strip())
    return statements
