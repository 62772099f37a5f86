"""`memory_search` and `memory_get` through the registry, over a real SQLite store and a real
workspace: hits and references, the memory files, bounds, bad arguments as error results,
a group's scope; and `/search` and `nanobot memory search` giving the same answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from nanobot.agent.persons import Acting
from nanobot.store import Database, NewEntry, SessionStore
from nanobot.store.search import SearchIndex
from nanobot.tools.base import ToolContext, current_context
from nanobot.tools.memory_search import (
    MAX_CHARS,
    MemoryGetTool,
    MemoryRecall,
    MemorySearchTool,
)
from nanobot.tools.registry import ToolRegistry


async def _everyone_alike(*_: object, **__: object) -> Acting:
    return Acting(None, None)  # type: ignore[arg-type]  # /search reads no context


# All that `/search` reads of the loop: people share the workspace.
LOOP = SimpleNamespace(approver=None, acting_as=_everyone_alike)


@pytest.fixture
async def recall(tmp_path: Path) -> AsyncIterator[MemoryRecall]:
    workspace = tmp_path / "ws"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "memory" / "MEMORY.md").write_text("# Facts\n- The user's cat is Tofu.\n")
    async with await Database.open(tmp_path / "state.db") as db:
        store = SessionStore(db)
        private, group = await store.live("telegram:7"), await store.live("telegram:-100")
        await store.append(
            private, [NewEntry("message", {"role": "user", "content": "my cat Tofu is ill"})]
        )
        await store.append(
            group, [NewEntry("message", {"role": "user", "content": "the group cat", "name": "Bo"})]
        )
        await store.append(
            private,
            [
                NewEntry(
                    "message", {"role": "assistant", "content": f"long answer {n} " + "x " * 300}
                )
                for n in range(40)
            ],
        )
        yield MemoryRecall(SearchIndex(db), workspace)


def registry(recall: MemoryRecall) -> ToolRegistry:
    return ToolRegistry([MemorySearchTool(recall), MemoryGetTool(recall)])


def turn(session: str = "telegram:7", *, private: bool = True) -> ToolContext:
    return ToolContext("telegram", session.split(":")[1], session, "run", private=private)


async def test_hits_from_sessions_and_memory_files_and_their_surroundings(
    recall: MemoryRecall,
) -> None:
    tools = registry(recall)
    token = current_context.set(turn())
    try:
        result = await tools.execute("memory_search", {"query": "cat"})
        assert not result.is_error
        assert "telegram:7 · user: my **cat** Tofu is ill [entry:1]" in result.content
        assert "telegram:-100 · user (Bo): the group **cat** [entry:2]" in result.content
        assert (
            "memory/MEMORY.md line 2: - The user's **cat** is Tofu. [memory/MEMORY.md:2]"
            in result.content
        )
        got = await tools.execute("memory_get", {"ref": "entry:1"})
        assert ">> [" in got.content and "my cat Tofu is ill" in got.content
        got = await tools.execute("memory_get", {"ref": "memory/MEMORY.md:2"})
        assert ">    2  - The user's cat is Tofu." in got.content
        answer = await tools.execute("memory_search", {"query": "long answer", "limit": 50})
        assert len(answer.content) <= MAX_CHARS and "more hits not shown" in answer.content
        assert (
            await tools.execute("memory_search", {"query": "answer", "limit": 3})
        ).content.count("[entry:") == 3
    finally:
        current_context.reset(token)


async def test_a_group_searches_only_its_own_conversation(recall: MemoryRecall) -> None:
    token = current_context.set(turn("telegram:-100", private=False))
    try:
        result = await registry(recall).execute("memory_search", {"query": "cat"})
        assert "group **cat**" in result.content and "Tofu is ill" not in result.content
        refused = await registry(recall).execute("memory_get", {"ref": "entry:1"})
        assert refused.is_error
    finally:
        current_context.reset(token)


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"query": ""}, "no words"),
        ({"query": "***"}, "no words"),
        ({"query": "cat", "limit": 0}, "limit must be between 1 and 50"),
        ({"query": "cat", "limit": 51}, "limit must be between 1 and 50"),
        ({"query": "cat", "since": "yesterday"}, "since must be a date"),
        ({"query": "cat", "since": "2026-02-01", "until": "2026-01-01"}, "must come before"),
        ({"query": "x" * 501}, "too long"),
        ({"query": "cat", "bogus": 1}, "unknown argument"),
    ],
)
async def test_bad_arguments_are_error_results(
    recall: MemoryRecall, arguments: dict[str, object], says: str
) -> None:
    token = current_context.set(turn())
    try:
        result = await registry(recall).execute("memory_search", arguments)
    finally:
        current_context.reset(token)
    assert result.is_error and says in result.content


@pytest.mark.parametrize(
    "ref", ["", "entry:abc", "entry:999", "memory/../x.md:1", "/etc/passwd:1", "memory/none.md:1"]
)
async def test_bad_references_are_error_results(recall: MemoryRecall, ref: str) -> None:
    token = current_context.set(turn())
    try:
        result = await registry(recall).execute("memory_get", {"ref": ref})
    finally:
        current_context.reset(token)
    assert result.is_error


async def test_hostile_queries_are_answered(recall: MemoryRecall) -> None:
    for query in [
        '"cat',
        "cat*",
        "NEAR(cat Tofu)",
        "-cat",
        "cat:Tofu",
        "^cat",
        "(cat)",
        "cat AND OR NOT",
    ]:
        answer = await recall.search(query)
        assert "Found" in answer or "Nothing found" in answer


async def test_the_search_command_gives_the_tools_answer(recall: MemoryRecall) -> None:
    from nanobot.agent import commands
    from nanobot.bus.events import ChatRef, InboundMessage

    private = InboundMessage.from_chat(ChatRef("telegram", "7"), "7", "/search cat", "m1")
    assert private.command == "search"
    assert await commands.answer(private, LOOP, None, None, recall) == await recall.search("cat")  # type: ignore[arg-type]
    group = InboundMessage.from_chat(
        ChatRef("telegram", "-100"), "7", "/search cat", "m2", is_private=False
    )
    answer = await commands.answer(group, LOOP, None, None, recall)  # type: ignore[arg-type]
    assert "group **cat**" in answer and "Tofu is ill" not in answer
    empty = InboundMessage.from_chat(ChatRef("telegram", "7"), "7", "/search", "m3")
    assert "Say /search" in await commands.answer(empty, LOOP, None, None, recall)  # type: ignore[arg-type]
    assert "/search TEXT" in commands.HELP
