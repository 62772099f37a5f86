-- A state database made by nanobot at commit 49e2274 (schema 11), one row or more in
-- every table, dumped with sqlite3's iterdump; PRAGMA user_version set after it.
BEGIN TRANSACTION;
CREATE TABLE allowed_users (
        channel TEXT NOT NULL,
        user_id TEXT NOT NULL,
        name TEXT,
        approved_at TEXT NOT NULL,
        PRIMARY KEY (channel, user_id)
    );
INSERT INTO "allowed_users" VALUES('telegram','1','Ann','2026-11-25T16:41:28.467196+00:00');
CREATE TABLE approval_grants (
        session_key TEXT NOT NULL,
        tool TEXT NOT NULL,
        rule_key TEXT NOT NULL,
        created_at TEXT NOT NULL,
        created_by TEXT,
        request_id TEXT,
        PRIMARY KEY (session_key, tool, rule_key)
    );
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
INSERT INTO "approval_log" VALUES(1,'2026-11-25T16:41:28.469621+00:00','DBY3R6TXDQEA','telegram:1','exec','{"command":"ls"}','approved','always','1','exec asks');
CREATE TABLE approval_places (
        request_id TEXT NOT NULL REFERENCES approval_requests (id) ON DELETE CASCADE,
        channel TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        message_id TEXT,
        PRIMARY KEY (request_id, channel, chat_id)
    );
INSERT INTO "approval_places" VALUES('DBY3R6TXDQEA','telegram','1',NULL);
INSERT INTO "approval_places" VALUES('DBY3R6TXDQEA','telegram','5',NULL);
INSERT INTO "approval_places" VALUES('HMZS24YS8KKK','telegram','5',NULL);
INSERT INTO "approval_places" VALUES('HMZS24YS8KKK','telegram','1',NULL);
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
INSERT INTO "approval_requests" VALUES('DBY3R6TXDQEA','telegram:1','r1','c1','exec','{"command":"ls"}','h1','ls','once chat always','exec asks','["1"]','approved','always','2026-11-25T16:41:28.469054+00:00','2026-11-25T16:46:28.469054+00:00','1','2026-11-25T16:41:28.469621+00:00',NULL);
INSERT INTO "approval_requests" VALUES('HMZS24YS8KKK','telegram:1','r2','c2','exec','{"command":"pwd"}','h2','pwd','once','exec asks','["1"]','pending',NULL,'2026-11-25T16:41:28.470317+00:00','2026-11-25T16:46:28.470317+00:00',NULL,NULL,NULL);
CREATE TABLE approval_rules (
        id TEXT PRIMARY KEY,
        tool TEXT NOT NULL,
        rule_key TEXT NOT NULL,
        arguments TEXT NOT NULL,
        created_at TEXT NOT NULL,
        created_by TEXT,
        request_id TEXT
    );
INSERT INTO "approval_rules" VALUES('7055e450','exec','ls','{"command":"ls"}','2026-11-25T16:41:28.469621+00:00','1','DBY3R6TXDQEA');
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
INSERT INTO "cron_jobs" VALUES('b0ac386a','daily','check','{"kind":"every","seconds":3600,"anchor":"2026-11-25T16:41:28.467774+00:00"}',1,'telegram','1','telegram:1','2026-11-25T16:41:28.467862+00:00','2026-11-25T18:41:28.467774+00:00','2026-11-25T16:41:28.468143+00:00','ok');
CREATE TABLE cron_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id TEXT NOT NULL REFERENCES cron_jobs (id) ON DELETE CASCADE,
        due_at TEXT,
        started_at TEXT NOT NULL,
        ended_at TEXT,
        status TEXT NOT NULL,
        error TEXT,
        delivery TEXT
        CHECK (delivery IN ('pending', 'delivered', 'failed')), delivery_error TEXT);
INSERT INTO "cron_runs" VALUES(1,'b0ac386a',NULL,'2026-11-25T16:41:28.468143+00:00','2026-11-25T16:41:28.468721+00:00','ok',NULL,NULL,NULL);
CREATE TABLE cron_state (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        version INTEGER NOT NULL
    );
INSERT INTO "cron_state" VALUES(1,3);
CREATE TABLE entries (
        -- AUTOINCREMENT: ids are never reused, so an id is a stable paging cursor.
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id INTEGER NOT NULL REFERENCES sessions (id),
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        run_id TEXT,
        created_at TEXT NOT NULL
    , inbound_id INTEGER);
INSERT INTO "entries" VALUES(1,1,'message','{"role":"user","content":"hi"}','r1','2026-11-25T16:41:28.466204+00:00',1);
INSERT INTO "entries" VALUES(2,1,'message','{"role":"assistant","content":"hello"}','r1','2026-11-25T16:41:28.466204+00:00',NULL);
INSERT INTO "entries" VALUES(3,2,'note','{"text":"after /new"}',NULL,'2026-11-25T16:41:28.466574+00:00',NULL);
CREATE TABLE inbound (
        id INTEGER PRIMARY KEY,
        channel TEXT NOT NULL,
        message_id TEXT NOT NULL,
        message TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        received_at TEXT NOT NULL,
        done_at TEXT
    );
