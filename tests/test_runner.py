"""The runner, driven with a scripted in-memory provider (`tests/fakes/provider.py`).

The first part drives runs into every move of the state machine and shows that a move the
table does not allow is refused; the rest checks what a run promises: history stays
well-formed, limits end it, errors never become assistant text, events stream once.
How litellm itself behaves (streaming, retries, error classes) is tested in test_provider.py.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from nanobot.agent import runner as runner_module
from nanobot.agent.run import (
    TRANSITIONS,
    Approval,
    Asking,
    LoopLimits,
    RunEvent,
    RunHooks,
    RunInput,
    RunResult,
    RunState,
    ToolPolicy,
)
from nanobot.agent.runner import ABORTED, NOT_RUN, SKIPPED, Runner
from nanobot.errors import ProviderError, StoreError
from nanobot.providers.base import Message, ToolCall, Usage
from nanobot.tools.base import Tool, ToolImage, ToolResult
from nanobot.tools.registry import ToolRegistry
from tests.fakes.provider import Answer, Calls, Fail, Hang, Retried, ScriptedProvider, tool_call
from tests.fakes.tools import BlockTool, EchoTool, NoParams

SYSTEM: Message = {"role": "system", "content": "You are a test."}
USER: Message = {"role": "user", "content": "hi"}
S = RunState


class Recorder:
    """Hooks that store entries in a list and record events."""

    def __init__(self) -> None:
        self.stored: list[Message] = []
        self.events: list[RunEvent] = []
        self.steering: list[Message] = []
        self.on_event: Callable[[RunEvent], None] | None = None

    def hooks(self, **overrides: Any) -> RunHooks:
        async def persist(message: Message) -> None:
            self.stored.append(message)

        def take(queue: list[Message]) -> Sequence[Message]:
            taken = queue[:1]
            del queue[:1]
            return taken

        def listen(event: RunEvent) -> None:
            self.events.append(event)
            if self.on_event is not None:
                self.on_event(event)

        options: dict[str, Any] = {
            "persist": persist,
            "steering": lambda: take(self.steering),
            "listener": listen,
            "live": True,
        }
        options.update(overrides)
        return RunHooks(**options)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def states(self) -> list[RunState]:
        return [e.state for e in self.events if e.kind == "status" and e.state is not None]

    def moves(self) -> list[tuple[RunState, RunState]]:
        path = [S.IDLE, *self.states()]
        return list(itertools.pairwise(path))


@dataclass
class Rig:
    provider: ScriptedProvider
    echo: EchoTool
    block: BlockTool
    runner: Runner
    recorder: Recorder

    async def run(self, run: RunInput | None = None, **hooks: Any) -> RunResult:
        return await self.runner.run(run or run_input(), self.recorder.hooks(**hooks))

    async def abort_when(
        self, ready: asyncio.Event, run: RunInput | None = None, **hooks: Any
    ) -> RunResult:
        """Start a run, abort it once `ready` is set, return how it ended.

        If the run ends first (say, a refused move), its result or exception is returned.
        """
        run = run or run_input()
        task = asyncio.create_task(self.runner.run(run, self.recorder.hooks(**hooks)))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        self.runner.abort(run.run_id)
        return await task


@pytest.fixture
def rig() -> Rig:
    provider = ScriptedProvider()
    echo, block = EchoTool(), BlockTool()
    return Rig(provider, echo, block, Runner(provider, ToolRegistry([echo, block])), Recorder())


def run_input(**kwargs: Any) -> RunInput:
    options: dict[str, Any] = {"session_id": "test:1", "messages": [SYSTEM, USER]}
    options.update(kwargs)
    return RunInput(**options)


def echo_call(text: str, id: str = "") -> ToolCall:
    return tool_call("echo", {"text": text}, id=id)


# -- the state machine ---------------------------------------------------------------------


async def _answer(rig: Rig) -> RunResult:
    rig.provider.script(Answer("Hello."))
    return await rig.run()


async def _tool_round(rig: Rig) -> RunResult:
    rig.provider.script(Calls(echo_call("ping")), Answer("Done."))
    return await rig.run()


async def _approved_call(rig: Rig) -> RunResult:
    rig.provider.script(Calls(echo_call("ping")), Answer("Done."))

    async def decision() -> str | None:
        return None

    async def approve(call: ToolCall) -> Approval:
        return Asking(decision())

    return await rig.run(run_input(), approve=approve)


async def _overflow_compacted(rig: Rig) -> RunResult:
    rig.provider.script(Fail("context_overflow"), Answer("Fits now."))

    async def compact(messages: Sequence[Message]) -> Sequence[Message]:
        return messages[:1]

    return await rig.run(compact=compact)


async def _model_fails(rig: Rig) -> RunResult:
    rig.provider.script(Fail("unavailable"))
    return await rig.run()


async def _compaction_fails(rig: Rig) -> RunResult:
    # The loop's compaction asks the model for a summary, which can fail like any call.
    rig.provider.script(Fail("context_overflow"))

    async def compact(messages: Sequence[Message]) -> Sequence[Message]:
        raise ProviderError("unavailable", "the summary call failed")

    return await rig.run(compact=compact)


async def _aborted_streaming(rig: Rig) -> RunResult:
    rig.provider.script(Hang("one two three"))
    return await rig.abort_when(rig.provider.hanging)


async def _aborted_compacting(rig: Rig) -> RunResult:
    rig.provider.script(Fail("context_overflow"))
    compacting = asyncio.Event()

    async def compact(messages: Sequence[Message]) -> Sequence[Message]:
        compacting.set()
        await asyncio.Future()  # until cancelled
        raise AssertionError("unreachable")

    return await rig.abort_when(compacting, compact=compact)


async def _aborted_in_tool(rig: Rig) -> RunResult:
    rig.provider.script(Calls(tool_call("block")))
    return await rig.abort_when(rig.block.started)


async def _limit_after_tools(rig: Rig) -> RunResult:
    rig.provider.script(Calls(echo_call("ping")))
    return await rig.run(run_input(limits=LoopLimits(max_iterations=1)))


async def _aborted_awaiting_human(rig: Rig) -> RunResult:
    rig.provider.script(Calls(echo_call("ping")))
    asked = asyncio.Event()

    async def never() -> str | None:
        asked.set()
        await asyncio.Future()  # the owner never answers
        raise AssertionError("unreachable")

    async def approve(call: ToolCall) -> Approval:
        return Asking(never())

    return await rig.abort_when(asked, run_input(), approve=approve)


async def _out_of_time_awaiting_human(rig: Rig) -> RunResult:
    rig.provider.script(Calls(echo_call("ping")))

    async def never() -> str | None:
        await asyncio.Future()  # the owner never answers
        raise AssertionError("unreachable")

    async def approve(call: ToolCall) -> Approval:
        return Asking(never())

    # Real time: the run's duration limit is what ends it. 0.2 s is far more than reaching
    # the approval takes (no I/O), and short enough not to slow the suite.
    run = run_input(limits=LoopLimits(max_run_duration=0.2))
    return await rig.run(run, approve=approve)


@dataclass(frozen=True)
class Scenario:
    drive: Callable[[Rig], Awaitable[RunResult]]
    path: tuple[RunState, ...]  # the status events, in order

    @property
    def moves(self) -> set[tuple[RunState, RunState]]:
        path = (S.IDLE, *self.path)
        return set(itertools.pairwise(path))


SCENARIOS: dict[str, Scenario] = {
    "answer": Scenario(_answer, (S.PREPARING, S.MODEL_RUNNING, S.COMPLETED)),
    "tool round": Scenario(
        _tool_round, (S.PREPARING, S.MODEL_RUNNING, S.TOOL_RUNNING, S.MODEL_RUNNING, S.COMPLETED)
    ),
    "approved call": Scenario(
        _approved_call,
        (
            S.PREPARING,
            S.MODEL_RUNNING,
            S.TOOL_RUNNING,
            S.AWAITING_HUMAN,
            S.TOOL_RUNNING,
            S.MODEL_RUNNING,
            S.COMPLETED,
        ),
    ),
    "overflow compacted": Scenario(
        _overflow_compacted,
        (S.PREPARING, S.MODEL_RUNNING, S.PREPARING, S.MODEL_RUNNING, S.COMPLETED),
    ),
    "model fails": Scenario(_model_fails, (S.PREPARING, S.MODEL_RUNNING, S.FAILED)),
    "compaction fails": Scenario(
        _compaction_fails, (S.PREPARING, S.MODEL_RUNNING, S.PREPARING, S.FAILED)
    ),
    "aborted streaming": Scenario(_aborted_streaming, (S.PREPARING, S.MODEL_RUNNING, S.ABORTED)),
    "aborted compacting": Scenario(
        _aborted_compacting, (S.PREPARING, S.MODEL_RUNNING, S.PREPARING, S.ABORTED)
    ),
    "aborted in tool": Scenario(
        _aborted_in_tool, (S.PREPARING, S.MODEL_RUNNING, S.TOOL_RUNNING, S.ABORTED)
    ),
    "limit after tools": Scenario(
        _limit_after_tools, (S.PREPARING, S.MODEL_RUNNING, S.TOOL_RUNNING, S.FAILED)
    ),
    "aborted awaiting human": Scenario(
        _aborted_awaiting_human,
        (S.PREPARING, S.MODEL_RUNNING, S.TOOL_RUNNING, S.AWAITING_HUMAN, S.ABORTED),
    ),
    "out of time awaiting human": Scenario(
        _out_of_time_awaiting_human,
        (S.PREPARING, S.MODEL_RUNNING, S.TOOL_RUNNING, S.AWAITING_HUMAN, S.FAILED),
    ),
}


@pytest.mark.parametrize("name", SCENARIOS)
async def test_a_run_moves_through_its_states(rig: Rig, name: str) -> None:
    scenario = SCENARIOS[name]
    result = await scenario.drive(rig)
    assert tuple(rig.recorder.states()) == scenario.path
    assert result.status == scenario.path[-1].value
    assert rig.provider.remaining == 0
    assert _calls_answered(rig.recorder.stored)
    kinds = rig.recorder.kinds()
    assert (kinds[0], kinds[-1]) == ("run_start", "run_end")
    assert ("error" in kinds) is (result.status != "completed")


def test_every_move_the_table_allows_is_driven() -> None:
    driven = set().union(*(scenario.moves for scenario in SCENARIOS.values()))
    allowed = {(start, end) for start, ends in TRANSITIONS.items() for end in ends}
    # Every move the table allows is made by some run, so a new one needs a scenario.
    assert driven == allowed


@pytest.mark.parametrize(
    "move",
    sorted({m for s in SCENARIOS.values() for m in s.moves}),
    ids=lambda move: f"{move[0]}->{move[1]}",
)
async def test_a_move_the_table_does_not_allow_is_refused(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, move: tuple[RunState, RunState]
) -> None:
    """No public path asks for an illegal move, so each legal one is made illegal in turn:
    the runner consults its table at every move and stops rather than make it."""
    start, end = move
    table = dict(TRANSITIONS)
    table[start] = table[start] - {end}
    monkeypatch.setattr(runner_module, "TRANSITIONS", table)
    scenario = next(s for s in SCENARIOS.values() if move in s.moves)
    with pytest.raises(RuntimeError, match=f"no transition {start} -> {end}$"):
        await scenario.drive(rig)
    assert move not in rig.recorder.moves()
    assert all(b in table[a] for a, b in rig.recorder.moves())
    assert not set(rig.recorder.states()) & {S.COMPLETED, S.FAILED, S.ABORTED}


# -- what a run promises --------------------------------------------------------------------


async def test_plain_answer(rig: Rig) -> None:
    rig.provider.script(Answer("Hello there.", usage=Usage(12, 3, 0.001)))
    result = await rig.run()
    assert result.status == "completed"
    assert result.final_text == "Hello there."
    assert rig.recorder.stored == [{"role": "assistant", "content": "Hello there."}]
    assert result.final_message == rig.recorder.stored[0]
    assert result.usage == Usage(12, 3, 0.001)
    assert rig.provider.requests[0].messages == [SYSTEM, USER]
    updates = [e for e in rig.recorder.events if e.kind == "message_update"]
    assert len(updates) >= 2
    assert "".join(e.text for e in updates) == "Hello there."
    assert rig.provider.requests[0].streamed


async def test_an_answer_nobody_watches_being_written_is_asked_for_whole(rig: Rig) -> None:
    rig.provider.script(Answer("Hello there."))
    result = await rig.run(live=False)
    assert result.final_text == "Hello there."
    assert not rig.provider.requests[0].streamed
    assert "message_update" not in rig.recorder.kinds()
    assert {"turn_start", "message_start", "message_end", "run_end"} <= set(rig.recorder.kinds())


async def test_system_prompt_replaces_the_first_system_message(rig: Rig) -> None:
    rig.provider.script(Answer("ok"), Answer("ok"))
    await rig.run(run_input(system_prompt="Be brief."))
    await rig.run(run_input(messages=[USER], system_prompt="Be brief."))
    for request in rig.provider.requests:
        assert request.messages == [{"role": "system", "content": "Be brief."}, USER]


async def test_tool_round_trip(rig: Rig) -> None:
    rig.provider.script(Calls(echo_call("ping", id="c1")), Answer("Done.", usage=Usage(1, 1)))
    result = await rig.run()
    assert result.status == "completed"
    assert result.final_text == "Done."
    assert rig.echo.calls == ["ping"]
    assert result.tools_used == ("echo",)
    assert [m["role"] for m in rig.recorder.stored] == ["assistant", "tool", "assistant"]
    assert rig.recorder.stored[1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "echo",
        "content": "echoed ping",
    }
    assert list(result.entries) == rig.recorder.stored
    # The model saw the result on its second call.
    assert rig.provider.requests[1].messages[-1]["content"] == "echoed ping"
    assert [t["function"]["name"] for t in rig.provider.requests[0].tools] == ["echo", "block"]
    ends = [e for e in rig.recorder.events if e.kind == "tool_end"]
    assert [(e.tool_call, e.text, e.is_error) for e in ends] == [
        (echo_call("ping", id="c1"), "echoed ping", False)
    ]
    assert rig.recorder.kinds().count("tool_start") == 1


async def test_bad_tool_arguments_go_back_to_the_model(rig: Rig) -> None:
    rig.provider.script(
        Calls(
            tool_call("echo", '{"text": broken'),
            tool_call("echo", {"txt": "x"}),
            tool_call("nope", {}),
        ),
        Answer("Sorry."),
    )
    result = await rig.run()
    assert result.status == "completed"
    results = [m["content"] for m in rig.recorder.stored if m["role"] == "tool"]
    assert "not valid JSON" in results[0]
    assert "text: Field required" in results[1]
    assert "txt: unknown argument" in results[1]
    assert "unknown tool 'nope'" in results[2]
    assert rig.echo.calls == []


async def test_allowed_tools_are_the_intersection(rig: Rig) -> None:
    rig.provider.script(Calls(tool_call("block")), Answer("ok"))
    policy = ToolPolicy(allow_list=["echo", "block"])
    await rig.run(run_input(policy=policy, allowed_tools=["echo"]))
    assert [t["function"]["name"] for t in rig.provider.requests[0].tools] == ["echo"]
    assert "not available" in rig.recorder.stored[1]["content"]
    assert not rig.block.started.is_set()


async def test_disabled_tools_are_neither_offered_nor_run(rig: Rig) -> None:
    rig.provider.script(Calls(echo_call("x")), Answer("ok"))
    await rig.run(run_input(policy=ToolPolicy(enabled=False)))
    assert rig.provider.requests[0].tools == []
    assert rig.echo.calls == []
    assert "not available" in rig.recorder.stored[1]["content"]


@pytest.mark.parametrize(
    ("limits", "model_calls", "reason"),
    [
        (LoopLimits(max_iterations=2), 2, "limit of 2 model calls"),
        (LoopLimits(max_tool_rounds=1), 2, "limit of 1 rounds of tool calls"),
    ],
)
async def test_limits_end_the_run_as_failed(
    rig: Rig, limits: LoopLimits, model_calls: int, reason: str
) -> None:
    rig.provider.script(*[Calls(echo_call(str(i))) for i in range(3)])
    result = await rig.run(run_input(limits=limits))
    assert result.status == "failed"
    assert reason in result.final_text
    assert result.final_text.startswith("I stopped")
    assert len(rig.provider.requests) == model_calls
    # Every stored tool call has its result: history stays well-formed.
    assert _calls_answered(rig.recorder.stored)
    assert not any(
        m["role"] == "assistant" and "I stopped" in str(m["content"]) for m in rig.recorder.stored
    )


async def test_a_call_left_unrun_by_a_limit_is_answered(rig: Rig) -> None:
    rig.provider.script(Calls(echo_call("a")), Calls(echo_call("b", id="b")))
    result = await rig.run(run_input(limits=LoopLimits(max_tool_rounds=1)))
    assert result.status == "failed"
    assert rig.echo.calls == ["a"]
    assert rig.recorder.stored[-1] == {
        "role": "tool",
        "tool_call_id": "b",
        "name": "echo",
        "content": NOT_RUN,
    }


async def test_duration_limit(rig: Rig) -> None:
    rig.provider.script(Calls(tool_call("block", id="b1")))
    # Real time: the limit is the behaviour under test; the tool never finishes by itself.
    result = await rig.run(run_input(limits=LoopLimits(max_run_duration=0.05)))
    assert result.status == "failed"
    assert "longer than its limit of 0.05 seconds" in result.final_text
    assert (rig.block.finished, rig.block.cancelled) == (0, 1)
    assert rig.recorder.stored[-1]["content"].startswith("Stopped: the turn ran out of time")
    assert _calls_answered(rig.recorder.stored)


async def test_abort_mid_stream(rig: Rig) -> None:
    rig.provider.script(Hang("one two three"))
    run = run_input()
    result = await rig.abort_when(rig.provider.hanging, run)
    assert result.status == "aborted"
    assert result.final_text == "Stopped."
    assert rig.provider.cancelled == 1
    assert rig.recorder.stored == []  # the partial answer is dropped, not half-written
    shown = "".join(e.text for e in rig.recorder.events if e.kind == "message_update")
    assert shown == "one two three"
    assert rig.recorder.states()[-1] == S.ABORTED
    assert not rig.runner.abort(run.run_id)  # no longer active


async def test_abort_mid_tool(rig: Rig) -> None:
    rig.provider.script(Calls(tool_call("block", id="b1"), echo_call("x", id="e1")))
    result = await rig.abort_when(rig.block.started)
    assert result.status == "aborted"
    assert (rig.block.finished, rig.block.cancelled) == (0, 1)
    assert rig.echo.calls == []
    tool_results = {
        m["tool_call_id"]: m["content"] for m in rig.recorder.stored if m["role"] == "tool"
    }
    assert tool_results == {"b1": ABORTED, "e1": NOT_RUN}
    assert _calls_answered(rig.recorder.stored)


async def test_abort_of_an_unknown_run_is_refused(rig: Rig) -> None:
    assert not rig.runner.abort("no-such-run")


async def test_steering_skips_the_rest_of_the_batch(rig: Rig) -> None:
    rig.provider.script(
        Calls(echo_call("a", id="1"), echo_call("b", id="2")), Answer("Changed course.")
    )
    steer: Message = {"role": "user", "content": "actually, stop that"}

    def steer_after_first_tool(event: RunEvent) -> None:
        if event.kind == "tool_end" and not rig.recorder.steering:
            rig.recorder.steering.append(steer)

    rig.recorder.on_event = steer_after_first_tool
    result = await rig.run()
    assert result.final_text == "Changed course."
    assert rig.echo.calls == ["a"]
    assert [m.get("content") for m in rig.recorder.stored[1:4]] == [
        "echoed a",
        SKIPPED,
        steer["content"],
    ]
    assert rig.provider.requests[1].messages[-1] == steer


async def test_an_answer_ends_the_run_even_with_messages_waiting(rig: Rig) -> None:
    # What came meanwhile gets a turn of its own after this answer is delivered (the
    # loop's): an answer is never stored as said and then passed over.
    rig.provider.script(Answer("first"), Answer("second"))
    rig.recorder.steering.append({"role": "user", "content": "and then?"})
    result = await rig.run()
    assert result.final_text == "first"
    assert [m["role"] for m in rig.recorder.stored] == ["assistant"]
    assert len(rig.provider.requests) == 1
    assert rig.recorder.steering == [{"role": "user", "content": "and then?"}]


async def test_overflow_compacts_and_retries(rig: Rig) -> None:
    rig.provider.script(Fail("context_overflow"), Answer("fits now"))
    compacted: list[int] = []

    async def compact(messages: Sequence[Message]) -> Sequence[Message]:
        compacted.append(len(messages))
        return [messages[0], {"role": "user", "content": "short"}]

    result = await rig.run(compact=compact)
    assert result.status == "completed"
    assert compacted == [2]
    assert rig.provider.requests[1].messages[-1]["content"] == "short"


async def test_overflow_retries_are_bounded(rig: Rig) -> None:
    rig.provider.script(*[Fail("context_overflow")] * 5)

    async def compact(messages: Sequence[Message]) -> Sequence[Message]:
        return messages

    limits = LoopLimits(max_overflow_retries=2)
    result = await rig.run(run_input(limits=limits), compact=compact)
    assert result.status == "failed"
    assert len(rig.provider.requests) == 3
    assert "no longer fits" in result.final_text


async def test_overflow_without_compaction_fails(rig: Rig) -> None:
    rig.provider.script(Fail("context_overflow"))
    result = await rig.run()
    assert result.status == "failed"
    assert "no longer fits" in result.final_text


async def test_a_compaction_whose_summary_cannot_be_stored_fails_the_run_plainly(
    rig: Rig,
) -> None:
    rig.provider.script(Fail("context_overflow"))

    async def compact(messages: Sequence[Message]) -> Sequence[Message]:
        raise StoreError("disk full while writing state.db")

    result = await rig.run(compact=compact)
    assert result.status == "failed"
    assert result.final_text.startswith("I stopped because this conversation could not be saved")
    assert isinstance(result.error, StoreError)


async def test_provider_error_is_never_stored(rig: Rig) -> None:
    rig.provider.script(Calls(echo_call("a")), Fail("unavailable"))
    result = await rig.run()
    assert result.status == "failed"
    assert result.final_text.startswith("The model is unavailable")
    assert [m["role"] for m in rig.recorder.stored] == ["assistant", "tool"]
    assert isinstance(result.error, ProviderError)
    assert result.final_message is None


async def test_persist_failure_fails_the_run(rig: Rig) -> None:
    rig.provider.script(Calls(echo_call("a")), Answer("never"))

    async def broken(message: Message) -> None:
        raise StoreError("disk full while writing state.db")

    result = await rig.run(persist=broken)
    assert result.status == "failed"
    assert "could not be saved" in result.final_text
    assert "disk full" in result.final_text
    assert rig.echo.calls == []  # nothing ran that memory does not know about
    assert len(rig.provider.requests) == 1


async def test_parallel_tools_keep_the_models_order(rig: Rig) -> None:
    # The slow call only finishes when the fast one has run: run one after the other,
    # they would never finish.
    rig.echo.on_call = lambda _: rig.block.release.set()
    rig.provider.script(
        Calls(tool_call("block", id="slow"), echo_call("fast", id="fast")), Answer("both")
    )
    async with asyncio.timeout(5):
        result = await rig.run(run_input(policy=ToolPolicy(max_parallel=4)))
    assert result.status == "completed"
    ends = [e.tool_call.id for e in rig.recorder.events if e.kind == "tool_end" and e.tool_call]
    assert ends == ["fast", "slow"]
    stored = [m["tool_call_id"] for m in rig.recorder.stored if m["role"] == "tool"]
    assert stored == ["slow", "fast"]  # but results go back in the model's order


async def test_tool_timeout_is_an_error_result(rig: Rig) -> None:
    rig.provider.script(Calls(tool_call("block")), Answer("gave up"))
    # Real time: the per-call timeout is the behaviour under test.
    result = await rig.run(run_input(policy=ToolPolicy(call_timeout=0.01)))
    assert result.status == "completed"
    assert "timed out after 0.01 seconds" in rig.recorder.stored[1]["content"]
    assert rig.block.cancelled == 1


async def test_calls_per_run_limit(rig: Rig) -> None:
    rig.provider.script(Calls(*[echo_call(str(i)) for i in range(3)]), Answer("ok"))
    await rig.run(run_input(policy=ToolPolicy(max_calls_per_run=2)))
    assert rig.echo.calls == ["0", "1"]
    assert "limit of 2 tool calls" in rig.recorder.stored[3]["content"]


async def test_approval_hook_waits_in_awaiting_human(rig: Rig) -> None:
    rig.provider.script(Calls(echo_call("yes"), echo_call("no")), Answer("ok"))
    asked: list[ToolCall] = []

    async def decide(call: ToolCall) -> str | None:
        return None if "yes" in call.arguments else "Not run: the user denied it."

    async def approve(call: ToolCall) -> Approval:
        asked.append(call)
        return Asking(decide(call))

    await rig.run(run_input(), approve=approve)
    assert len(asked) == 2
    assert rig.echo.calls == ["yes"]
    assert S.AWAITING_HUMAN in rig.recorder.states()
    assert rig.recorder.stored[2]["content"] == "Not run: the user denied it."


async def test_a_call_refused_at_once_never_waits(rig: Rig) -> None:
    rig.provider.script(Calls(echo_call("x")), Answer("ok"))

    async def approve(call: ToolCall) -> Approval:
        return "Not run: nobody can approve it here."

    await rig.run(run_input(), approve=approve)
    assert rig.echo.calls == []
    assert S.AWAITING_HUMAN not in rig.recorder.states()
    assert rig.recorder.stored[1]["content"] == "Not run: nobody can approve it here."


async def test_stream_yields_events_and_ends_with_run_end(rig: Rig) -> None:
    rig.provider.script(Answer("streamed reply"))
    events = [event async for event in rig.runner.stream(run_input(), RunHooks())]
    assert events[0].kind == "run_start"
    assert events[-1].kind == "run_end"
    assert events[-1].text == "streamed reply"


async def test_closing_the_stream_early_aborts_the_run(rig: Rig) -> None:
    rig.provider.script(Hang("partial"))
    stream = rig.runner.stream(run_input())
    async for event in stream:
        if event.kind == "message_update":
            break
    await stream.aclose()  # type: ignore[attr-defined]
    assert rig.provider.cancelled == 1


async def test_a_broken_listener_does_not_break_the_run(rig: Rig) -> None:
    rig.provider.script(Answer("fine"))

    def broken(event: RunEvent) -> None:
        raise ValueError("listener bug")

    result = await rig.run(listener=broken)
    assert result.status == "completed"
    assert result.final_text == "fine"


async def test_duplicate_deltas_after_a_retry_are_dropped(rig: Rig) -> None:
    rig.provider.script(Retried("Hello ", Answer("Hello world, again.")))
    result = await rig.run()
    assert result.final_text == "Hello world, again."
    updates = [e for e in rig.recorder.events if e.kind == "message_update"]
    keys = [(e.call_index, e.seq) for e in updates]
    assert len(keys) == len(set(keys))
    assert "".join(e.text for e in updates) == "Hello world, again."


def _calls_answered(stored: Sequence[Message]) -> bool:
    asked = {c["id"] for m in stored if m["role"] == "assistant" for c in m.get("tool_calls", [])}
    answered = {m["tool_call_id"] for m in stored if m["role"] == "tool"}
    return asked == answered


class _ScreenshotTool(Tool[NoParams]):
    """`shot`: a result with one image, as an MCP server's screenshot tool gives."""

    name = "shot"
    description = "Take a screenshot."
    params = NoParams

    async def run(self, args: NoParams) -> ToolResult:
        return ToolResult("[image (image/png, about 3 bytes): image 1]", images=(PNG,))


