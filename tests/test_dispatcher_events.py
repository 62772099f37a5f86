"""nanobot's own events (cron runs, the heartbeat, background tasks' results) through the one
way in: gate, journal, bus, dispatcher; answered, reported and recovered like chat messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nanobot.agent.dispatcher import EMPTY_ANSWER, Dispatcher, _blank
from nanobot.bus.events import (
    ChatRef,
    InboundMessage,
    Source,
    StreamUpdate,
    TurnOutcome,
)
from nanobot.store import Database
from tests.fakes.llm import Call, FakeLLM, Text, ToolCalls
from tests.test_dispatcher import Harness
from tests.test_loop import make_parts

CHAT = ChatRef("telegram", "1")


class Sink:
    """A producer that records how its events' turns ended."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[InboundMessage, TurnOutcome]] = []
        self.arrived = asyncio.Event()

    async def finished(self, message: InboundMessage, outcome: TurnOutcome) -> None:
        self.outcomes.append((message, outcome))
        self.arrived.set()

    async def wait(self, count: int = 1) -> None:
        async with asyncio.timeout(20):
            while len(self.outcomes) < count:
                self.arrived.clear()
                await self.arrived.wait()


async def rig(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, sink: Sink, source: Source = "cron"
) -> Harness:
    parts = await make_parts(tmp_path, fake_llm, db)
    harness = Harness(parts, db)
    outcomes = {source: sink}
    harness.dispatcher = Dispatcher(parts.loop, harness.bus, harness.journal, outcomes=outcomes)
    return harness


def cron_event(run: int, *, chat: ChatRef = CHAT, deliver: bool = True) -> InboundMessage:
    return InboundMessage.from_cron(chat, "j1", "say the time", run, deliver=deliver)


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


