"""The sessions' full-text index (`store.search`) on both backends: what is found and in
what order, what is never indexed, bounds, hostile queries, the index kept in the append's
transaction, and the backfill of entries from before it."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nanobot.errors import StoreError
from nanobot.recall import QueryError, Scope, Search, terms
from nanobot.store import Database, NewEntry, SessionStore, migrations
from nanobot.store.dialect import SQLITE
from nanobot.store.search import SearchIndex

INSERT_ENTRY = (
    "INSERT INTO entries (session_id, kind, data, created_at) VALUES (?, 'message', ?, ?)"
)
STAMP = "2025-01-01T00:00:00.000000+00:00"


def said(role: str, text: str) -> NewEntry:
    return NewEntry("message", {"role": role, "content": text})


async def search(db: Database, query: str, **options: object) -> list[str]:
    found = await SearchIndex(db).search(Search(terms(query), **options))  # type: ignore[arg-type]
    return [hit.said.text for hit in found.hits]


async def age(db: Database, text: str, days: int) -> None:
    """Make the entry saying `text` `days` old (ids keep their order: only the score moves)."""
    stamp = (datetime.now(UTC) - timedelta(days=days)).isoformat(timespec="microseconds")
    rows = await db.fetchall("SELECT id, data FROM entries")
    for row in rows:
        if json.loads(row["data"]).get("content") == text:
            await db.execute("UPDATE entries SET created_at = ? WHERE id = ?", (stamp, row["id"]))


async def test_a_corpus_ranks_phrases_recency_and_finds_chinese(db: Database) -> None:
    store = SessionStore(db)
    first, second = await store.live("telegram:1"), await store.live("discord:2")
    await store.append(
        first,
        [
            said("user", "[2026-01-31 09:05 Sat CET]\nthe script to deploy the site broke again"),
            said("assistant", "I rewrote the deploy script; it runs from cron now"),
            said("user", "我喜欢猫，也喜欢狗"),
            NewEntry(
                "message",
                {"role": "tool", "tool_call_id": "c1", "content": "deploy secret=hunter2"},
            ),
            NewEntry("compaction", {"summary": "deploy script summary"}),
        ],
    )
    await store.append(
        second,
        [said("user", "Old news: deploy script v1 went out"), said("assistant", "今天天气很好")],
    )
    await age(db, "Old news: deploy script v1 went out", 20)
    hits = await search(db, "deploy script")
    # The exact phrase first (the newer one first), the words apart after them.
    assert hits[0] == "I rewrote the deploy script; it runs from cron now"
    assert hits[1] == "Old news: deploy script v1 went out"
    assert hits[2] == "the script to deploy the site broke again"
    assert len(hits) == 3  # neither the tool result nor the compaction summary is indexed
    assert await search(db, "hunter2") == []
    assert await search(db, "喜欢猫") == ["我喜欢猫，也喜欢狗"]
    assert await search(db, "喜欢") == ["我喜欢猫，也喜欢狗"]  # two characters
    assert await search(db, "猫") == ["我喜欢猫，也喜欢狗"]  # one
    assert await search(db, "天气") == ["今天天气很好"]
    # The time envelope of a user message is not what it said.
    assert await search(db, "CET") == []


async def test_of_two_equal_hits_the_newer_ranks_first(db: Database) -> None:
    store = SessionStore(db)
    sid = await store.live("telegram:1")
    await store.append(
        sid, [said("user", "the mango tree (a)"), said("user", "the mango tree (b)")]
    )
    await age(db, "the mango tree (a)", 90)
    assert await search(db, "mango") == ["the mango tree (b)", "the mango tree (a)"]


async def test_hostile_queries_neither_fail_nor_inject(db: Database) -> None:
    store = SessionStore(db)
    sid = await store.live("telegram:1")
    await store.append(sid, [said("user", "near the station, not far; a OR b and (c)")])
    for query in [
        '"',
        '"unclosed',
        "*",
        "NEAR(a b)",
        "-x",
        "col:val",
        "^start",
        "(a",
        "a)",
        "AND",
        "OR NOT",
        "x' OR '1'='1",
        "a & b | !c <-> d",
        "words:near",
        "\\",
    ]:
        with contextlib.suppress(QueryError):  # no words in it: refused before the database
            await search(db, query)
    assert await search(db, "NEAR not") == ["near the station, not far; a OR b and (c)"]
    assert await search(db, "(c)") == ["near the station, not far; a OR b and (c)"]


async def test_compacted_entries_limits_dates_and_scope(db: Database) -> None:
    store = SessionStore(db)
    group, private = await store.live("telegram:-100"), await store.live("telegram:7")
    await store.append(group, [said("user", f"kiwi number {n}") for n in range(30)])
    await store.append(group, [NewEntry("compaction", {"summary": "they talked about fruit"})])
    await store.append(private, [said("user", "kiwi in private")])
    assert len(await search(db, "kiwi")) == 10  # the default
    assert len(await search(db, "kiwi", limit=50)) == 31
    only = await search(db, "kiwi", scope=Scope(frozenset({"telegram:7"})), limit=50)
    assert only == ["kiwi in private"]
    await age(db, "kiwi number 0", 10)
    week = datetime.now(UTC) - timedelta(days=7)
    assert "kiwi number 0" not in await search(db, "kiwi", since=week, limit=50)
    assert await search(db, "kiwi", until=week, limit=50) == ["kiwi number 0"]
    index = SearchIndex(db)
    [hit] = (await index.search(Search(terms("private")))).hits
    around = await index.around(hit.entry_id, before=2, after=2)
    assert around is not None and around[-1].said.text == "kiwi in private"
    assert await index.around(hit.entry_id, before=1, after=1, scope=Scope(frozenset())) is None


async def test_a_failed_append_leaves_no_words_behind(db: Database) -> None:
    store = SessionStore(db)
    sid = await store.live("telegram:1")
    with pytest.raises(StoreError):  # the second entry's session does not exist
        await db.atomic(
            [
                (
                    INSERT_ENTRY,
                    (sid, '{"role":"user","content":"x"}', STAMP),
                ),
                (
                    INSERT_ENTRY,
                    (999_999, "{}", STAMP),
                ),
            ]
        )
    with pytest.raises(StoreError):
        await store.append(999_999, [said("user", "orphaned words")])
    assert await search(db, "orphaned") == []
    await store.append(sid, [said("user", "kept words")])
    assert await search(db, "kept") == ["kept words"]
    assert await search(db, "orphaned words kept") == ["kept words"]  # any term, failing all


async def test_the_backfill_indexes_what_came_before(db: Database) -> None:
    store = SessionStore(db)
    sid = await store.live("telegram:1")
    for n in range(7):
        await db.execute(
            "INSERT INTO entries (session_id, kind, data, created_at) VALUES (?, 'message', ?, ?)",
            (
                sid,
                json.dumps({"role": "user", "content": f"older plum {n}"}),
                datetime.now(UTC).isoformat(timespec="microseconds"),
            ),
        )
    await db.execute("UPDATE search_backfill SET below = (SELECT MAX(id) + 1 FROM entries)")
    await store.append(sid, [said("user", "newer plum")])
    index = SearchIndex(db)
    found = await index.search(Search(terms("plum"), limit=50))
    assert [h.said.text for h in found.hits] == ["newer plum"] and not found.complete
    progress = await index.backfill(batch=3)
    assert not progress.done
    await index.backfill_all(pause=0)
    found = await index.search(Search(terms("plum"), limit=50))
    assert found.complete and len(found.hits) == 8
    assert (await index.backfill()).done  # nothing twice


async def test_the_migration_marks_existing_entries_for_the_backfill(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for version in range(1, 22):
        conn.executescript(migrations.script(version, SQLITE))
    conn.execute("PRAGMA user_version = 21")
    conn.execute("INSERT INTO sessions (id, key, created_at) VALUES (1, 'telegram:1', ?)", (STAMP,))
    conn.execute(
        "INSERT INTO entries (session_id, kind, data, created_at) VALUES (1, 'message', ?, ?)",
        (json.dumps({"role": "assistant", "content": "said before the upgrade"}), STAMP),
    )
    conn.commit()
    conn.close()
    async with await Database.open(path) as db:
        index = SearchIndex(db)
        assert (await index.progress()).below == 2
        await index.backfill_all(pause=0)
        assert await search(db, "upgrade") == ["said before the upgrade"]


async def test_the_migration_names_the_sender_of_entries_from_their_journal_row(
    tmp_path: Path,
) -> None:
    """Entries from before senders were kept take theirs from the inbound journal (while
    its row is there), so `nanobot people forget` finds a person's words in groups."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for version in range(1, 25):
        conn.executescript(migrations.script(version, SQLITE))
    conn.execute("PRAGMA user_version = 24")
    conn.execute(
        "INSERT INTO sessions (id, key, created_at) VALUES (1, 'telegram:-5', ?)", (STAMP,)
    )
    conn.execute(
        "INSERT INTO inbound (id, channel, message_id, message, received_at)"
        " VALUES (7, 'telegram', '1', ?, ?)",
        (json.dumps({"sender_id": "111", "text": "hi"}), STAMP),
    )
    said = json.dumps({"role": "user", "content": "hi"})
    conn.executemany(
        "INSERT INTO entries (session_id, kind, data, created_at, inbound_id)"
        " VALUES (1, 'message', ?, ?, ?)",
        [(said, STAMP, 7), (said, STAMP, 8), (said, STAMP, None)],  # 8: its row was purged
    )
    conn.commit()
    conn.close()
    async with await Database.open(path) as db:
        rows = await db.fetchall("SELECT sender FROM entries ORDER BY id")
    assert [r["sender"] for r in rows] == ["telegram:111", None, None]
