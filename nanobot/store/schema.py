"""The schema of the state database, as the scripts that build it, for both backends.

`MIGRATIONS[n]` is the SQL script that takes the database from schema version `n` to `n + 1`.
To change the schema, append one script; never edit or reorder one that has shipped
(`store.migrations` runs them).

The scripts are written once, in SQL both backends understand, with SQLite's type names
(INTEGER, REAL, BLOB; `INTEGER PRIMARY KEY` for an id the database assigns): SQLite runs
them as written, PostgreSQL as `Dialect.render` translates them (BIGINT, identity columns,
…), plus the few additions in `POSTGRESQL_EXTRA` for what SQLite has without saying;
`SQLITE_EXTRA` holds what only SQLite can say (its full-text index).
"""

from __future__ import annotations

from typing import Final

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
        CHECK (enabled = CASE WHEN next_run IS NULL THEN 0 ELSE 1 END)
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
    # 12: per channel, the moment before which it has had everything its platform sent
    # (taken, or seen and refused), so a channel whose platform never delivers a message
    # again (Discord) fetches what came after it, even in chats it never took from.
    """
    CREATE TABLE channel_state (
        channel TEXT PRIMARY KEY,
        caught_up_until TEXT NOT NULL
    );
    """,
    # 13: leases, what one member of a cluster does at a time (a channel's intake, the
    # schedule): who holds each and until when, renewed while held (`store.leases`).
    """
    CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,  -- a member id (members.id); the row outlives the member
        token INTEGER NOT NULL,  -- grows with each new holding: a fencing token
        acquired_at TEXT NOT NULL,
        expires_at TEXT NOT NULL  -- UTC; free once passed
    );
    """,
    # 14: which member of a cluster answers which session (`store.claims`): a session's
    # lease, the member that took each pending message, and the member that sends each
    # reply. Rows from before have no session recorded: it is read from their message.
    """
    ALTER TABLE inbound ADD COLUMN session_key TEXT;
    ALTER TABLE inbound ADD COLUMN claimed_by TEXT;
    ALTER TABLE outbox ADD COLUMN claimed_by TEXT;
    CREATE INDEX inbound_pending_session ON inbound (session_key) WHERE state = 'pending';
    CREATE TABLE session_leases (
        session_key TEXT PRIMARY KEY,
        holder TEXT NOT NULL,  -- a member id (members.id)
        expires_at TEXT NOT NULL  -- UTC; free to take once passed
    );
    """,
    # 15: what the members of a cluster must share, as each member runs with it: its
    # workspace's path, and digests of the config parts that must agree (`Member.agreement`;
    # no secret). Rows from before have neither ('').
    """
    ALTER TABLE members ADD COLUMN workspace TEXT NOT NULL DEFAULT '';
    ALTER TABLE members ADD COLUMN agreement TEXT NOT NULL DEFAULT '';
    """,
    # 16: a Telegram cron job that delivers to a private chat names it for its user
    # (`@<user id>`, as the cron tool now writes it), so that its unattended calls ask that
    # user: on Telegram a private chat's id is its user's, and only those are positive.
    """
    UPDATE cron_jobs SET chat_id = '@' || chat_id
    WHERE channel = 'telegram' AND chat_id <> '' AND chat_id NOT LIKE '-%'
    AND chat_id NOT LIKE '@%';
    """,
    # 17: the pending messages no member has claimed yet, which a cluster's members look
    # for at every round (`Claims.candidates`): while thousands are being answered, the
    # claimed ones are most of those pending.
    """
    CREATE INDEX inbound_unclaimed ON inbound (id) WHERE state = 'pending' AND claimed_by IS NULL;
    """,
    # 18: approvals bound to the person, the place and the code. A saved rule applies to the
    # private turns of one person on one channel (`user_id`), or to one group's turns
    # (`session_key`, saved there by an approver), and holds the fingerprint of the code its
    # call ran when it was saved (`fingerprint`, JSON; a mismatch voids it); a request keeps
    # whose turn it was (`owner`, '' in a group) and that fingerprint, for the rule or grant
    # its answer makes (on the channel of its places). Rules saved before were bound to
    # nobody: they stay bound to the chat they were saved for (their request's session, on
    # its channel), with no fingerprint (so an exec rule asks once more and is saved again
    # with one); a rule whose request is gone applies nowhere until revoked.
    """
    ALTER TABLE approval_requests ADD COLUMN owner TEXT NOT NULL DEFAULT '';
    ALTER TABLE approval_requests ADD COLUMN fingerprint TEXT NOT NULL DEFAULT '';
    ALTER TABLE approval_rules ADD COLUMN channel TEXT NOT NULL DEFAULT '';
    ALTER TABLE approval_rules ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE approval_rules ADD COLUMN session_key TEXT NOT NULL DEFAULT '';
    ALTER TABLE approval_rules ADD COLUMN fingerprint TEXT NOT NULL DEFAULT '';
    ALTER TABLE approval_grants ADD COLUMN fingerprint TEXT NOT NULL DEFAULT '';
    UPDATE approval_rules SET
        session_key = COALESCE((SELECT r.session_key FROM approval_requests AS r
            WHERE r.id = approval_rules.request_id), ''),
        channel = COALESCE((SELECT MIN(p.channel) FROM approval_places AS p
            WHERE p.request_id = approval_rules.request_id), '');
    DROP INDEX approval_rules_key;
    CREATE UNIQUE INDEX approval_rules_bound
        ON approval_rules (tool, rule_key, channel, user_id, session_key);
    """,
    # 19: the taint ledger (`store.taint`): workspace files holding content from outside,
    # with where it came from, so it stays untrusted when read back in any later turn.
    """
    CREATE TABLE taint (
        path TEXT PRIMARY KEY,  -- relative to the workspace (absolute outside it)
        source TEXT NOT NULL,
        session_key TEXT NOT NULL,  -- the session whose turn wrote or received it
        marked_at TEXT NOT NULL
    );
    """,
    # 20: one lease primitive (`store.leases`): a session's lease is a lease named
    # "session:<key>", fenced by its token like a role's (the session leases held now keep
    # their holder and expiry), looked up by holder for the batched renewals; and one rule
    # of liveness: a member is alive until its row's `expires_at` (each beat writes it, as
    # long after as the member's lifetime). Rows from before expire at their last beat: the
    # processes that wrote them run a version that cannot use this schema.
    """
    INSERT INTO leases (name, holder, token, acquired_at, expires_at)
        SELECT 'session:' || session_key, holder, 1, expires_at, expires_at FROM session_leases;
    DROP TABLE session_leases;
    CREATE INDEX leases_holder ON leases (holder);
    ALTER TABLE members ADD COLUMN expires_at TEXT NOT NULL DEFAULT '';
    UPDATE members SET expires_at = beat_at;
    """,
    # 21: what a chat chose for itself (`store.chats`): whether its replies are also spoken
    # (`/voice`); NULL: as its channel's config says.
    """
    CREATE TABLE chat_settings (
        channel TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        voice_replies TEXT CHECK (voice_replies IN ('off', 'when_spoken', 'always')),
        updated_at TEXT NOT NULL,
        updated_by TEXT,
        PRIMARY KEY (channel, chat_id)
    );
    """,
    # 22: the name the decider of a request goes by, kept with the decision: any member of
    # a cluster edits its cards to "by Alice (123)", not only the one that took the press.
    """
    ALTER TABLE approval_requests ADD COLUMN decided_name TEXT;
    """,
    # 23: the memory search's full-text index of what was said (`store.search`): one row per
    # indexed entry (its words, `recall.words`), kept in the transaction of each append. The
    # index itself differs by backend (`SQLITE_EXTRA`, `POSTGRESQL_EXTRA`). Entries from
    # before are indexed afterwards, in the background, newest first: those with an id
    # below `search_backfill.below` still wait (0: none).
    """
    CREATE TABLE search_backfill (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        below INTEGER NOT NULL
    );
    INSERT INTO search_backfill (id, below)
        SELECT 1, CASE WHEN MAX(id) IS NULL THEN 0 ELSE MAX(id) + 1 END FROM entries;
    """,
    # 24: people kept apart (`store.people`): platform ids linked into one person, the
    # sessions each person took part in (their private chats, and the groups they wrote in),
    # and who made a cron job (the person it runs as; NULL: from the CLI, or made before).
    """
    CREATE TABLE person_links (
        user_key TEXT PRIMARY KEY,  -- channel:user_id
        person TEXT NOT NULL,  -- the channel:user_id it is the same person as
        linked_at TEXT NOT NULL
    );
    CREATE TABLE person_sessions (
        person TEXT NOT NULL,
        session_key TEXT NOT NULL,
        private INTEGER NOT NULL,
        first_at TEXT NOT NULL,
        PRIMARY KEY (person, session_key)
    );
    CREATE INDEX person_sessions_key ON person_sessions (session_key);
    ALTER TABLE cron_jobs ADD COLUMN created_by TEXT;
    """,
    # 25: SQLite's words wait in their entry's row before they reach FTS5 (`SQLITE_EXTRA`);
    # nothing changes in PostgreSQL.
    "",
    # 26: who sent each user message (their platform id, `telegram:123`), so a person's own
    # words in a group are found after the inbound journal's rows are purged (`nanobot
    # people forget`). Entries from before take it from their journal row where it is
    # still there (`SQLITE_EXTRA`, `POSTGRESQL_EXTRA`: JSON is read differently).
    """
    ALTER TABLE entries ADD COLUMN sender TEXT;
    CREATE INDEX entries_sender ON entries (sender) WHERE sender IS NOT NULL;
    """,
    # 27: budgets (`store.budgets`): what each budget's period spent (`budget_spend`, one
    # row per scope and period: "install", "person:<id>", "cron", "heartbeat"; "day:…" or
    # "month:…"), what calls in flight hold against it (`budget_holds`, one row per call
    # and scope, their sum kept on the spend row; dropped once past `expires_at`, so a
    # crashed process leaks nothing for long),
    # the raises approvers granted, and which warnings were sent (once per period). The
    # usage ledger learns whose turn it was, what started it, the prompt tokens read from
    # the provider's cache, and whether the cost is known at all (`priced` 0: no figure).
    """
    CREATE TABLE budget_spend (
        scope TEXT NOT NULL,
        period TEXT NOT NULL,
        spent REAL NOT NULL,
        held REAL NOT NULL,  -- the sum of its live holds' amounts
        PRIMARY KEY (scope, period)
    );
    CREATE TABLE budget_holds (
        hold TEXT NOT NULL,
        scope TEXT NOT NULL,
        period TEXT NOT NULL,
        amount REAL NOT NULL,
        expires_at TEXT NOT NULL
    );
    CREATE INDEX budget_holds_scope ON budget_holds (scope, period, expires_at);
    CREATE INDEX budget_holds_expiry ON budget_holds (expires_at);
    CREATE INDEX budget_holds_hold ON budget_holds (hold);
    CREATE TABLE budget_raises (
        id INTEGER PRIMARY KEY,
        scope TEXT NOT NULL,
        period TEXT NOT NULL,
        amount REAL NOT NULL,
        raised_by TEXT NOT NULL,
        raised_at TEXT NOT NULL
    );
    CREATE INDEX budget_raises_scope ON budget_raises (scope, period);
    CREATE TABLE budget_warnings (
        scope TEXT NOT NULL,
        period TEXT NOT NULL,
        warned_at TEXT NOT NULL,
        PRIMARY KEY (scope, period)
    );
    ALTER TABLE usage ADD COLUMN person TEXT;
    ALTER TABLE usage ADD COLUMN source TEXT NOT NULL DEFAULT 'chat';
    ALTER TABLE usage ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE usage ADD COLUMN priced INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX usage_at ON usage (at);
    """,
)