INSERT INTO "inbound" VALUES(1,'telegram','100','{"chat":{"channel":"telegram","chat_id":"1"},"text":"hi"}','done','2026-11-25T16:41:28.466100+00:00','2026-11-25T16:41:28.466722+00:00');
INSERT INTO "inbound" VALUES(2,'telegram','101','{"chat":{"channel":"telegram","chat_id":"1"},"text":"still owed"}','pending','2026-11-25T16:41:28.466846+00:00',NULL);
CREATE TABLE members (
        id TEXT PRIMARY KEY,  -- random, new at each start of a process
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        version TEXT NOT NULL,
        started_at TEXT NOT NULL,
        beat_at TEXT NOT NULL
    );
INSERT INTO "members" VALUES('099c9f404b37c789','box',42,'0.1.0','2026-11-25T16:41:28.467774+00:00','2026-11-25T16:41:28.467774+00:00');
CREATE TABLE outbox (
        id INTEGER PRIMARY KEY,
        channel TEXT NOT NULL,
        message TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'pending',
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        created_at TEXT NOT NULL,
        delivered_at TEXT
    , parts_sent INTEGER NOT NULL DEFAULT 0, failed_at TEXT, sent_id TEXT, cron_run INTEGER);
INSERT INTO "outbox" VALUES(1,'telegram','{"text":"hello"}','pending',0,NULL,'2026-11-25T16:41:28.466722+00:00',NULL,0,NULL,NULL,NULL);
INSERT INTO "outbox" VALUES(2,'discord','{"text":"a reply still owed"}','pending',0,NULL,'2026-11-25T16:41:28.466925+00:00',NULL,1,NULL,NULL,NULL);
CREATE TABLE pairing_requests (
        code TEXT PRIMARY KEY,
        channel TEXT NOT NULL,
        user_id TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        name TEXT,
        created_at TEXT NOT NULL,
        expires_at TEXT NOT NULL
    );
INSERT INTO "pairing_requests" VALUES('A89PPGEW','telegram','2','2','Bob','2026-11-25T16:41:28.467282+00:00','2026-11-25T17:41:28.467282+00:00');
CREATE TABLE sessions (
        id INTEGER PRIMARY KEY,
        key TEXT NOT NULL,
        created_at TEXT NOT NULL,
        archived_at TEXT
    );
INSERT INTO "sessions" VALUES(1,'telegram:1','2026-11-25T16:41:28.465957+00:00','2026-11-25T16:41:28.466356+00:00');
INSERT INTO "sessions" VALUES(2,'telegram:1','2026-11-25T16:41:28.466507+00:00',NULL);
CREATE TABLE streams (
        stream_id TEXT PRIMARY KEY,
        message_id INTEGER NOT NULL,
        created_at TEXT NOT NULL
    );
INSERT INTO "streams" VALUES('telegram-9',42,'2026-11-25T16:41:28.467068+00:00');
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
INSERT INTO "usage" VALUES(1,'telegram:1','r1','openai/m',10,5,0.25,'2026-11-25T16:41:28+00:00');
CREATE UNIQUE INDEX sessions_live_key ON sessions (key) WHERE archived_at IS NULL;
CREATE INDEX entries_session_id ON entries (session_id, id);
CREATE INDEX entries_inbound_id ON entries (inbound_id) WHERE inbound_id IS NOT NULL;
CREATE UNIQUE INDEX inbound_platform_id ON inbound (channel, message_id);
CREATE INDEX inbound_pending ON inbound (id) WHERE state = 'pending';
CREATE INDEX outbox_pending ON outbox (id) WHERE state = 'pending';
CREATE UNIQUE INDEX pairing_requests_user ON pairing_requests (channel, user_id);
CREATE INDEX usage_session_key ON usage (session_key, at);
CREATE INDEX cron_jobs_next_run ON cron_jobs (next_run) WHERE enabled = 1;
CREATE INDEX cron_jobs_owner ON cron_jobs (owner, created_at);
CREATE INDEX cron_runs_job ON cron_runs (job_id, id);
CREATE INDEX cron_runs_running ON cron_runs (id) WHERE status = 'running';
CREATE INDEX approval_requests_pending ON approval_requests (expires_at)
        WHERE state = 'pending';
CREATE INDEX approval_requests_run ON approval_requests (run_id);
CREATE UNIQUE INDEX approval_rules_key ON approval_rules (tool, rule_key);
CREATE INDEX outbox_failed ON outbox (failed_at) WHERE state = 'failed';
CREATE INDEX outbox_cron_run ON outbox (cron_run) WHERE cron_run IS NOT NULL;
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('entries',3);
INSERT INTO "sqlite_sequence" VALUES('cron_runs',1);
INSERT INTO "sqlite_sequence" VALUES('approval_log',1);
COMMIT;
PRAGMA user_version = 11;
