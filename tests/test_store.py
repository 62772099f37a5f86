"""The state store on each backend in turn (`db` and `store_target` from conftest): a SQLite
file in a temporary directory, and a fresh PostgreSQL database where one answers. What only
one backend does is in test_store_sqlite.py and test_store_postgres.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Sequence
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest

from nanobot.errors import StoreError
from nanobot.store import Access, Database, Entry, Journal, NewEntry, SessionStore
from nanobot.store.access import MAX_PENDING
from nanobot.store.journal import FailedReplies


@pytest.fixture
def store(db: Database) -> SessionStore:
    return SessionStore(db)


def message(content: str, role: str = "user") -> NewEntry:
    return NewEntry("message", {"role": role, "content": content})


def contents(entries: Sequence[Entry]) -> list[str]:
    return [str(entry.data["content"]) for entry in entries]


# --- opening -------------------------------------------------------------------------------


async def test_reopening_keeps_data_and_does_not_migrate_again(store_target: Path | str) -> None:
    async with await Database.open(store_target) as db:
        store = SessionStore(db)
        session = await store.live("telegram:1")
        await store.append(session, [message("hello")])
    async with await Database.open(store_target) as db:
        store = SessionStore(db)
        assert await store.live("telegram:1") == session
        assert contents(await store.tail(session, 10)) == ["hello"]


async def test_closed_database_raises_store_error(store_target: Path | str) -> None:
    db = await Database.open(store_target)
    await db.close()
    await db.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await db.fetchall("SELECT 1")


# --- entries -------------------------------------------------------------------------------


async def test_append_returns_stored_entries_and_tail_reads_them_back(
    store: SessionStore,
) -> None:
    session = await store.live("discord:42")
    tool_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "ö.md"}'},
            }
        ],
    }
    appended = await store.append(
        session,
        [
            message("grüß dich 👋"),
            NewEntry("message", tool_call, run_id="run-1"),
            NewEntry("message", {"role": "tool", "tool_call_id": "call_1", "content": "…"}),
            NewEntry("note", {"text": "model switched"}),
        ],
    )
    assert [entry.id for entry in appended] == sorted(entry.id for entry in appended)
    assert await store.tail(session, 10) == appended
    first = appended[0]
    assert first.session_id == session
    assert first.created_at.tzinfo is not None
    assert first.created_at.utcoffset() == UTC.utcoffset(None)
    assert appended[1].data == tool_call
    assert appended[1].run_id == "run-1"
    assert await store.count(session) == 4


async def test_tail_returns_most_recent_entries_oldest_first(store: SessionStore) -> None:
    session = await store.live("k")
    other = await store.live("other")
    for i in range(7):
        await store.append(session, [message(f"m{i}")])
        await store.append(other, [message(f"x{i}")])
    assert contents(await store.tail(session, 3)) == ["m4", "m5", "m6"]
    assert contents(await store.tail(session, 100)) == [f"m{i}" for i in range(7)]
    assert await store.tail(session, 0) == []


async def test_tail_pages_backwards_with_before_id(store: SessionStore) -> None:
    session = await store.live("k")
    await store.append(session, [message(f"m{i}") for i in range(25)])
    pages: list[list[str]] = []
    before: int | None = None
    while page := await store.tail(session, 10, before_id=before):
        pages.append(contents(page))
        before = page[0].id
    assert [len(page) for page in pages] == [10, 10, 5]
    assert [text for page in reversed(pages) for text in page] == [f"m{i}" for i in range(25)]


async def test_since_reads_forward_from_an_id(store: SessionStore) -> None:
    session = await store.live("k")
    other = await store.live("other")
    first = await store.append(session, [message(f"m{i}") for i in range(5)])
    await store.append(other, [message("x")])
    await store.append(session, [message("m5")])
    assert contents(await store.since(session, first[2].id, 10)) == ["m3", "m4", "m5"]
    assert contents(await store.since(session, first[2].id, 2)) == ["m3", "m4"]
    assert contents(await store.since(session, 0, 1)) == ["m0"]


async def test_append_to_a_missing_session_raises_and_writes_nothing(
    db: Database, store: SessionStore
) -> None:
    with pytest.raises(StoreError, match=r"(?i)foreign key") as raised:
        await store.append(999, [message("lost")])
    assert db.name in str(raised.value)
    assert (await store.stats()).entries == 0


async def test_append_is_all_or_nothing(store: SessionStore) -> None:
    session = await store.live("k")
    with pytest.raises(TypeError):
        await store.append(session, [message("ok"), NewEntry("note", {"bad": {1, 2}})])
    assert await store.count(session) == 0
    assert await store.append(session, []) == []


async def test_concurrent_appends_in_one_process_keep_each_batch_together(
    store: SessionStore,
) -> None:
    session = await store.live("k")
    batches = await asyncio.gather(
        *(store.append(session, [message(f"{b}.{i}") for i in range(5)]) for b in range(20))
    )
    for batch in batches:
        ids = [entry.id for entry in batch]
        assert ids == list(range(ids[0], ids[0] + 5))
    assert await store.count(session) == 100


# --- transactions --------------------------------------------------------------------------


async def test_transaction_rolls_back_everything_when_the_block_raises(
    db: Database, store: SessionStore
) -> None:
    session = await store.live("k")
    with pytest.raises(RuntimeError):
        async with db.transaction():
            await store.append(session, [message("a")])
            await store.archive("k")
            raise RuntimeError("boom")
    assert await store.count(session) == 0
    assert await store.live("k") == session


async def test_nested_transaction_that_raises_undoes_only_itself(
    db: Database, store: SessionStore
) -> None:
    session = await store.live("k")
    async with db.transaction():
        await store.append(session, [message("kept")])
        with pytest.raises(RuntimeError):
            async with db.transaction():
                await store.append(session, [message("undone")])
                raise RuntimeError("inner")
        await store.append(session, [message("also kept")])
    assert contents(await store.tail(session, 10)) == ["kept", "also kept"]


async def test_tasks_started_inside_a_transaction_join_it(
    db: Database, store: SessionStore
) -> None:
    session = await store.live("k")
    with pytest.raises(RuntimeError):
        async with db.transaction():
            await asyncio.wait_for(store.append(session, [message("a")]), timeout=10)
            await asyncio.gather(store.count(session), store.count(session))
            raise RuntimeError("boom")
    assert await store.count(session) == 0


async def test_a_cancelled_transaction_rolls_back(db: Database, store: SessionStore) -> None:
    session = await store.live("k")
    inside = asyncio.Event()

    async def writer() -> None:
        async with db.transaction():
            await store.append(session, [message("pending")])
            inside.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(writer())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.count(session) == 0
    assert len(await store.append(session, [message("after")])) == 1


async def test_other_tasks_never_see_a_transaction_in_progress(
    db: Database, store: SessionStore
) -> None:
    # SQLite makes the reader wait for the block; PostgreSQL answers from what is
    # committed. Either way the rows of a block that is rolled back are never seen.
    session = await store.live("k")
    inside, release = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        with contextlib.suppress(RuntimeError):
            async with db.transaction():
                await store.append(session, [message("pending")])
                inside.set()
                await release.wait()
                raise RuntimeError("undo")

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(writer())
        await inside.wait()
        reader = tasks.create_task(store.count(session))
        await asyncio.sleep(0)  # the reader's statement is on its way before the rollback
        release.set()
    assert reader.result() == 0
    assert await store.count(session) == 0


# --- sessions ------------------------------------------------------------------------------


async def test_live_returns_the_same_session_until_archived(store: SessionStore) -> None:
    first = await store.live("telegram:1")
    assert await store.live("telegram:1") == first
    assert await store.live("telegram:2") != first
    await store.append(first, [message("old")])

    assert await store.archive("telegram:1") == first
    assert await store.archive("telegram:1") is None
    second = await store.live("telegram:1")
    assert second != first
    await store.append(second, [message("new")])

    assert contents(await store.tail(first, 10)) == ["old"]
    infos = await store.sessions("telegram:1")
    assert [(info.id, info.entry_count) for info in infos] == [(first, 1), (second, 1)]
    assert infos[0].archived_at is not None
    assert infos[0].archived_at >= infos[0].created_at
    assert infos[1].archived_at is None
    assert len(await store.sessions()) == 3
    assert await store.sessions("nobody") == []


async def test_concurrent_live_calls_agree_on_one_session(store: SessionStore) -> None:
    ids = await asyncio.gather(*(store.live("k") for _ in range(10)))
    assert len(set(ids)) == 1


async def test_execute_returns_the_rows_it_changed(db: Database) -> None:
    await db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)")
    assert await db.execute("INSERT INTO t VALUES ('a', 1), ('b', 1), ('c', 2)") == 3
    assert await db.execute("INSERT INTO t VALUES ('a', 9) ON CONFLICT DO NOTHING") == 0
    async with db.transaction():
        assert await db.execute("UPDATE t SET v = 3 WHERE v = 1") == 2
        assert await db.execute("DELETE FROM t WHERE k = ?", ("zzz",)) == 0
    assert await db.execute("DELETE FROM t") == 3
    assert await db.execute("SELECT 1") == 0


async def test_statements_sent_at_once_keep_counts_and_transactions_exact(
    db: Database,
) -> None:
    # Statements from many tasks go to the thread without waiting for each other; each
    # `execute` counts only its own changes, and a transaction sees only its own statements.
    await db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    await db.execute("INSERT INTO t VALUES (0, 'x')")

    async def insert(k: int) -> None:
        assert await db.fetchone("INSERT INTO t VALUES (?, 'y') RETURNING k", (k,)) is not None

    async def touch() -> int:
        return await db.execute("UPDATE t SET v = v WHERE k = 0")

    async def rolled_back() -> None:
        with contextlib.suppress(RuntimeError):
            async with db.transaction():
                await db.execute("INSERT INTO t VALUES (-1, 'gone')")
                raise RuntimeError("undo")

    work: list[Coroutine[Any, Any, int | None]] = [insert(k) for k in range(1, 201)]
    work[50:50] = [touch() for _ in range(20)]
    work.insert(100, rolled_back())
    results = await asyncio.gather(*work)
    assert [r for r in results if r is not None] == [1] * 20
    assert tuple(await db.fetchone("SELECT count(*), min(k) FROM t") or ()) == (201, 0)


async def test_atomic_returns_each_statements_rows_or_keeps_nothing(db: Database) -> None:
    await db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    rows = await db.atomic(
        [
            ("INSERT INTO t VALUES (1, 'a') RETURNING k", ()),
            ("INSERT INTO t VALUES (?, ?) RETURNING v", (2, "b")),
            ("UPDATE t SET v = 'c' WHERE k = 1", ()),
            ("SELECT k, v FROM t ORDER BY k", ()),
        ]
    )
    assert [[tuple(r) for r in result] for result in rows] == [
        [(1,)],
        [("b",)],
        [],
        [(1, "c"), (2, "b")],
    ]
    with pytest.raises(StoreError, match=r"(?i)not.null"):
        await db.atomic(
            [("INSERT INTO t VALUES (3, 'd')", ()), ("INSERT INTO t VALUES (4, NULL)", ())]
        )
    assert await db.fetchall("SELECT k FROM t WHERE k > 2") == []  # the first was undone
    [[row]] = await db.atomic([("INSERT INTO t VALUES (3, 'd') RETURNING k", ())])
    assert row["k"] == 3


async def test_atomic_inside_a_transaction_is_a_savepoint_of_it(db: Database) -> None:
    await db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    async with db.transaction():
        await db.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(StoreError, match=r"(?i)unique"):
            await db.atomic([("INSERT INTO t VALUES (2)", ()), ("INSERT INTO t VALUES (1)", ())])
        await db.atomic([("INSERT INTO t VALUES (3)", ())])
    assert [r[0] for r in await db.fetchall("SELECT k FROM t ORDER BY k")] == [1, 3]


async def test_atomic_from_another_task_stays_out_of_a_transaction(db: Database) -> None:
    await db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    inside, release = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        async with db.transaction():
            await db.execute("INSERT INTO t VALUES (1)")
            inside.set()
            await release.wait()
            await db.execute("DELETE FROM t WHERE k = 1")

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(writer())
        await inside.wait()
        other = tasks.create_task(db.atomic([("SELECT count(*) FROM t", ())]))
        await asyncio.sleep(0)
        release.set()
    # Before the block (PostgreSQL) or after it (SQLite waits): never inside it.
    assert other.result()[0][0][0] == 0


async def test_close_lets_statements_already_sent_finish(store_target: Path | str) -> None:
    db = await Database.open(store_target)
    await db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    inserts = [
        asyncio.ensure_future(db.fetchone("INSERT INTO t VALUES (?) RETURNING k", (k,)))
        for k in range(100)
    ]
    await asyncio.sleep(0)  # each task runs to its first wait: its statement is sent
    await db.close()
    assert [tuple(row or ()) for row in await asyncio.gather(*inserts)] == [
        (k,) for k in range(100)
    ]
    async with await Database.open(store_target) as again:
        assert tuple(await again.fetchone("SELECT count(*) FROM t") or ()) == (100,)


async def test_streams_are_remembered_until_finished_and_pruned_when_stale(
    db: Database,
) -> None:
    journal = Journal(db)
    await journal.stream_started("telegram-7", 41)
    await journal.stream_started("telegram-7", 42)  # posted again: the newer message counts
    await journal.stream_started("discord-8", 99)
    assert await journal.open_streams() == {"telegram-7": 42, "discord-8": 99}
    await journal.stream_finished("discord-8")
    await journal.stream_finished("never-started")
    assert await journal.open_streams() == {"telegram-7": 42}
    # Pruning forgets finished journal rows and streams older than the window, nothing else.
    inbound = await journal.accept("telegram", "m1", {"text": "hi"})
    assert inbound is not None
    await journal.complete([inbound], ("telegram", {"text": "hello"}))
    pending = await journal.accept("telegram", "m2", {"text": "still owed"})
    assert await journal.prune(timedelta(days=7)) == 0
    assert await journal.prune(timedelta(seconds=-1)) == 2  # the answered message, the stream
    assert await journal.open_streams() == {}
    assert [p.id for p in await journal.pending_inbound()] == [pending]
    assert [o.message for o in await journal.pending_outbox()] == [{"text": "hello"}]


async def test_a_reply_refused_for_good_is_failed_with_its_reason_and_never_owed(
    db: Database,
) -> None:
    journal = Journal(db)
    assert await journal.failed_replies() == FailedReplies(0)
    blocked = await journal.enqueue("telegram", {"text": "to a blocked chat"})
    gone = await journal.enqueue("discord", {"text": "to a deleted channel"})
    owed = await journal.enqueue("telegram", {"text": "still owed"})
    await journal.fail(blocked, "sendMessage: Internal Server Error")  # a try that may pass
    await journal.give_up(blocked, "Forbidden: bot was blocked by the user")
    await journal.give_up(gone, "404 Not Found (error code: 10003): Unknown Channel")
    await journal.confirm(owed)
    await journal.give_up(owed, "too late: it was delivered")  # only a pending reply fails
    assert await journal.pending_outbox() == []
    failed = await journal.failed_replies()
    assert (failed.count, failed.last_reason) == (
        2,
        "404 Not Found (error code: 10003): Unknown Channel",
    )
    assert failed.last_at is not None and failed.last_at.tzinfo is not None
    row = await db.fetchone("SELECT state, attempts FROM outbox WHERE id = ?", (blocked,))
    assert row is not None and tuple(row) == ("failed", 2)
    # Kept like delivered replies: pruned once older than the window, and not before.
    assert await journal.prune(timedelta(days=7)) == 0
    assert await journal.prune(timedelta(seconds=-1)) == 3
    assert await journal.failed_replies() == FailedReplies(0)


async def test_stats_count_sessions_entries_and_bytes(store: SessionStore) -> None:
    session = await store.live("a")
    await store.live("b")
    await store.archive("b")
    await store.append(session, [message("x" * 1000) for _ in range(3)])
    stats = await store.stats()
    assert (stats.sessions, stats.live_sessions, stats.entries) == (2, 1, 3)
    assert stats.size_bytes > 0


# --- access: pairing requests ----------------------------------------------------------------


async def test_a_user_keeps_one_pairing_code_while_it_is_valid(db: Database) -> None:
    access = Access(db)
    first = await access.request("telegram", "7", "7", "Eve")
    again = await access.request("telegram", "7", "7", "Eve")
    assert first.new and not again.new and again.code == first.code
    assert [r.user_id for r in await access.pending()] == ["7"]


async def test_a_full_channel_replaces_its_oldest_request(db: Database) -> None:
    access = Access(db)
    users = [str(n) for n in range(MAX_PENDING)]
    issued = [await access.request("telegram", user, user, None) for user in users]
    await access.request("discord", "1", "1", None)  # another channel's count is its own
    assert [i.evicted for i in issued] == [0] * MAX_PENDING
    newcomer = await access.request("telegram", "new", "new", None)
    assert newcomer.new and newcomer.evicted == 1
    telegram = [r.user_id for r in await access.pending() if r.channel == "telegram"]
    assert telegram == [*users[1:], "new"]
    assert await access.waiting() == {"discord": 1, "telegram": MAX_PENDING}
    assert await access.approve(issued[0].code) is None  # its code no longer works
    assert await access.approve(newcomer.code) is not None
    back = await access.request("telegram", "0", "0", None)  # writing again: a fresh code
    assert back.new and back.code != issued[0].code and back.evicted == 0


async def test_expired_requests_neither_wait_nor_take_room(db: Database) -> None:
    access = Access(db)
    for user in range(MAX_PENDING):
        await access.request("telegram", str(user), str(user), None)
    await db.execute("UPDATE pairing_requests SET expires_at = '2000-01-01T00:00:00+00:00'")
    assert await access.waiting() == {} and await access.pending() == []
    assert (await access.request("telegram", "new", "new", None)).evicted == 0
