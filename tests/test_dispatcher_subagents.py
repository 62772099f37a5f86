"""Background tasks through the dispatcher: follow-up replies delivered, /tasks, /stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nanobot.agent.dispatcher import Dispatcher
from nanobot.agent.runner import Runner
from nanobot.agent.subagents import Subagents, SubagentSettings, subagent_tools
from nanobot.bus.events import ChatRef, InboundMessage
from nanobot.providers.provider import RetryPolicy
from nanobot.store import Database, SessionStore
from nanobot.tools.registry import ToolRegistry
from nanobot.tools.spawn import SpawnTool
from tests.fakes.llm import Call, FakeLLM, Text, ToolCalls
from tests.test_dispatcher import Harness
from tests.test_loop import add_tools, make_parts
from tests.test_provider import on_litellm
from tests.test_subagents import WaitTool


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


class Rig:
    def __init__(
        self, harness: Harness, subagents: Subagents, gate: WaitTool, reported: asyncio.Event
    ) -> None:
        self.harness, self.subagents, self.gate = harness, subagents, gate
        self.reported = reported  # set once a subagent's result has been handed on


class Reporting:
    """The gate as subagents see it, saying when a result has been handed in."""

    def __init__(self, harness: Harness, reported: asyncio.Event) -> None:
        self.harness, self.reported = harness, reported

    async def submit(self, message: InboundMessage) -> int | None:
        taken = await self.harness.gate.submit(message)
        self.reported.set()
        return taken


@pytest.fixture
async def rig(tmp_path: Path, fake_llm: FakeLLM, db: Database) -> AsyncIterator[Rig]:
    parts = await make_parts(tmp_path, fake_llm, db)
    harness = Harness(parts, db)
    gate = WaitTool()
    sub_tools = ToolRegistry([gate])
    provider = on_litellm(
        "openai/sub-model", api_key="sk", api_base=fake_llm.base_url, retry=RetryPolicy(attempts=0)
    )

    reported = asyncio.Event()
    subagents = Subagents(
        Runner(provider, sub_tools),
        SessionStore(db),
        Reporting(harness, reported),
        SubagentSettings(tools=subagent_tools(sub_tools.names, allow_exec=False)),
    )
    add_tools(parts.loop, SpawnTool(subagents))
    harness.dispatcher = Dispatcher(parts.loop, harness.bus, harness.journal, subagents=subagents)
    await harness.start()
    service = asyncio.create_task(subagents.run())
    yield Rig(harness, subagents, gate, reported)
    service.cancel()
    await asyncio.gather(service, return_exceptions=True)
    await harness.stop()


async def test_follow_up_reply_is_delivered_in_the_thread(rig: Rig, fake_llm: FakeLLM) -> None:
    fake_llm.script_for("sub-model", ToolCalls([Call("wait")]), Text("Findings: 42."))
    fake_llm.script_for(
        "fake-model",
        ToolCalls([Call("spawn", {"task": "research", "label": "r"})]),
        Text("Started it."),
        Text("The research is done: 42."),
    )
    chat = ChatRef("telegram", "1", "99")
    await rig.harness.gate(InboundMessage.from_chat(chat, "1", "research this", "m1"))
    await rig.harness.wait_replies(1)
    assert "running" in rig.subagents.describe(chat.session_key)
    rig.gate.open.set()
    await rig.harness.wait_replies(2)
    follow = rig.harness.replies()[-1]
    assert follow.text == "The research is done: 42."
    assert follow.chat == chat and follow.outbox_id is not None
    main = [r for r in fake_llm.requests if r.model == "fake-model"]
    note = [m for m in main[-1].messages if "[note from subagent" in str(m.get("content"))]
    assert len(note) == 1


async def test_note_reaches_a_busy_session_in_a_turn_of_its_own(
    rig: Rig, fake_llm: FakeLLM
) -> None:
    fake_llm.script_for("sub-model", ToolCalls([Call("wait")]), Text("Findings: 42."))
    fake_llm.script_for(
        "fake-model",
        ToolCalls([Call("spawn", {"task": "research"})]),
        Text("Started it."),
        ToolCalls([Call("block")]),
        Text("Slept."),
        Text("The research is done: 42."),
    )
    await rig.harness.send("1", "research this", "m1")
    await rig.harness.wait_replies(1)
    await fake_llm.wait_for_requests(3)  # the subagent is waiting
    await rig.harness.send("1", "now sleep", "m2")
    await rig.harness.parts.blocker.started.wait()
    rig.gate.open.set()
    await rig.reported.wait()  # the note came while the session was busy
    rig.harness.parts.blocker.release.set()
    await rig.harness.wait_replies(3)
    assert [r.text for r in rig.harness.replies()] == [
        "Started it.",
        "Slept.",
        "The research is done: 42.",
    ]
    last = [r for r in fake_llm.requests if r.model == "fake-model"][-1].messages
    assert any("[note from subagent" in str(m.get("content")) for m in last)


async def test_tasks_and_stop_commands(rig: Rig, fake_llm: FakeLLM) -> None:
    fake_llm.script_for("sub-model", ToolCalls([Call("wait")]))
    fake_llm.script_for(
        "fake-model",
        ToolCalls([Call("spawn", {"task": "research", "label": "deep dive"})]),
        Text("Started it."),
    )
    await rig.harness.send("1", "research this", "m1")
    await rig.harness.wait_replies(1)
    await rig.harness.send("1", "/tasks", "m2")
    await rig.harness.wait_replies(2)
    assert "running" in (rig.harness.replies()[-1].text or "")
    assert "deep dive" in (rig.harness.replies()[-1].text or "")
    await rig.harness.send("1", "/stop", "m3")
    await rig.harness.wait_replies(3)
    assert rig.harness.replies()[-1].text == "Stopped 1 background task."
    await rig.harness.send("1", "/tasks", "m4")
    await rig.harness.wait_replies(4)
    assert "cancelled" in (rig.harness.replies()[-1].text or "")
