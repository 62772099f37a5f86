"""The runner's state machine, through the real litellm against the fake LLM server."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import Field

from nanobot.agent.run import (
    TRANSITIONS,
    LoopLimits,
    RunEvent,
    RunHooks,
    RunInput,
    RunState,
    ToolPolicy,
)
from nanobot.agent.runner import ABORTED, SKIPPED, Runner
from nanobot.errors import StoreError
from nanobot.providers.base import Message, ToolCall
from nanobot.providers.provider import RetryPolicy
from nanobot.tools.base import Tool, ToolParams
from nanobot.tools.registry import ToolRegistry
from tests.fakes.llm import Call, ContextLengthError, FakeLLM, ServerError, Text, ToolCalls
from tests.test_provider import on_litellm

SYSTEM: Message = {"role": "system", "content": "You are a test."}
USER: Message = {"role": "user", "content": "hi"}


class EchoParams(ToolParams):
    text: str = Field(description="What to echo.")


class EchoTool(Tool[EchoParams]):
    name = "echo"
    description = "Echo the text."
    params = EchoParams

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def run(self, args: EchoParams) -> str:
        self.calls.append(args.text)
        return f"echoed {args.text}"


class SleepParams(ToolParams):
    seconds: float


class SleepTool(Tool[SleepParams]):
    name = "sleep"
    description = "Sleep."
    params = SleepParams

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finished = 0

    async def run(self, args: SleepParams) -> str:
        self.started.set()
        await asyncio.sleep(args.seconds)
        self.finished += 1
        return "slept"


class Recorder:
    """Hooks that store entries in a list and record events."""

    def __init__(self) -> None:
        self.stored: list[Message] = []
        self.events: list[RunEvent] = []
        self.steering: list[Message] = []
        self.follow_up: list[Message] = []

    def hooks(self, **overrides: Any) -> RunHooks:
        async def persist(message: Message) -> None:
            self.stored.append(message)

        def take(queue: list[Message]) -> Sequence[Message]:
            taken = queue[:1]
            del queue[:1]
            return taken

        options: dict[str, Any] = {
            "persist": persist,
            "steering": lambda: take(self.steering),
            "follow_up": lambda: take(self.follow_up),
            "listener": self.events.append,
        }
        options.update(overrides)
        return RunHooks(**options)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def states(self) -> list[RunState]:
        return [e.state for e in self.events if e.kind == "status" and e.state is not None]


@pytest.fixture
def echo() -> EchoTool:
    return EchoTool()


@pytest.fixture
def sleeper() -> SleepTool:
    return SleepTool()


@pytest.fixture
def runner(fake_llm: FakeLLM, echo: EchoTool, sleeper: SleepTool) -> Runner:
    provider = on_litellm(
        "openai/fake-model",
        api_key="sk-test",
        api_base=fake_llm.base_url,
        retry=RetryPolicy(attempts=0),
    )
    return Runner(provider, ToolRegistry([echo, sleeper]))


def run_input(**kwargs: Any) -> RunInput:
    options: dict[str, Any] = {"session_id": "test:1", "messages": [SYSTEM, USER]}
    options.update(kwargs)
    return RunInput(**options)


@pytest.mark.parametrize(
    ("start", "end", "allowed"),
    [
        (RunState.IDLE, RunState.PREPARING, True),
        (RunState.IDLE, RunState.TOOL_RUNNING, False),
        (RunState.PREPARING, RunState.MODEL_RUNNING, True),
        (RunState.MODEL_RUNNING, RunState.TOOL_RUNNING, True),
        (RunState.MODEL_RUNNING, RunState.COMPLETED, True),
        (RunState.MODEL_RUNNING, RunState.AWAITING_HUMAN, False),
        (RunState.TOOL_RUNNING, RunState.AWAITING_HUMAN, True),
        (RunState.TOOL_RUNNING, RunState.MODEL_RUNNING, True),
        (RunState.TOOL_RUNNING, RunState.COMPLETED, True),
        (RunState.AWAITING_HUMAN, RunState.TOOL_RUNNING, True),
        (RunState.AWAITING_HUMAN, RunState.MODEL_RUNNING, False),
        (RunState.AWAITING_HUMAN, RunState.ABORTED, True),
        (RunState.COMPLETED, RunState.PREPARING, False),
        (RunState.FAILED, RunState.MODEL_RUNNING, False),
        (RunState.ABORTED, RunState.COMPLETED, False),
    ],
)
def test_transition_table(start: RunState, end: RunState, allowed: bool) -> None:
    assert (end in TRANSITIONS[start]) is allowed


async def test_plain_answer(runner: Runner, fake_llm: FakeLLM) -> None:
    fake_llm.script(Text("Hello there."))
    recorder = Recorder()
    result = await runner.run(run_input(), recorder.hooks())
    assert result.status == "completed"
    assert result.final_text == "Hello there."
    assert recorder.stored == [{"role": "assistant", "content": "Hello there."}]
    assert result.usage.total_tokens > 0
    assert recorder.states() == [
        RunState.PREPARING,
        RunState.MODEL_RUNNING,
        RunState.COMPLETED,
    ]
    kinds = recorder.kinds()
    assert kinds[0] == "run_start"
    assert kinds[-1] == "run_end"
    assert kinds.count("message_update") >= 2
    text = "".join(e.text for e in recorder.events if e.kind == "message_update")
    assert text == "Hello there."


async def test_tool_round_trip(runner: Runner, fake_llm: FakeLLM, echo: EchoTool) -> None:
    fake_llm.script(ToolCalls([Call("echo", {"text": "ping"}, id="c1")]), Text("Done."))
    recorder = Recorder()
    result = await runner.run(run_input(), recorder.hooks())
    assert result.status == "completed"
    assert result.final_text == "Done."
    assert echo.calls == ["ping"]
    assert result.tools_used == ("echo",)
    roles = [m["role"] for m in recorder.stored]
    assert roles == ["assistant", "tool", "assistant"]
    assert recorder.stored[1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "echo",
        "content": "echoed ping",
    }
    # The model saw the result on its second call.
    assert fake_llm.requests[1].messages[-1]["content"] == "echoed ping"
    assert [t["function"]["name"] for t in fake_llm.requests[0].tools] == ["echo", "sleep"]
    assert RunState.TOOL_RUNNING in recorder.states()
    assert "tool_start" in recorder.kinds()
    assert "tool_end" in recorder.kinds()


async def test_bad_tool_arguments_go_back_to_the_model(runner: Runner, fake_llm: FakeLLM) -> None:
    fake_llm.script(
        ToolCalls([Call("echo", '{"text": broken'), Call("echo", {"txt": "x"}), Call("nope", {})]),
        Text("Sorry."),
    )
    recorder = Recorder()
    result = await runner.run(run_input(), recorder.hooks())
    assert result.status == "completed"
    results = [m["content"] for m in recorder.stored if m["role"] == "tool"]
    assert "not valid JSON" in results[0]
    assert "text: Field required" in results[1]
    assert "txt: unknown argument" in results[1]
    assert "unknown tool 'nope'" in results[2]


async def test_allowed_tools_are_the_intersection(runner: Runner, fake_llm: FakeLLM) -> None:
    fake_llm.script(ToolCalls([Call("sleep", {"seconds": 0})]), Text("ok"))
    recorder = Recorder()
    policy = ToolPolicy(allow_list=["echo", "sleep"])
    await runner.run(run_input(policy=policy, allowed_tools=["echo"]), recorder.hooks())
    assert [t["function"]["name"] for t in fake_llm.requests[0].tools] == ["echo"]
    assert "not available" in recorder.stored[1]["content"]


@pytest.mark.parametrize(
    ("limits", "replies", "reason"),
    [
        (LoopLimits(max_iterations=2), 3, "limit of 2 model calls"),
        (LoopLimits(max_tool_rounds=1), 3, "limit of 1 rounds of tool calls"),
    ],
)
async def test_limits_end_the_run_as_failed(
    runner: Runner, fake_llm: FakeLLM, limits: LoopLimits, replies: int, reason: str
) -> None:
    fake_llm.script(*[ToolCalls([Call("echo", {"text": str(i)})]) for i in range(replies)])
    recorder = Recorder()
    result = await runner.run(run_input(limits=limits), recorder.hooks())
    assert result.status == "failed"
    assert reason in result.final_text
    assert result.final_text.startswith("I stopped")
    # Every stored tool call has its result: history stays well-formed.
    assert _calls_answered(recorder.stored)
    assert not any(
        m["role"] == "assistant" and "I stopped" in str(m["content"]) for m in recorder.stored
    )


async def test_duration_limit(runner: Runner, fake_llm: FakeLLM, sleeper: SleepTool) -> None:
    fake_llm.script(ToolCalls([Call("sleep", {"seconds": 30}, id="s1")]))
    recorder = Recorder()
    result = await runner.run(run_input(limits=LoopLimits(max_run_duration=0.5)), recorder.hooks())
    assert result.status == "failed"
    assert "longer than its limit of 0.5 seconds" in result.final_text
    assert sleeper.finished == 0
    assert _calls_answered(recorder.stored)


async def test_abort_mid_stream(runner: Runner, fake_llm: FakeLLM) -> None:
    fake_llm.chunk_delay = 0.2
    fake_llm.script(Text("one two three four five six seven eight nine ten"))
    recorder = Recorder()
    streaming = asyncio.Event()

    def listen(event: RunEvent) -> None:
        recorder.events.append(event)
        if event.kind == "message_update":
            streaming.set()

    run = run_input()
    task = asyncio.create_task(runner.run(run, recorder.hooks(listener=listen)))
    await streaming.wait()
    assert runner.abort(run.run_id)
    result = await task
    assert result.status == "aborted"
    assert recorder.stored == []  # the partial answer is dropped, not half-written
    assert recorder.states()[-1] == RunState.ABORTED
    assert not runner.abort(run.run_id)  # no longer active


async def test_abort_mid_tool(runner: Runner, fake_llm: FakeLLM, sleeper: SleepTool) -> None:
    fake_llm.script(
        ToolCalls([Call("sleep", {"seconds": 30}, id="s1"), Call("echo", {"text": "x"}, id="e1")])
    )
    recorder = Recorder()
    run = run_input()
    task = asyncio.create_task(runner.run(run, recorder.hooks()))
    await sleeper.started.wait()
    runner.abort(run.run_id)
    result = await task
    assert result.status == "aborted"
    assert sleeper.finished == 0
    tool_results = {m["tool_call_id"]: m["content"] for m in recorder.stored if m["role"] == "tool"}
    assert tool_results == {
        "s1": ABORTED,
        "e1": "Not run: this turn stopped before the tool could start.",
    }
    assert _calls_answered(recorder.stored)


async def test_steering_skips_the_rest_of_the_batch(
    runner: Runner, fake_llm: FakeLLM, echo: EchoTool
) -> None:
    fake_llm.script(
        ToolCalls([Call("echo", {"text": "a"}, id="1"), Call("echo", {"text": "b"}, id="2")]),
        Text("Changed course."),
    )
    recorder = Recorder()
    steer: Message = {"role": "user", "content": "actually, stop that"}
    original = EchoTool.run

    async def steer_after_first(self: EchoTool, args: EchoParams) -> str:
        recorder.steering.append(steer)
        return await original(self, args)

    EchoTool.run = steer_after_first  # type: ignore[method-assign]
    try:
        result = await runner.run(run_input(), recorder.hooks())
    finally:
        EchoTool.run = original  # type: ignore[method-assign]
    assert result.final_text == "Changed course."
    assert echo.calls == ["a"]
    assert [m.get("content") for m in recorder.stored[1:4]] == [
        "echoed a",
        SKIPPED,
        steer["content"],
    ]
    assert fake_llm.requests[1].messages[-1] == steer


async def test_follow_up_is_delivered_when_the_run_would_stop(
    runner: Runner, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("first"), Text("second"))
    recorder = Recorder()
    recorder.follow_up.append({"role": "user", "content": "and then?"})
    result = await runner.run(run_input(), recorder.hooks())
    assert result.final_text == "second"
    assert [m["role"] for m in recorder.stored] == ["assistant", "user", "assistant"]
    assert fake_llm.request_count == 2


async def test_overflow_compacts_and_retries(runner: Runner, fake_llm: FakeLLM) -> None:
    fake_llm.script(ContextLengthError(), Text("fits now"))
    recorder = Recorder()
    compacted: list[int] = []

    async def compact(messages: Sequence[Message]) -> Sequence[Message]:
        compacted.append(len(messages))
        return [messages[0], {"role": "user", "content": "short"}]

    result = await runner.run(run_input(), recorder.hooks(compact=compact))
    assert result.status == "completed"
    assert compacted == [2]
    assert fake_llm.requests[1].messages[-1]["content"] == "short"


async def test_overflow_retries_are_bounded(runner: Runner, fake_llm: FakeLLM) -> None:
    fake_llm.script(*[ContextLengthError()] * 5)
    recorder = Recorder()

    async def compact(messages: Sequence[Message]) -> Sequence[Message]:
        return messages

    limits = LoopLimits(max_overflow_retries=2)
    result = await runner.run(run_input(limits=limits), recorder.hooks(compact=compact))
    assert result.status == "failed"
    assert fake_llm.request_count == 3
    assert "no longer fits" in result.final_text


async def test_provider_error_is_never_stored(runner: Runner, fake_llm: FakeLLM) -> None:
    fake_llm.script(ToolCalls([Call("echo", {"text": "a"})]), ServerError(500))
    recorder = Recorder()
    result = await runner.run(run_input(), recorder.hooks())
    assert result.status == "failed"
    assert result.final_text.startswith("The model is unavailable")
    assert [m["role"] for m in recorder.stored] == ["assistant", "tool"]
    assert result.error is not None


async def test_persist_failure_fails_the_run(
    runner: Runner, fake_llm: FakeLLM, echo: EchoTool
) -> None:
    fake_llm.script(ToolCalls([Call("echo", {"text": "a"})]), Text("never"))

    async def broken(message: Message) -> None:
        raise StoreError("disk full while writing state.db")

    result = await runner.run(run_input(), Recorder().hooks(persist=broken))
    assert result.status == "failed"
    assert "could not be saved" in result.final_text
    assert "disk full" in result.final_text
    assert echo.calls == []  # nothing ran that memory does not know about
    assert fake_llm.request_count == 1


async def test_parallel_tools_keep_the_models_order(
    runner: Runner, fake_llm: FakeLLM, sleeper: SleepTool
) -> None:
    fake_llm.script(
        ToolCalls(
            [
                Call("sleep", {"seconds": 0.3}, id="slow"),
                Call("echo", {"text": "fast"}, id="fast"),
            ]
        ),
        Text("both"),
    )
    recorder = Recorder()
    result = await runner.run(run_input(policy=ToolPolicy(max_parallel=4)), recorder.hooks())
    assert result.status == "completed"
    ends = [e.tool_call.id for e in recorder.events if e.kind == "tool_end" and e.tool_call]
    assert ends == ["fast", "slow"]  # they really ran at the same time
    stored = [m["tool_call_id"] for m in recorder.stored if m["role"] == "tool"]
    assert stored == ["slow", "fast"]  # but results go back in the model's order


async def test_tool_timeout_is_an_error_result(runner: Runner, fake_llm: FakeLLM) -> None:
    fake_llm.script(ToolCalls([Call("sleep", {"seconds": 30})]), Text("gave up"))
    recorder = Recorder()
    result = await runner.run(run_input(policy=ToolPolicy(call_timeout=0.2)), recorder.hooks())
    assert result.status == "completed"
    assert "timed out after 0.2 seconds" in recorder.stored[1]["content"]


async def test_calls_per_run_limit(runner: Runner, fake_llm: FakeLLM, echo: EchoTool) -> None:
    calls = [Call("echo", {"text": str(i)}) for i in range(3)]
    fake_llm.script(ToolCalls(calls), Text("ok"))
    recorder = Recorder()
    await runner.run(run_input(policy=ToolPolicy(max_calls_per_run=2)), recorder.hooks())
    assert echo.calls == ["0", "1"]
    assert "limit of 2 tool calls" in recorder.stored[3]["content"]


async def test_approval_hook_waits_in_awaiting_human(
    runner: Runner, fake_llm: FakeLLM, echo: EchoTool
) -> None:
    fake_llm.script(
        ToolCalls([Call("echo", {"text": "yes"}), Call("echo", {"text": "no"})]), Text("ok")
    )
    recorder = Recorder()
    asked: list[ToolCall] = []

    async def approve(call: ToolCall) -> bool:
        asked.append(call)
        return "yes" in call.arguments

    policy = ToolPolicy(require_approval_by_default=True)
    await runner.run(run_input(policy=policy), recorder.hooks(approve=approve))
    assert len(asked) == 2
    assert echo.calls == ["yes"]
    assert RunState.AWAITING_HUMAN in recorder.states()
    assert "did not approve" in recorder.stored[2]["content"]


async def test_stream_yields_events_and_ends_with_run_end(
    runner: Runner, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("streamed reply"))
    events = [event async for event in runner.stream(run_input(), RunHooks())]
    assert events[0].kind == "run_start"
    assert events[-1].kind == "run_end"
    assert events[-1].text == "streamed reply"


async def test_duplicate_deltas_after_a_retry_are_dropped(fake_llm: FakeLLM) -> None:
    from tests.fakes.llm import Disconnect

    provider = on_litellm(
        "openai/fake-model",
        api_key="sk-test",
        api_base=fake_llm.base_url,
        retry=RetryPolicy(attempts=2, base_delay=0.01),
    )
    fake_llm.script(Disconnect(content="Hello "), Text("Hello world, again."))
    recorder = Recorder()
    result = await Runner(provider, ToolRegistry()).run(run_input(), recorder.hooks())
    assert result.final_text == "Hello world, again."
    keys = [(e.call_index, e.seq) for e in recorder.events if e.kind == "message_update"]
    assert len(keys) == len(set(keys))


def _calls_answered(stored: Sequence[Message]) -> bool:
    asked = {c["id"] for m in stored if m["role"] == "assistant" for c in m.get("tool_calls", [])}
    answered = {m["tool_call_id"] for m in stored if m["role"] == "tool"}
    return asked == answered
