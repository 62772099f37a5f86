from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from nanobot.agent.history import INTERRUPTED, History, repair
from nanobot.providers.base import Message
from nanobot.store import Database, NewEntry, SessionStore


def count(messages: Sequence[Message]) -> int:
    """A deterministic stand-in tokenizer: one token per four characters, plus framing."""
    return sum(4 + len(str(m.get("content") or "")) // 4 for m in messages)


class CountingStore(SessionStore):
    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.tail_calls = 0

    async def tail(self, session_id: int, limit: int, before_id: int | None = None) -> Any:
        self.tail_calls += 1
        return await super().tail(session_id, limit, before_id)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CountingStore]:
    async with await Database.open(tmp_path / "state.db") as db:
        yield CountingStore(db)


def user(text: str) -> NewEntry:
    return NewEntry("message", {"role": "user", "content": text})


def assistant(text: str, calls: Sequence[str] = ()) -> NewEntry:
    data: Message = {"role": "assistant", "content": text}
    if calls:
        data["tool_calls"] = [
            {"id": c, "type": "function", "function": {"name": "echo", "arguments": "{}"}}
            for c in calls
        ]
    return NewEntry("message", data)


def tool(call_id: str, text: str) -> NewEntry:
    return NewEntry(
        "message", {"role": "tool", "tool_call_id": call_id, "name": "echo", "content": text}
    )


async def test_window_keeps_the_newest_and_starts_at_a_user_message(store: CountingStore) -> None:
    session = await store.live("s")
    await store.append(session, [user("u" * 40), assistant("a" * 40)] * 10)
    history = History(store, count)
    window = await history.load(session, budget=50)
    assert [m["role"] for m in window.messages] == ["user", "assistant"]
    assert window.tokens <= 50
    assert window.beyond > 0  # older history exists beyond the window


async def test_window_never_separates_tool_calls_from_results(store: CountingStore) -> None:
    session = await store.live("s")
    turn = [
        user("question " * 5),
        assistant("", ["c1", "c2"]),
        tool("c1", "r" * 60),
        tool("c2", "r" * 60),
        assistant("answer " * 5),
    ]
    await store.append(session, turn * 6)
    history = History(store, count)
    for budget in range(10, 400, 7):
        window = await history.load(session, budget)
        messages = window.messages
        assert messages[0]["role"] == "user"
        asked = {
            c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls", [])
        }
        answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert len(answered) == 2 * sum(1 for m in messages if m.get("tool_calls"))
        assert set(answered) <= asked


async def test_the_current_turn_is_kept_even_over_budget(store: CountingStore) -> None:
    session = await store.live("s")
    await store.append(session, [user("old"), assistant("old"), user("x" * 4000)])
    window = await History(store, count).load(session, budget=10)
    assert [m["content"] for m in window.messages] == ["x" * 4000]


async def test_compaction_entry_replaces_what_it_covers(store: CountingStore) -> None:
    session = await store.live("s")
    old = await store.append(session, [user("first"), assistant("one"), user("second")])
    await store.append(session, [assistant("two")])
    await store.append(
        session, [NewEntry("compaction", {"summary": "They said first.", "through_id": old[1].id})]
    )
    await store.append(session, [user("third")])
    window = await History(store, count).load(session, budget=1000)
    assert window.summary == "They said first."
    assert window.summarised_through == old[1].id
    assert [m["content"] for m in window.messages] == ["second", "two", "third"]


async def test_beyond_is_zero_only_when_everything_fits(store: CountingStore) -> None:
    session = await store.live("s")
    await store.append(session, [user("u" * 40), assistant("a" * 40)] * 5)
    history = History(store, count)
    assert (await history.load(session, budget=1000)).beyond == 0
    assert (await History(store, count).load(session, budget=100)).beyond > 0


async def test_later_turns_read_only_what_was_added(store: CountingStore) -> None:
    session = await store.live("s")
    await store.append(session, [user("u" * 40), assistant("a" * 40)] * 5)
    history = History(store, count)
    first = await history.load(session, budget=60)
    store.tail_calls = 0
    await store.append(session, [user("new question"), assistant("new answer")])
    second = await history.load(session, budget=60)
    assert store.tail_calls == 0  # only `since` was asked
    assert [m["content"] for m in second.messages][-2:] == ["new question", "new answer"]
    assert second.messages[0]["role"] == "user"
    assert second.tokens <= 60
    assert second.beyond > first.beyond
    # The same as reading everything afresh.
    fresh = await History(store, count).load(session, budget=60)
    assert fresh.messages == second.messages
    assert fresh.tokens == second.tokens


async def test_a_new_compaction_makes_the_next_load_read_afresh(store: CountingStore) -> None:
    session = await store.live("s")
    stored = await store.append(session, [user("one"), assistant("1"), user("two"), assistant("2")])
    history = History(store, count)
    await history.load(session, budget=1000)
    await store.append(
        session, [NewEntry("compaction", {"summary": "one was said", "through_id": stored[1].id})]
    )
    window = await history.load(session, budget=1000)
    assert window.summary == "one was said"
    assert [m["content"] for m in window.messages] == ["two", "2"]


async def test_a_long_session_reads_only_its_tail(store: CountingStore) -> None:
    session = await store.live("s")
    batch = [user("hello there"), assistant("hi, how can I help?")]
    for _ in range(50):
        await store.append(session, batch * 100)  # 10,000 entries
    assert await store.count(session) == 10_000
    counted: list[int] = []

    def counting(messages: Sequence[Message]) -> int:
        counted.append(len(messages))
        return count(messages)

    history = History(store, counting)
    store.tail_calls = 0
    window = await history.load(session, budget=2000)
    assert store.tail_calls <= 2
    assert len(counted) < 300
    assert len(window.messages) < 300
    # A second turn counts only what is new.
    await store.append(session, [user("again")])
    counted.clear()
    await history.load(session, budget=2000)
    assert len(counted) == 1


def test_repair_answers_calls_left_open_by_a_crash() -> None:
    messages: list[Message] = [
        {"role": "user", "content": "do two things"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "exec", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "exec", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "name": "exec", "content": "done"},
        {"role": "user", "content": "hello?"},
    ]
    repaired = repair(messages)
    assert [m["role"] for m in repaired] == ["user", "assistant", "tool", "tool", "user"]
    assert repaired[3] == {
        "role": "tool",
        "tool_call_id": "b",
        "name": "exec",
        "content": INTERRUPTED,
    }
    assert repair(repaired) == repaired