PNG = ToolImage("image/png", "iVBO")


@pytest.mark.parametrize("vision", [True, False])
async def test_a_tool_image_is_shown_to_a_vision_model_and_never_stored(vision: bool) -> None:
    provider = ScriptedProvider(vision=vision)
    runner = Runner(provider, ToolRegistry([_ScreenshotTool(), EchoTool()]))
    recorder = Recorder()
    provider.script(
        Calls(tool_call("shot", {}, id="c1"), echo_call("x", id="c2")),
        Calls(echo_call("y", id="c3")),
        Answer("A cat."),
    )
    result = await runner.run(run_input(policy=ToolPolicy(max_parallel=2)), recorder.hooks())
    assert result.status == "completed"
    second, third = provider.requests[1].messages, provider.requests[2].messages
    if vision:
        # After the whole batch's results (tool messages must follow their call), and still
        # there for the run's later calls.
        assert [m["role"] for m in second[-3:]] == ["tool", "tool", "user"]
        parts = second[-1]["content"]
        assert {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}} in parts
        assert second[-1] in third
        stored = [m for m in recorder.stored if m["role"] == "user"]
        assert stored == [
            {"role": "user", "content": "[1 image(s) from shot were shown here; they are not kept]"}
        ]
    else:
        assert [m["role"] for m in second[-2:]] == ["tool", "tool"]
        assert "does not take images" in second[-2]["content"]
        assert not any(m["role"] == "user" for m in recorder.stored)
    assert "iVBO" not in repr(recorder.stored)