POSTGRESQL_EXTRA: Final[dict[int, str]] = {
    # SQLite keeps every table's insertion order in its rowid; a request's places are read
    # back in the order they were asked in (`ORDER BY rowid`).
    7: "ALTER TABLE approval_places ADD COLUMN rowid BIGINT GENERATED ALWAYS AS IDENTITY;",
    # A row per indexed entry, its words as a tsvector of the 'simple' configuration (no
    # stemming, no stop words: `recall.words` already made them), under a GIN index.
    23: """
    CREATE TABLE entry_words (
        entry_id BIGINT PRIMARY KEY REFERENCES entries (id),
        words TSVECTOR NOT NULL
    );
    CREATE INDEX entry_words_gin ON entry_words USING GIN (words);
    """,
    26: """
    UPDATE entries SET sender = inbound.channel || ':' || (inbound.message::json ->> 'sender_id')
        FROM inbound WHERE inbound.id = entries.inbound_id
        AND (inbound.message::json ->> 'sender_id') <> '';
    """,
}
"""Statements PostgreSQL runs after the script of the migration to that version."""

SQLITE_EXTRA: Final[dict[int, str]] = {
    # An FTS5 table without content of its own (the words are recomputed from the entry when
    # needed): its rowid is the entry's id. `unicode61` only splits at the spaces
    # `recall.words` put in; the full detail keeps positions, for phrases.
    23: """
    CREATE VIRTUAL TABLE entry_words USING fts5 (
        words, content = '', tokenize = 'unicode61 remove_diacritics 0'
    );
    """,
    # An append writes what each entry's words are into its own row (`unindexed_words`, by
    # the insert itself: the words, or where in the content they start), and they move into
    # FTS5 a batch at a time (`store.search`), the column emptied: FTS5 writes a new
    # segment at every commit that added to it (~25 µs, more than a turn's two inserts
    # themselves) and merges them later; one segment per batch costs a few µs an entry.
    # (Another statement in the append, even into a plain table, costs ~10 µs; a trigger
    # ~18.) Entries above `entry_words_moved.through` may hold words still waiting; below
    # it none do.
    25: """
    ALTER TABLE entries ADD COLUMN unindexed_words; -- no type: text, or an integer as it is
    CREATE TABLE entry_words_moved (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        through INTEGER NOT NULL
    );
    INSERT INTO entry_words_moved (id, through) SELECT 1, COALESCE(MAX(id), 0) FROM entries;
    """,
    26: """
    UPDATE entries SET sender = (
        SELECT i.channel || ':' || json_extract(i.message, '$.sender_id') FROM inbound i
        WHERE i.id = entries.inbound_id AND json_extract(i.message, '$.sender_id') <> ''
    ) WHERE inbound_id IS NOT NULL;
    """,
}
"""Statements SQLite runs after the script of the migration to that version."""
