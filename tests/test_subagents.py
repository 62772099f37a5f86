"""Subagents with real parts: the runner and litellm against the fake server, SQLite, the loop.

The main agent talks to the fake as `fake-model` and subagents as `sub-model`, so each side
has its own script however their requests interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nanobot.agent.runner import Runner
from nanobot.agent.subagents import (
    FOLLOW_UP,
    PREFIX,
    Origin,
    SubagentError,
    Subagents,
    SubagentSettings,
    subagent_tools,
)
from nanobot.agent.turn import Reply, TurnRequest
from nanobot.bus.events import ChatRef, InboundMessage
from nanobot.providers.provider import RetryPolicy
from nanobot.store import Database, Entry, SessionStore
from nanobot.tools.base import Tool, ToolContext, ToolParams
from nanobot.tools.message import MessageTool
from nanobot.tools.registry import ToolRegistry
from nanobot.tools.spawn import LateSpawner, SpawnTool
from tests.fakes.llm import Call, FakeLLM, RecordedRequest, Text, ToolCalls
from tests.fakes.tools import EchoTool, SleepTool
from tests.test_loop import Parts, add_tools, make_parts
from tests.test_provider import on_litellm

KEY = "telegram:42"
CONTEXT = ToolContext("telegram", "42", KEY, "run-1")


class WaitTool(Tool[ToolParams]):
    """Blocks until the test opens it, so a subagent ends exactly when the test wants."""

    name = "wait"
    description = "Wait."
    params = ToolParams

    def __init__(self) -> None:
        self.open = asyncio.Event()

    async def run(self, args: ToolParams) -> str:
        await self.open.wait()
        return "waited"


class ExecStub(Tool[ToolParams]):
    name = "exec"
    description = "Run a command."
    params = ToolParams

    async def run(self, args: ToolParams) -> str:
        return "ran"


class Rig:
    """The main loop, a subagent runner with its own tools, and the follow-up events the
    subagents handed in (`submit`: the way in, as the gate is)."""

    def __init__(self, fake: FakeLLM, db: Database, parts: Parts) -> None:
        self.fake, self.parts = fake, parts
        self.sessions = SessionStore(db)
        self.sleeper, self.gate = SleepTool(), WaitTool()
        # The subagents' own spawn tool, bound to the first set of them made here.
        self.spawner = LateSpawner()
        self.registry = ToolRegistry(
            [
                EchoTool(),
                self.sleeper,
                self.gate,
                MessageTool(),
                ExecStub(),
                SpawnTool(self.spawner),
            ]
        )
        provider = on_litellm(
            "openai/sub-model",
            api_key="sk-test",
            api_base=fake.base_url,
            retry=RetryPolicy(attempts=0),
            max_tokens=200,
        )
        self.provider = provider
        self.runner = Runner(provider, self.registry)
        self.notified: list[Origin] = []
        self.replies: list[Reply] = []
        self.reported = asyncio.Event()
        self.fail_notify = False
        self.run_follow_up = False
        self.instances: list[Subagents] = []

    def subagents(self, **settings: Any) -> Subagents:
        tools = subagent_tools([*self.registry.names, "spawn"], allow_exec=False)
        subagents = Subagents(
            self.runner,
            self.sessions,
            self,
            SubagentSettings(**{"tools": tools, **settings}),
        )
        if not self.instances:
            self.spawner.bind(subagents)
        self.instances.append(subagents)
        return subagents

    async def submit(self, message: InboundMessage) -> int | None:
        chat = message.chat
        self.notified.append(Origin(message.session_key, chat.channel, chat.chat_id))
        try:
            if self.fail_notify:
                raise RuntimeError("the journal is gone")
            if self.run_follow_up:  # the turn the dispatcher would run
                request = TurnRequest(message.session_key, message.text, mode=message.route.mode)
                reply = await self.parts.loop.handle(request)
                assert reply is not None
                self.replies.append(reply)
        finally:
            self.reported.set()
        return len(self.notified)

    async def entries(self, key: str) -> list[Entry]:
        return await self.sessions.tail(await self.sessions.live(key), 1000)

    async def notes(self, key: str = KEY) -> list[dict[str, Any]]:
        return [e.data for e in await self.entries(key) if e.kind == "note"]

    def sub_requests(self) -> list[RecordedRequest]:
        return [r for r in self.fake.requests if r.model == "sub-model"]

    def main_requests(self) -> list[RecordedRequest]:
        return [r for r in self.fake.requests if r.model == "fake-model"]


async def settle(subagents: Subagents) -> None:
    """Wait until every subagent and report of `subagents` has ended."""
    await asyncio.wait_for(asyncio.gather(*list(subagents._tasks)), 20)


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


@pytest.fixture
async def rig(tmp_path: Path, fake_llm: FakeLLM, db: Database) -> AsyncIterator[Rig]:
    rig = Rig(fake_llm, db, await make_parts(tmp_path, fake_llm, db))
    yield rig
    for subagents in rig.instances:
        await subagents.stop()


async def test_result_arrives_as_an_untrusted_note_and_a_follow_up_turn_reports_it(
    rig: Rig, fake_llm: FakeLLM
) -> None:
    subagents = rig.subagents()
    add_tools(rig.parts.loop, SpawnTool(subagents))
    rig.run_follow_up = True
    task = "Find the cheapest flight from Berlin to Lisbon in May."
    fake_llm.script_for("sub-model", ToolCalls([Call("wait")]), Text("Cheapest: 89 EUR, May 3."))
    fake_llm.script_for(
        "fake-model",
        ToolCalls([Call("spawn", {"task": task, "label": "flights"})]),
        Text("I'm on it."),
        Text("Your flight search is done: 89 EUR on May 3."),
    )
    reply = await rig.parts.loop.handle(
        TurnRequest(KEY, "find me a flight", ChatRef("telegram", "42"))
    )
    assert reply is not None
    assert reply.text == "I'm on it."
    started = [e.data for e in await rig.entries(KEY) if e.data.get("role") == "tool"]
    assert started[0]["content"].startswith("Started background task ")
    (info,) = subagents.list(KEY)
    assert (info.state, info.label, info.task) == ("running", "flights", task)
    assert "running" in subagents.describe(KEY)

    rig.gate.open.set()
    await settle(subagents)

    assert subagents.list(KEY)[0].state == "completed"
    entries = await rig.entries(KEY)
    kinds = [e.kind if e.kind == "note" else e.data["role"] for e in entries]
    assert kinds == ["user", "assistant", "tool", "assistant", "note", "user", "assistant"]
    note = entries[4].data
    assert note["source"] == f"subagent {info.id}"
    assert note["text"].startswith(f"Background task {info.id} (flights) finished.")
    assert f'<untrusted_content source="subagent {info.id}">' in note["text"]
    assert "Cheapest: 89 EUR, May 3." in note["text"]
    assert entries[5].data["content"].endswith(FOLLOW_UP)
    request = rig.main_requests()[-1]
    shown = [m for m in request.messages if m["role"] == "user"]
    assert shown[-2]["content"].startswith(f"[note from subagent {info.id}]\n")
    assert "Cheapest: 89 EUR" in shown[-2]["content"]
    (follow,) = rig.replies
    assert follow.text == "Your flight search is done: 89 EUR on May 3."
    work = await rig.entries(PREFIX + info.id)
    assert [e.data.get("event") or e.data["role"] for e in work] == [
        "started",
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "ended",
        "noted",
        "reported",
    ]
    assert work[2].data["content"] == task


async def test_the_limit_is_an_error_result_for_the_model(rig: Rig, fake_llm: FakeLLM) -> None:
    subagents = rig.subagents(max_subagents=1)
    add_tools(rig.parts.loop, SpawnTool(subagents))
    fake_llm.script_for("sub-model", ToolCalls([Call("wait")]), Text("done"))
    fake_llm.script_for(
        "fake-model",
        ToolCalls([Call("spawn", {"task": "one"}, id="a"), Call("spawn", {"task": "two"}, id="b")]),
        Text("One started, one refused."),
    )
    reply = await rig.parts.loop.handle(
        TurnRequest(KEY, "do two things", ChatRef("telegram", "42"))
    )
    assert reply is not None
    results = {m["tool_call_id"]: m["content"] for m in rig.main_requests()[1].messages[-2:]}
    assert results["a"].startswith("Started background task")
    assert results["b"].startswith("Error: the background task was not started: 1 background")
    assert "agent.max_subagents is 1" in results["b"]
    assert [i.task for i in subagents.list(KEY)] == ["one"]
    rig.gate.open.set()
    await settle(subagents)
    assert await subagents.spawn("three", CONTEXT)  # the slot is free again
    await settle(subagents)


async def test_a_subagent_that_runs_out_of_time_is_timed_out(rig: Rig, fake_llm: FakeLLM) -> None:
    fake_llm.script_for("sub-model", Text("warm"))
    await rig.provider.complete([{"role": "user", "content": "hi"}], [])  # litellm's first use
    subagents = rig.subagents(max_seconds=1)
    sleep = Call("sleep", {"seconds": 30})
    fake_llm.script_for("sub-model", ToolCalls([sleep], content="Looking."))
    await subagents.spawn("count the stars", CONTEXT)
    await asyncio.wait_for(rig.reported.wait(), 10)
    await settle(subagents)
    (info,) = subagents.list(KEY)
    assert info.state == "timed_out"
    assert rig.notified == [Origin(KEY, "telegram", "42")]
    (note,) = await rig.notes()
    assert "ran out of time: it was stopped at its limit of 1s." in note["text"]
    assert "Looking." in note["text"]  # its last words, as untrusted data
    assert "timed out after" in subagents.describe(KEY)


async def test_cancel_session_cancels_its_subagents_only(rig: Rig, fake_llm: FakeLLM) -> None:
    subagents = rig.subagents()
    sleep = ToolCalls([Call("sleep", {"seconds": 30})])
    fake_llm.script_for("sub-model", sleep, sleep)
    mine = await subagents.spawn("long work", CONTEXT)
    other = await subagents.spawn("other work", ToolContext("telegram", "7", "telegram:7", "r"))
    await rig.sleeper.started.wait()
    assert subagents.cancel_session(KEY) == 1
    assert subagents.cancel_session(KEY) == 0  # already asked
    running = [t for t in subagents._tasks if t.get_name() == f"subagent-{mine}"]
    await asyncio.wait_for(asyncio.gather(*running), 10)
    assert subagents.list(KEY)[0].state == "cancelled"
    assert subagents.list("telegram:7")[0].state == "running"
    (note,) = await rig.notes()
    assert note["source"] == f"subagent {mine}"
    assert "was cancelled by the user" in note["text"]
    assert rig.notified == []  # the user asked for it: no follow-up turn
    assert subagents.cancel_session("telegram:7") == 1
    await settle(subagents)
    assert subagents.list("telegram:7")[0].state == "cancelled"
    assert other != mine


async def test_cancel_before_the_run_begins(rig: Rig, fake_llm: FakeLLM) -> None:
    subagents = rig.subagents()
    await subagents.spawn("anything", CONTEXT)
    assert subagents.cancel_session(KEY) == 1
    await settle(subagents)
    assert subagents.list(KEY)[0].state == "cancelled"
    assert rig.sub_requests() == []


async def test_a_subagent_interrupted_by_a_restart_is_reported_as_interrupted(
    rig: Rig, fake_llm: FakeLLM
) -> None:
    before = rig.subagents()
    service = asyncio.create_task(before.run())  # as the gateway runs it
    fake_llm.script_for("sub-model", ToolCalls([Call("sleep", {"seconds": 30})]))
    task_id = await before.spawn("long work", CONTEXT, "survey")
    await rig.sleeper.started.wait()
    service.cancel()  # what a restart does; a kill leaves the same record
    with contextlib.suppress(asyncio.CancelledError):
        await service
    assert len(before._tasks) == 0

    after = rig.subagents()
    assert after.list(KEY) == []
    await after.recover()
    await settle(after)
    (info,) = after.list(KEY)
    assert (info.id, info.state, info.label) == (task_id, "interrupted", "survey")
    assert "interrupted by a restart" in after.describe(KEY)
    assert rig.notified == [Origin(KEY, "telegram", "42")]
    (note,) = await rig.notes()
    assert "was interrupted by a restart" in note["text"]

    again = rig.subagents()
    await again.recover()
    await settle(again)
    assert again.list(KEY)[0].state == "interrupted"
    assert len(rig.notified) == 1  # reported once
    assert len(await rig.notes()) == 1


async def test_a_report_cut_short_is_finished_after_a_restart(rig: Rig, fake_llm: FakeLLM) -> None:
    before = rig.subagents()
    rig.fail_notify = True
    fake_llm.script_for("sub-model", Text("All done."))
    await before.spawn("quick work", CONTEXT)
    await settle(before)
    assert len(rig.notified) == 1

    rig.fail_notify = False
    after = rig.subagents()
    await after.recover()
    await settle(after)
    assert after.list(KEY)[0].state == "completed"
    assert len(rig.notified) == 2
    (note,) = await rig.notes()  # the note is not added twice
    assert "All done." in note["text"]


async def test_subagents_get_a_restricted_tool_set(rig: Rig, fake_llm: FakeLLM) -> None:
    subagents = rig.subagents()
    fake_llm.script_for("sub-model", ToolCalls([Call("spawn", {"task": "fork"})]), Text("ok"))
    await subagents.spawn("try to fork", CONTEXT)
    await settle(subagents)
    first, second = rig.sub_requests()
    assert {t["function"]["name"] for t in first.tools} == {"echo", "sleep", "wait"}
    assert first.messages[0]["content"].startswith("You are a background worker of nanobot")
    assert first.messages[1] == {"role": "user", "content": "try to fork"}
    assert second.messages[-1]["content"] == "Error: the tool 'spawn' is not available here."
    names = ["read_file", "exec", "spawn", "message", "cron", "web_fetch"]
    assert subagent_tools(names, allow_exec=False) == ("read_file", "web_fetch")
    assert subagent_tools(names, allow_exec=True) == ("read_file", "exec", "web_fetch")


async def test_spawn_is_refused_inside_a_subagent_and_after_stop(rig: Rig) -> None:
    subagents = rig.subagents()
    inner = ToolContext("telegram", "42", f"{PREFIX}abc", "run-2")
    with pytest.raises(SubagentError, match="cannot start another"):
        await subagents.spawn("fork", inner)
    assert subagents.describe(KEY) == "No background tasks in this chat."
    await subagents.stop()
    with pytest.raises(SubagentError, match="shuts down"):
        await subagents.spawn("late", CONTEXT)