async def test_a_cron_event_runs_in_its_own_session_and_reports_its_outcome(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    sink = Sink()
    harness = await rig(tmp_path, fake_llm, db, sink)
    await harness.start()
    fake_llm.script(Text("It is noon."))
    assert await harness.gate.submit(cron_event(7)) is not None
    await sink.wait()
    await harness.wait_replies(1)
    (reply,) = harness.replies()
    assert (reply.text, reply.chat, reply.reply_to) == ("It is noon.", CHAT, None)
    ((message, outcome),) = sink.outcomes
    assert (message.ref, outcome.status, outcome.text, outcome.delivered) == (
        "7",
        "completed",
        "It is noon.",
        True,
    )
    # The reply names its run, so the outbox records its delivery on the run.
    row = await db.fetchone("SELECT cron_run FROM outbox WHERE id = ?", (reply.outbox_id,))
    assert row is not None and row["cron_run"] == 7
    assert [e["role"] for e in await harness.parts.entries("cron:j1")] == ["user", "assistant"]
    assert await harness.parts.entries(CHAT.session_key) == []  # the chat's session untouched
    assert await harness.gate.submit(cron_event(7)) is None  # one run, one turn
    assert await harness.journal.pending_inbound() == []
    await harness.stop()


async def test_an_event_with_no_chat_to_tell_is_answered_and_delivered_nowhere(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    sink = Sink()
    harness = await rig(tmp_path, fake_llm, db, sink)
    await harness.start()
    fake_llm.script(Text("Cleaned the inbox."))
    await harness.gate.submit(cron_event(1, chat=ChatRef("cron", "j1"), deliver=False))
    await sink.wait()
    outcome = sink.outcomes[0][1]
    assert (outcome.text, outcome.delivered) == ("Cleaned the inbox.", False)
    assert harness.bus.pending("cron") == 0 and harness.out == []
    assert await harness.journal.pending_outbox() == []
    assert await harness.journal.pending_inbound() == []
    await harness.stop()


async def test_a_quiet_answer_is_neither_streamed_nor_delivered(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    sink = Sink()
    harness = await rig(tmp_path, fake_llm, db, sink, "heartbeat")
    await harness.start()
    fake_llm.chunk_delay = 0.3  # slow enough that a listener would show it as it comes
    fake_llm.script(Text("HEARTBEAT_OK."), Text("Remember the dentist."))
    for beat in ("b1", "b2"):
        beat_event = InboundMessage.from_heartbeat(
            "check", beat, session="heartbeat", quiet="HEARTBEAT_OK", deliver_to=CHAT
        )
        await harness.gate.submit(beat_event)
        await sink.wait(1 if beat == "b1" else 2)
    await harness.wait_replies(1)
    assert [r.text for r in harness.replies()] == ["Remember the dentist."]
    assert not [o for o in harness.out if isinstance(o, StreamUpdate)]
    assert [o.text for _, o in sink.outcomes] == [None, "Remember the dentist."]
    # Each beat starts afresh: the second saw none of the first.
    assert [m["role"] for m in fake_llm.requests[1].messages] == ["system", "user"]
    await harness.stop()


async def test_a_cron_turn_cut_short_by_a_crash_resumes_and_reports_after_the_restart(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    first = await rig(tmp_path, fake_llm, db, Sink())
    fake_llm.script(ToolCalls([Call("block", id="b1")]))
    await first.start()
    await first.gate.submit(cron_event(3))
    await first.parts.blocker.started.wait()
    for task in first._tasks:  # the process dies mid-tool
        task.cancel()
    await asyncio.gather(*first._tasks, return_exceptions=True)

    sink = Sink()
    second = await rig(tmp_path, fake_llm, db, sink)
    fake_llm.script(Text("Done after the restart."))
    await second.start(recover=True)
    await sink.wait()
    await second.wait_replies(1)
    assert [r.text for r in second.replies()] == ["Done after the restart."]
    assert sink.outcomes[0][0].ref == "3" and sink.outcomes[0][1].ok
    resumed = fake_llm.requests[-1].messages
    assert resumed[-1]["role"] == "tool"  # the cut-off call is settled, not run again
    assert not second.parts.blocker.started.is_set()
    await second.stop()


async def test_a_follow_up_journaled_before_a_crash_is_answered_after_it(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    first = Harness(await make_parts(tmp_path, fake_llm, db), db)
    first.gate.close()  # stopping: journaled, not dispatched (as if killed right after)
    follow_up = InboundMessage.from_task(
        CHAT, "task", "tell them", "abc", session=CHAT.session_key, is_private=True
    )
    assert await first.gate.submit(follow_up) is not None
    assert await first.gate.submit(follow_up) is None  # a repeated report is recognised

    second = Harness(await make_parts(tmp_path, fake_llm, db), db)
    fake_llm.script(Text("Your task is done."))
    await second.start(recover=True)
    await second.wait_replies(1)
    assert [r.text for r in second.replies()] == ["Your task is done."]
    assert await second.journal.pending_inbound() == []
    await second.stop()


async def test_recovery_leaves_what_another_process_must_answer(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    first = Harness(await make_parts(tmp_path, fake_llm, db), db)
    first.gate.close()
    typed = InboundMessage.from_chat(ChatRef("terminal", "local"), "local", "hello", "t1")
    asked = InboundMessage.from_chat(ChatRef("cli", "local"), "local", "hi", "c1", deliver=False)
    for message in (typed, asked):
        assert await first.gate.submit(message) is not None

    second = Harness(await make_parts(tmp_path, fake_llm, db), db)
    await second.start(recover=True)  # runs telegram only
    await second.stop()
    assert fake_llm.request_count == 0
    pending = {row.channel for row in await second.journal.pending_inbound()}
    assert pending == {"terminal", "cli"}


def test_only_a_person_types_commands() -> None:
    assert InboundMessage.from_chat(CHAT, "1", "/new", "m1").command == "new"
    assert InboundMessage.from_cron(CHAT, "c1", "/new", 1, deliver=True).command is None


@pytest.mark.parametrize(
    ("text", "blank"),
    [
        ("", True),
        ("  \n\t ", True),
        ("```\n```", True),
        ("```python\n\n```", True),
        ("![](x)", True),
        ("![a picture](https://example.com/a.png)\n", True),
        ("<!-- nothing -->", True),
        ("0", False),
        ("```\nls\n```", False),
        ("see ![](x) here", False),
    ],
)
def test_what_shows_nothing_in_a_chat(text: str, blank: bool) -> None:
    assert _blank(text) is blank


async def test_an_empty_answer_is_never_a_silent_gap(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, warnings: list[str]
) -> None:
    harness = Harness(await make_parts(tmp_path, fake_llm, db), db)
    await harness.start()
    fake_llm.script(Text(""), Text("```\n```"))
    await harness.send("1", "hello?", "m1")
    await harness.send("2", "anyone?", "m2")
    await harness.wait_replies(2)
    assert [r.text for r in harness.replies()] == [EMPTY_ANSWER, EMPTY_ANSWER]
    assert sum("answered nothing visible" in w for w in warnings) == 2
    await harness.stop()


async def test_a_cron_run_over_its_budget_is_reported_skipped_for_budget(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    from nanobot.agent.budget import Budgets, BudgetSettings
    from nanobot.bus.events import SKIPPED_FOR_BUDGET
    from nanobot.store.budgets import BudgetStore

    sink = Sink()
    harness = await rig(tmp_path, fake_llm, db, sink)
    provider = harness.parts.provider
    harness.parts.loop.budgets = Budgets(
        BudgetStore(db),
        BudgetSettings(cron_daily=0.0),
        price=lambda _model: None,
        count=provider.count_tokens,
        model=provider.model,
        max_tokens=200,
    )
    await harness.start()
    assert await harness.gate.submit(cron_event(8)) is not None
    await sink.wait()
    ((_, outcome),) = sink.outcomes
    assert outcome.status == SKIPPED_FOR_BUDGET
    assert outcome.text is not None
    assert outcome.text.startswith("Over budget: the daily budget of cron jobs is $0.00")
    assert fake_llm.requests == []
    await harness.stop()
