"""The sessions' full-text index (`store.search`) on both backends: what is found and in
what order, what is never indexed, bounds, hostile queries, the index kept in the append's
transaction, and the backfill of entries from before it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nanobot.errors import StoreError
from nanobot.outage import Backoff, sleep_or_wake
from nanobot.recall import QueryError, Scope, Search, terms
from nanobot.store import Database, NewEntry, SessionStore, migrations
from nanobot.store import search as search_module
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


async def test_windows_of_the_newest_ids_find_what_the_whole_range_finds(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PostgreSQL looks among the newest ids first (`SearchIndex._matching`): whatever window
    # answers, the hits are those of the whole range. Scaled down: 100 matches scored.
    store = SessionStore(db)
    sid = await store.live("telegram:1")
    await store.append(
        sid,
        [said("user", f"the {'melon ' * (1 + n % 3) if n % 2 else ''}day {n}") for n in range(600)],
    )
    monkeypatch.setattr(search_module, "RANKED_MATCHES", 100)
    found: dict[int, list[list[tuple[int, float]]]] = {}
    for window in (120, 10**9):  # the first window, or the second, answers; or none
        monkeypatch.setattr(search_module, "WINDOW", window)
        index = SearchIndex(db)
        found[window] = [
            [
                (hit.entry_id, round(hit.score, 6))  # recency moves on in the 9th digit
                for hit in (await index.search(Search(terms(q)))).hits
            ]
            for q in ["the", "melon", "melon day", "day 7", "nothing"]
        ]
    assert found[120] == found[10**9]
    assert len(found[120][1]) == 10 and found[120][4] == []


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


async def test_the_backfill_waits_out_a_failing_store_and_goes_on(db: Database) -> None:
    store = SessionStore(db)
    sid = await store.live("telegram:1")
    for n in range(3):
        await db.execute(
            INSERT_ENTRY, (sid, json.dumps({"role": "user", "content": f"fig {n}"}), STAMP)
        )
    await db.execute("UPDATE search_backfill SET below = (SELECT MAX(id) + 1 FROM entries)")
    # A real failure: the table the backfill starts from is gone until the second pause.
    await db.execute("ALTER TABLE search_backfill RENAME TO search_backfill_away")
    pauses: list[float | None] = []

    async def sleep(seconds: float | None, wake: asyncio.Event) -> None:
        pauses.append(seconds)
        await sleep_or_wake(seconds, wake)
        if len(pauses) == 2:
            await db.execute("ALTER TABLE search_backfill_away RENAME TO search_backfill")

    index = SearchIndex(db)
    retry = Backoff((0.05, 0.2))  # the pauses of `store.retry_seconds`, short
    await asyncio.wait_for(index.backfill_all(pause=0, retry=retry, sleep=sleep), 10)
    assert pauses == [pytest.approx(0.05, abs=0.04), pytest.approx(0.2, abs=0.04)]
    found = await index.search(Search(terms("fig"), limit=50))
    assert found.complete and len(found.hits) == 3


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


async def test_words_of_ascii_text_are_cut_alike_on_both_backends(db: Database) -> None:
    # SQLite's FTS5 gets ASCII text as it is and cuts it itself (`sqlite_words_of`): the
    # words must be those `recall.words` makes, which PostgreSQL gets.
    store = SessionStore(db)
    sid = await store.live("telegram:1")
    text = "Snake_case, don't! v1.2.3 e-mail: ME@Example.ORG x86_64 (C++)"
    quoted = 'a "quoted" back\\slash\nand a new line, \\u0041 kept\t(tab)'
    parts = [
        {"type": "text", "text": "kumquat in a part"},
        {"type": "image_url", "image_url": {"url": "data:x"}},
        {"type": "text", "text": "and another"},
    ]
    await store.append(
        sid,
        [
            said("user", text),
            said("user", "!!! ..."),
            said("assistant", quoted),
            NewEntry("message", {"role": "user", "content": parts}),
        ],
    )
    assert await search(db, "quoted back slash and") == [quoted]
    assert await search(db, '"u0041 kept"') == [quoted]
    assert await search(db, "part and another") == ["kumquat in a part\nand another"]
    assert await search(db, "image url") == []
    for query in ["snake", "case", "snake_case", "don t", "dont", "v1 2 3", "e-mail", "me"]:
        assert await search(db, query) == ([] if query == "dont" else [text]), query
    for query in ["example org", "x86 64", "c"]:
        assert await search(db, query) == [text], query
    assert await search(db, "v1.2.3 example.org") == [text]


async def test_words_wait_for_a_batch_yet_every_search_finds_them(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with await Database.open(path) as db:
        store = SessionStore(db)
        sid = await store.live("telegram:1")

        async def waiting() -> int:
            row = await db.fetchone(
                "SELECT count(*) FROM entries WHERE unindexed_words IS NOT NULL"
            )
            return -1 if row is None else int(row[0])

        # 150 entries in one append, a tool result among them: their words wait in their
        # rows, a full batch, until the next append moves them into FTS5.
        entries = [said("user", f"apricot {n}") for n in range(150)]
        tool = NewEntry("message", {"role": "tool", "tool_call_id": "t", "content": "x"})
        entries.insert(70, tool)
        await store.append(sid, entries)
        assert await waiting() == 150
        await store.append(sid, [tool])  # no words of its own, yet it moves the batch
        assert await waiting() == 0
        await store.append(sid, [said("assistant", "apricot jam, said last")])
        assert await waiting() == 1
        # Another process's store moves the words this one left too, at its own batch.
        other = SessionStore(db)
        await other.append(sid, [said("user", f"banana {n}") for n in range(64)])
        assert await waiting() == 65
        await other.append(sid, [said("user", "cherry")])
        assert await waiting() == 0
    # Reopened (as after a crash): the words that were still waiting are found too.
    async with await Database.open(path) as db:
        assert await search(db, "jam") == ["apricot jam, said last"]
        assert len(await search(db, "apricot", limit=50)) == 50
        for n in (0, 69, 70, 149):
            assert await search(db, f"apricot {n}") == [f"apricot {n}"]
        left = await db.fetchone("SELECT count(*) FROM entries WHERE unindexed_words IS NOT NULL")
        assert left is not None and int(left[0]) == 0
        rows = await db.fetchall(
            "SELECT rowid FROM entry_words WHERE entry_words MATCH 'apricot' ORDER BY rowid"
        )
        assert len(rows) == 151 == len({int(row[0]) for row in rows})  # each entry once
        assert await search(db, "cherry") == ["cherry"]
