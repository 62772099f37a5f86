"""Writes many tasks hand in at once (store/_together.py): one write for what came
together, each item's own result, an item at fault failing alone; and the stores that use
it, on both backends (SQLite writes each item on its own)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from nanobot.errors import StoreError
from nanobot.store import Database, Journal, NewEntry, SessionStore
from nanobot.store._together import Together


class Writes:
    """A write that notes each batch it is given, and fails where told."""

    def __init__(self, *, storage: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.storage = storage

    async def __call__(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        await self.release.wait()
        if any(item < 0 for item in items):
            error = StoreError(f"refused {min(items)}")
            error.storage = self.storage
            raise error
        return [item * 10 for item in items]


async def test_items_handed_in_together_go_out_in_one_write_each_with_its_result() -> None:
    writes = Writes()
    together = Together(writes, name="test", most=100)
    assert await asyncio.gather(*(together(n) for n in range(5))) == [0, 10, 20, 30, 40]
    assert writes.batches == [[0, 1, 2, 3, 4]]
    assert await together(7) == 70  # alone: written at once, on its own
    assert writes.batches[-1] == [7]


async def test_items_coming_while_a_write_is_under_way_go_in_the_next() -> None:
    writes = Writes()
    writes.release.clear()
    together = Together(writes, name="test", most=3)
    first = asyncio.gather(*(together(n) for n in range(2)))
    await asyncio.sleep(0.01)
    later = asyncio.gather(*(together(n) for n in range(2, 7)))
    await asyncio.sleep(0.01)
    writes.release.set()
    assert await first == [0, 10]
    assert await later == [20, 30, 40, 50, 60]
    assert writes.batches == [[0, 1], [2, 3, 4], [5, 6]]  # at most `most` a write


async def test_an_item_at_fault_fails_alone() -> None:
    writes = Writes()
    together = Together(writes, name="test", most=100)
    results = await asyncio.gather(*(together(n) for n in (1, -2, 3)), return_exceptions=True)
    assert results[0] == 10 and results[2] == 30
    assert isinstance(results[1], StoreError) and str(results[1]) == "refused -2"
    assert writes.batches == [[1, -2, 3], [1], [-2], [3]]


async def test_a_storage_failure_fails_every_item_of_the_write_and_is_not_repeated() -> None:
    writes = Writes(storage=True)
    together = Together(writes, name="test", most=100)
    results = await asyncio.gather(*(together(n) for n in (1, -2, 3)), return_exceptions=True)
    assert all(isinstance(r, StoreError) for r in results)
    assert writes.batches == [[1, -2, 3]]  # it may have run: never sent again


async def test_closing_waits_for_what_was_handed_in() -> None:
    writes = Writes()
    writes.release.clear()
    together = Together(writes, name="test", most=100)
    pending = asyncio.ensure_future(together(4))
    await asyncio.sleep(0.01)
    closing = asyncio.ensure_future(together.close())
    await asyncio.sleep(0.01)
    assert not closing.done()
    writes.release.set()
    await closing
    assert await pending == 40


async def test_a_write_cut_off_by_a_cancelled_close_fails_its_items_and_the_waiting() -> None:
    writes = Writes()
    writes.release.clear()  # the first write never ends
    together = Together(writes, name="test", most=1)
    items = [asyncio.ensure_future(together(n)) for n in range(3)]
    await asyncio.sleep(0.01)
    closing = asyncio.ensure_future(together.close())
    await asyncio.sleep(0.01)
    closing.cancel()  # as a forced shutdown: the write under way is cancelled
    with pytest.raises(asyncio.CancelledError):
        await closing
    for item in items:
        with pytest.raises(StoreError, match="stopped before writing"):
            await item
    assert writes.batches == [[0]]


async def test_many_sessions_appending_at_once_each_get_their_entries_in_order(
    db: Database,
) -> None:
    store = SessionStore(db)
    sessions = [await store.live(f"telegram:{n}") for n in range(30)]

    async def turn(session: int) -> list[int]:
        ids = []
        for step in range(4):
            entry = NewEntry("message", {"role": "user", "content": f"{session}/{step}"})
            [stored] = await store.append(session, [entry])
            ids.append(stored.id)
        return ids

    appended = await asyncio.gather(*(turn(s) for s in sessions))
    for session, ids in zip(sessions, appended, strict=True):
        assert ids == sorted(ids)
        stored = await store.tail(session, 10)
        assert [e.id for e in stored] == ids
        assert [e.data["content"] for e in stored] == [f"{session}/{n}" for n in range(4)]


async def test_an_append_to_a_missing_session_fails_alone(db: Database) -> None:
    store = SessionStore(db)
    live = await store.live("telegram:1")
    entry = NewEntry("message", {"role": "user", "content": "hi"})
    results = await asyncio.gather(
        store.append(live, [entry]), store.append(999_999, [entry]), return_exceptions=True
    )
    assert isinstance(results[1], StoreError)
    assert not isinstance(results[0], BaseException)
    assert [e.data for e in await store.tail(live, 5)] == [entry.data]


async def test_many_answers_and_confirmations_at_once(db: Database) -> None:
    journal = Journal(db, member="m")
    chats = range(20)
    ids = [await journal.accept("telegram", str(n), {"text": str(n)}, f"t:{n}") for n in chats]

    async def answer(n: int) -> int:
        inbound = ids[n]
        assert inbound is not None
        outbox = await journal.complete([inbound], ("telegram", {"text": f"re {n}"}))
        assert outbox is not None
        await journal.confirm(outbox, f"sent-{n}")
        return outbox

    outboxes = await asyncio.gather(*(answer(n) for n in chats))
    assert len(set(outboxes)) == 20
    assert await journal.pending_inbound() == []
    assert await journal.pending_outbox() == []
    for n, outbox in zip(chats, outboxes, strict=True):
        assert await journal.sent_id(outbox) == f"sent-{n}"
    rows = await db.fetchall("SELECT id, message, claimed_by FROM outbox ORDER BY id")
    assert [(r["id"], r["message"], r["claimed_by"]) for r in rows] == [
        (outbox, f'{{"text":"re {n}"}}', "m") for n, outbox in zip(chats, outboxes, strict=True)
    ]


@pytest.mark.parametrize("most", [1, 2])
async def test_a_small_most_still_writes_everything(most: int) -> None:
    writes = Writes()
    together = Together(writes, name="test", most=most)
    assert await asyncio.gather(*(together(n) for n in range(5))) == [0, 10, 20, 30, 40]
    assert all(len(batch) <= most for batch in writes.batches)
