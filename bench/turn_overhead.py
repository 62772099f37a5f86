"""Issue 3, per-turn overhead: what nanobot adds to a model call that answers in 0 ms.

Everything runs in this process and its event loop: nanobot's own composition root
(`nanobot.app._agent`: LiteLLMProvider, the real tools, SQLite store, workspace template) in a
temporary data dir, against the fake model server tests/fakes/llm.py. These layers are
measured in the same run, interleaved in a shuffled order every round:

1. a bare ``litellm.acompletion(stream=True)`` consumed to its end, with exactly the messages
   and tools the turn sends (as the fake server received them, or as a thin recording wrapper
   around the provider saw them in the long session, where they change every turn);
2. ``LiteLLMProvider.complete()`` with the same messages and tools;
3. the whole turn, ``AgentLoop.handle()``;
0. the whole turn with an instant provider: the same app on the same database, whose model
   calls return the fake's answer at once, without litellm or HTTP: nanobot alone.

nanobot's overhead is (3) - (1) for a plain turn and (3) - (1a) - (1b) for a turn with one
tool call (two model calls). Each measurement lasts until the call returned *and* the
asyncio tasks it started (litellm's post-stream logging and caching tasks) have finished:
inside a turn those tasks run before the turn ends, so without this the bare call would be
charged less than its real cost. Wall-clock time is the figure; this process's CPU time over
the same interval is recorded too, as it does not grow when other processes take the CPU.
The fake runs in a separate process (its CPU is not on the measured event loop); a shorter
in-process variant is measured too.

The long-session part fills a session with 10,000 entries and compares turns there with
turns in empty sessions: whole, minus the bare litellm call with the same messages, and with
the instant provider. The stacks above are `agent.transport: litellm`; the same app with the
default transport (`auto`, which calls this model directly, as litellm would send the same
request) is measured alongside, in interleaved rounds and in rounds of its own. A profile
(cProfile) of plain turns says where the time goes, and micro-measurements price nanobot's
per-turn operations without the profiler's inflation.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import functools
import json
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar, cast
from unittest import mock

import aiohttp

import nanobot
from bench._common import REPO_ROOT, BenchError, Metric, format_table, write_results
from nanobot import app, log
from nanobot.agent.context import ContextBuilder, time_envelope
from nanobot.agent.loop import AgentLoop, Reply, TurnRequest
from nanobot.config import AgentConfig, Config
from nanobot.providers.base import (
    Completion,
    DeltaHandler,
    Message,
    ToolCall,
    ToolSchema,
    Usage,
)
from nanobot.providers.litellm_provider import _litellm
from nanobot.providers.provider import Provider
from nanobot.store import Database, NewEntry, SessionStore
from tests.fakes.llm import Call, Echo, FakeLLM, Text, ToolCalls
from tests.fakes.llm import Reply as FakeReply

NAME = "turn_overhead"
PLAIN_TARGET_MS = 3.0
TOOL_TARGET_MS = 6.0
LONG_TARGET_X = 1.2

WARMUP_ROUNDS, ROUNDS = 10, 100  # empty sessions, fake in its own process
LOCAL_WARMUP_ROUNDS, LOCAL_ROUNDS = 5, 60  # the same with the fake in this process
LONG_WARMUPS, LONG_ROUNDS = 5, 50  # 10,000-entry session against empty sessions
# The same with the default transport (auto: direct here) alone: its turns take ~3 ms, so
# many rounds are cheap.
DIRECT_WARMUPS, DIRECT_ROUNDS = 20, 300
COLD_STARTS = 7  # first turn after start-up (a fresh `_agent`), long and empty session
PROFILE_TURNS, PROFILE_LONG_TURNS, PROFILE_LONG_CALLS = 50, 10, 10
KEEP_REQUESTS = 16  # requests the fake in its own process keeps for `bodies()`
MICRO_RUNS = 300
ATTRIBUTION_ROUNDS = 200  # at most, for the profile's attribution to packages
LONG_ENTRIES, PREFILL_BATCH = 10_000, 500
SETTLE_LIMIT_S = 2.0  # longest wait for the tasks a measured call started
PAUSE_S = 0.001  # between measured items: lets litellm's thread-pool work finish
SEED = 3

MODEL = "openai/fake-model"
# The same OpenAI-compatible endpoint through litellm's own HTTP handler, not the openai SDK.
ROUTE_MODEL = "hosted_vllm/fake-model"
MESSAGE = "What is on my calendar tomorrow?"
TOOL_MESSAGE = "What do you know about me? Look it up in USER.md."
TOOL_CALL = Call("read_file", {"path": "USER.md"})
SUMMARY = (
    "The user plans their week with the assistant: reminders (dentist, passport renewal), "
    "shopping lists, train trips between Berlin, Hamburg and Munich, and bills (electricity "
    "paid, internet due on the 28th). They prefer short answers and metric units. Open: book "
    "the Munich train for the 14th; draft the note to Sam about the project review."
)

T = TypeVar("T")
Func = tuple[str, int, str]  # a function in a profile: file, line, name
RawStats = dict[Func, tuple[int, int, float, float, dict[Func, tuple[int, int, float, float]]]]


def _progress(text: str) -> None:
    sys.stdout.flush()
    print(text, file=sys.stderr, flush=True)


# -- the stack ---------------------------------------------------------------------------------


class _Recorder:
    """The app's provider, unchanged, noting what each model call was given.

    The note is a shallow copy of the message list (a few µs for a 1,000-message window);
    it is how the long session's turns, whose messages change every turn, are replayed.

    `instant`: model calls do not reach litellm at all but return at once what the fake
    would have answered (the echo, or the next of `scripted`). Token counting and the context
    window still come from the real provider. A turn then costs only nanobot's own work.
    """

    def __init__(self, inner: Provider, *, instant: bool = False) -> None:
        self.inner = inner
        self.instant = instant
        self.scripted: list[Completion] = []
        self.calls: list[tuple[list[Message], list[ToolSchema]]] = []

    @property
    def model(self) -> str:
        return self.inner.model

    async def aclose(self) -> None:
        await self.inner.aclose()

    def prepare(self) -> None:
        self.inner.prepare()

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema] = (),
        *,
        on_delta: DeltaHandler | None = None,
        max_tokens: int | None = None,
    ) -> Completion:
        self.calls.append((list(messages), list(tools)))
        if self.instant:
            return self.scripted.pop(0) if self.scripted else _echo(messages, self.model)
        return await self.inner.complete(messages, tools, on_delta=on_delta, max_tokens=max_tokens)

    def context_window(self) -> int:
        return self.inner.context_window()

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return self.inner.count_tokens(messages)


def _echo(messages: Sequence[Message], model: str) -> Completion:
    last = next(m for m in reversed(messages) if m.get("role") == "user")
    return Completion(f"echo: {last['content']}", (), "stop", Usage(900, 12), model)


INSTANT_TOOL_CALL = Completion(
    None,
    (ToolCall("call_instant", TOOL_CALL.name, TOOL_CALL.arguments_json()),),
    "tool_calls",
    Usage(900, 12),
    MODEL,
)


@dataclass(frozen=True)
class _Stack:
    config: Config
    loop: AgentLoop
    provider: _Recorder


@contextlib.asynccontextmanager
async def _stack(config: Config, *, instant: bool = False) -> AsyncIterator[_Stack]:
    """nanobot as the app builds it (`app._agent`), its provider wrapped in a _Recorder."""
    built: list[_Recorder] = []
    build = app.build_provider

    def build_recorded(config: Config) -> _Recorder:
        built.append(_Recorder(build(config), instant=instant))
        return built[-1]

    async with contextlib.AsyncExitStack() as stack:
        with mock.patch.object(app, "build_provider", build_recorded):
            loop = await stack.enter_async_context(app._agent(config))
        yield _Stack(config, loop, built[-1])


def _config(
    data_dir: Path, base_url: str, model: str = MODEL, transport: str = "litellm"
) -> Config:
    agent = AgentConfig.model_validate(
        {"model": model, "api_base": base_url, "api_key": "sk-bench", "transport": transport}
    )
    return Config(data_dir=data_dir, agent=agent)


# -- the fake model server ---------------------------------------------------------------------


class _Fake(Protocol):
    @property
    def base_url(self) -> str: ...

    async def script(self, *replies: dict[str, Any]) -> None:
        """Queue replies (tests/fakes/llm.py JSON form) for the next requests."""
        ...

    async def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of every request received so far."""
        ...


class _ProcessFake:
    """tests/fakes/llm.py in its own process: its CPU stays off the measured event loop."""

    def __init__(self, base_url: str, http: aiohttp.ClientSession) -> None:
        self._base_url = base_url
        self._root = base_url.removesuffix("/v1")
        self._http = http

    @property
    def base_url(self) -> str:
        return self._base_url

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls) -> AsyncIterator[_ProcessFake]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.fakes.llm",
            "--port",
            "0",
            # Bounded: keeping every long transcript grew the fake by hundreds of MiB, and
            # serving a long request from fresh memory cost it ~0.13 ms more than a short one.
            "--keep-requests",
            str(KEEP_REQUESTS),
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stdout is not None
            async with asyncio.timeout(60):
                line = (await process.stdout.readline()).decode().strip()
            if not line.startswith("http://"):
                raise BenchError(f"the fake model server printed {line!r}, not its URL")
            async with aiohttp.ClientSession() as http:
                yield cls(line, http)
        finally:
            if process.returncode is None:
                process.terminate()
            await process.wait()

    async def script(self, *replies: dict[str, Any]) -> None:
        url = f"{self._root}/_fake/script"
        async with self._http.post(url, json={"replies": list(replies)}) as response:
            response.raise_for_status()

    async def bodies(self) -> list[dict[str, Any]]:
        async with self._http.get(f"{self._root}/_fake/requests") as response:
            response.raise_for_status()
            return [request["body"] for request in await response.json()]


class _LocalFake:
    """tests/fakes/llm.py serving in this process's event loop."""

    def __init__(self, fake: FakeLLM) -> None:
        self._fake = fake

    @property
    def base_url(self) -> str:
        return self._fake.base_url

    async def script(self, *replies: dict[str, Any]) -> None:
        self._fake.script(*(_reply(r) for r in replies))

    async def bodies(self) -> list[dict[str, Any]]:
        return [request.body for request in self._fake.requests]


def _reply(data: dict[str, Any]) -> FakeReply:
    if data["type"] == "ToolCalls":
        return ToolCalls([Call(**c) for c in data["calls"]])
    if data["type"] == "Text":
        return Text(data["content"])
    if data["type"] == "Echo":
        return Echo()
    raise ValueError(data)


TOOL_REPLY = {"type": "ToolCalls", "calls": [vars(TOOL_CALL)]}
ECHO_REPLY = {"type": "Echo"}


# -- timing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    wall: float  # seconds until the call returned and the tasks it started finished
    returned: float  # seconds until the call returned
    cpu: float  # CPU seconds of this process (all its threads) over `wall`


CLOCKS = ("wall", "returned", "cpu")


def _settles(task: asyncio.Task[Any]) -> bool:
    """Whether a task started during a measured call is part of its cost.

    The in-process fake's connection handlers (aiohttp's web server) live as long as their
    connections.
    """
    code = getattr(task.get_coro(), "cr_code", None)
    filename = code.co_filename if code is not None else ""
    server = f"aiohttp{os.sep}web" in filename or f"tests{os.sep}fakes" in filename
    return not task.done() and not server


async def _timed(work: Awaitable[T]) -> tuple[Timing, T]:
    before = asyncio.all_tasks()
    cpu = time.process_time()
    start = time.perf_counter()
    result = await work
    returned = time.perf_counter()
    started = [t for t in asyncio.all_tasks() - before if _settles(t)]
    if started:
        await asyncio.wait(started, timeout=SETTLE_LIMIT_S)
    end = time.perf_counter()
    cpu = time.process_time() - cpu
    await asyncio.sleep(PAUSE_S)
    return Timing(end - start, returned - start, cpu), result


class Samples:
    """Measured times in ms by clock and item name, in rounds: the lists of one phase are
    aligned (the n-th value of every item comes from the same round)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, list[float]]] = {c: defaultdict(list) for c in CLOCKS}

    def add(self, name: str, timing: Timing) -> None:
        for clock in CLOCKS:
            self.values[clock][name].append(getattr(timing, clock) * 1000)

    def ms(self, name: str, clock: str = "wall") -> list[float]:
        return self.values[clock][name]

    def merge(self, other: Samples) -> None:
        """Append `other`'s values (one round's) to this phase's."""
        for clock in CLOCKS:
            for name, values in other.values[clock].items():
                self.values[clock][name].extend(values)

    def median(self, name: str, clock: str = "wall") -> float:
        return statistics.median(self.values[clock][name])

    def summed(self, *names: str, clock: str = "wall") -> list[float]:
        """Per round, the sum of the named items."""
        columns = (self.values[clock][n] for n in names)
        return [sum(values) for values in zip(*columns, strict=True)]

    def as_json(self) -> dict[str, Any]:
        return {
            name: {
                **{f"median_{clock}_ms": self.median(name, clock) for clock in CLOCKS},
                **{f"{clock}_ms": self.ms(name, clock) for clock in CLOCKS},
            }
            for name in self.values["wall"]
        }


@dataclass(frozen=True)
class Request:
    """What one model call was given."""

    messages: list[Message]
    tools: list[ToolSchema]

    @property
    def size(self) -> int:
        return len(json.dumps(self.messages))


# -- one benchmark context ---------------------------------------------------------------------


class _Bench:
    """A stack and its fake, and the three ways of making the same model call."""

    def __init__(
        self,
        stack: _Stack,
        fake: _Fake,
        label: str,
        instant: _Stack | None = None,
        variants: dict[str, _Bench] | None = None,
    ) -> None:
        self.stack, self.fake, self.label = stack, fake, label
        self.instant = instant  # the same app on the same database, with instant model calls
        # The same app on the same database and fake, another way to the model: "route"
        # (model ROUTE_MODEL), "direct" (agent.transport: auto, the default: direct here).
        self.variants = variants or {}
        self.litellm: ModuleType = _litellm()  # as nanobot configures it
        self._keys = 0

    def key(self) -> str:
        self._keys += 1
        return f"bench:{self.label}:{self._keys}"

    def _kwargs(self, request: Request) -> dict[str, Any]:
        """Exactly what LiteLLMProvider passes to litellm.acompletion."""
        agent = self.stack.config.agent
        kwargs: dict[str, Any] = {
            "model": agent.model,
            "messages": list(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": agent.max_tokens,
            "temperature": agent.temperature,
            "timeout": agent.request_timeout,
            "max_retries": 0,
            "api_key": "sk-bench",
            "api_base": self.fake.base_url,
        }
        if request.tools:
            kwargs["tools"] = list(request.tools)
        return kwargs

    async def bare_call(self, request: Request) -> None:
        stream = await self.litellm.acompletion(**self._kwargs(request))
        async for _ in stream:
            pass

    async def bare(self, request: Request, tool_call: bool = False) -> Timing:
        """Layer 1. `tool_call`: the fake answers with the tool call, as in the turn."""
        if tool_call:
            await self.fake.script(TOOL_REPLY)
        timing, _ = await _timed(self.bare_call(request))
        return timing

    async def provider(self, request: Request, tool_call: bool = False) -> Timing:
        """Layer 2."""
        if tool_call:
            await self.fake.script(TOOL_REPLY)
        inner = self.stack.provider.inner
        timing, _ = await _timed(inner.complete(request.messages, request.tools))
        return timing

    async def turn(
        self, key: str, *, tool_call: bool = False, stack: _Stack | None = None
    ) -> tuple[Timing, list[Request]]:
        """Layer 3: one turn in session `key`; returns its timing and its model calls."""
        stack = stack or self.stack
        if tool_call and stack.provider.instant:
            stack.provider.scripted.append(INSTANT_TOOL_CALL)
        elif tool_call:
            await self.fake.script(TOOL_REPLY)
        calls = stack.provider.calls
        before = len(calls)
        text = TOOL_MESSAGE if tool_call else MESSAGE
        timing, reply = await _timed(stack.loop.handle(TurnRequest(key, text)))
        made = [Request(m, t) for m, t in calls[before:]]
        del calls[:]
        _check(reply, text, tool_call)
        return timing, made


class _DirectBench(_Bench):
    """A stack calling the model directly (`agent.transport: auto` with this model, as with
    `direct`): its "bare" call is the provider's own, as
    there is no litellm below it to call instead."""

    async def bare_call(self, request: Request) -> None:
        await self.stack.provider.inner.complete(request.messages, request.tools)


def _check(reply: Reply | None, text: str, tool_call: bool) -> None:
    """The turn completed as scripted: the fake echoes the user's message (after the tool)."""
    if reply is None or reply.result.status != "completed":
        raise BenchError(f"the turn did not complete: {reply}")
    if not (reply.text or "").startswith("echo: [") or not (reply.text or "").endswith(text):
        raise BenchError(f"unexpected reply {reply.text!r}")
    if tool_call:
        entries = reply.result.entries
        if reply.result.tools_used != ("read_file",) or len(entries) != 3:
            raise BenchError(f"expected one read_file call, got {entries}")
        if str(entries[1].get("content", "")).startswith("Error"):
            raise BenchError(f"the tool failed: {entries[1]}")


# -- empty sessions: the three layers ----------------------------------------------------------


@dataclass(frozen=True)
class ShortRequests:
    plain: Request
    tool_1: Request  # the tool turn's first call: the model asks for the tool
    tool_2: Request  # its second call: the model answers with the result
    recorded_equal: bool  # the fake's record is what nanobot handed the provider (nulls aside)


async def _capture(b: _Bench) -> ShortRequests:
    """One plain and one tool turn; their requests as the fake server received them."""
    _, plain = await b.turn(b.key())
    _, tool = await b.turn(b.key(), tool_call=True)
    bodies = (await b.fake.bodies())[-3:]  # the fake serves this benchmark alone
    if len(plain) != 1 or len(tool) != 2 or len(bodies) != 3:
        raise BenchError(f"expected 1 + 2 model calls, got {len(plain)} + {len(tool)}")
    received = [Request(body["messages"], body.get("tools") or []) for body in bodies]
    equal = all(
        _without_nulls([r.messages, r.tools]) == _without_nulls([n.messages, n.tools])
        for r, n in zip(received, [*plain, *tool], strict=True)
    )
    return ShortRequests(received[0], received[1], received[2], recorded_equal=equal)


def _without_nulls(value: Any) -> Any:
    """`value` without null fields, which litellm leaves out of the request body."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


async def _short_round(
    b: _Bench, requests: ShortRequests, rng: random.Random, samples: Samples | None
) -> None:
    """Each item once, in a shuffled order."""

    def add(name: str, timing: Timing) -> None:
        if samples is not None:
            samples.add(name, timing)

    async def bare_plain() -> None:
        add("bare plain", await b.bare(requests.plain))

    async def provider_plain() -> None:
        add("provider plain", await b.provider(requests.plain))

    async def turn_plain() -> None:
        timing, calls = await b.turn(b.key())
        if len(calls) != 1:
            raise BenchError(f"a plain turn made {len(calls)} model calls")
        add("turn plain", timing)

    async def bare_tool() -> None:
        add("bare tool 1", await b.bare(requests.tool_1, tool_call=True))
        add("bare tool 2", await b.bare(requests.tool_2))

    async def provider_tool() -> None:
        add("provider tool 1", await b.provider(requests.tool_1, tool_call=True))
        add("provider tool 2", await b.provider(requests.tool_2))

    async def turn_tool() -> None:
        timing, calls = await b.turn(b.key(), tool_call=True)
        if len(calls) != 2:
            raise BenchError(f"a tool turn made {len(calls)} model calls")
        add("turn tool", timing)

    async def instant_plain() -> None:
        assert b.instant is not None
        add("instant plain", (await b.turn(b.key(), stack=b.instant))[0])

    async def instant_tool() -> None:
        assert b.instant is not None
        add("instant tool", (await b.turn(b.key(), tool_call=True, stack=b.instant))[0])

    items: list[Callable[[], Awaitable[None]]] = [
        bare_plain,
        provider_plain,
        turn_plain,
        bare_tool,
        provider_tool,
        turn_tool,
    ]
    if b.instant is not None:
        items += [instant_plain, instant_tool]
    for prefix, variant in b.variants.items():

        async def variant_plain(prefix: str = prefix, variant: _Bench = variant) -> None:
            add(f"{prefix} turn plain", (await variant.turn(variant.key()))[0])

        async def variant_bare(prefix: str = prefix, variant: _Bench = variant) -> None:
            add(f"{prefix} bare plain", await variant.bare(requests.plain))

        items += [variant_plain, variant_bare]
    rng.shuffle(items)
    for item in items:
        await item()


async def _short_phase(
    b: _Bench, warmups: int, rounds: int, rng: random.Random
) -> tuple[Samples, ShortRequests]:
    requests = await _capture(b)
    samples = Samples()
    for index in range(warmups + rounds):
        await _short_round(b, requests, rng, samples if index >= warmups else None)
    return samples, requests


# -- the long session --------------------------------------------------------------------------

_USER = (
    "Remind me to {task} {when}.",
    "What's the weather in {city} {when}?",
    "Add {item} to my shopping list.",
    "What did we decide about {topic}?",
    "How long is the train from {city} to {city2}?",
    "Move my {event} to {when}.",
    "Did I already pay the {bill} bill?",
    "Write a short note to {person} saying I'll be late.",
    "What was that {thing} you recommended?",
    "Thanks, that's perfect.",
)
_ASSISTANT = (
    "Done. I'll remind you to {task} {when}.",
    "{city} {when}: mostly sunny, {n} to {n2} °C, a light westerly wind.",
    "Added {item}. Your list has {n} items now.",
    "We agreed to {decision}; you wanted to look at it again {when}.",
    "About {n} hours with one change; the first direct train leaves at 07:{m:02d}.",
    "Moved your {event} to {when}, with the reminder 15 minutes before.",
    "Yes, you paid the {bill} bill on the {n}th; the receipt is in your notes.",
    'Draft: "Hi {person}, I\'m running about {n} minutes late, sorry! See you soon."',
    'It was "{title}"; you noted it in your memory file last week.',
    "You're welcome!",
)
_WORDS = {
    "task": ["call the dentist", "renew my passport", "water the plants", "book the flat tour"],
    "when": ["tomorrow at 10", "on Friday", "tonight", "next Monday morning", "this weekend"],
    "city": ["Berlin", "Hamburg", "Munich", "Cologne", "Leipzig"],
    "item": ["milk and eggs", "coffee beans", "two lemons", "dish soap", "oat flakes"],
    "topic": ["the holiday budget", "the new sofa", "the project review", "the gym plan"],
    "event": ["haircut", "team call", "dinner with Ana", "car service"],
    "bill": ["electricity", "internet", "phone", "water"],
    "person": ["Sam", "Ana", "my landlord", "the team"],
    "thing": ["book", "podcast", "ramen place", "hiking trail"],
    "decision": ["spend at most 900 euros", "wait for the sale", "move it to spring"],
    "title": ["The Overstory", "Hidden Brain", "Ramen Yokocho", "Malerweg stage 2"],
}


def _chat(entries: int, seed: int = SEED) -> list[Message]:
    """`entries` messages of a plausible assistant chat: user and assistant in turn."""
    rng = random.Random(seed)
    start = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
    messages: list[Message] = []
    for index in range(entries // 2):
        words: dict[str, Any] = {k: rng.choice(v) for k, v in _WORDS.items()}
        words |= {"city2": rng.choice(_WORDS["city"]), "n": rng.randint(2, 25)}
        words |= {"n2": words["n"] + rng.randint(3, 8), "m": rng.randint(0, 59)}
        which = rng.randrange(len(_USER))
        stamp = time_envelope(start + timedelta(minutes=37 * index))
        messages.append({"role": "user", "content": f"[{stamp}]\n{_USER[which].format(**words)}"})
        messages.append({"role": "assistant", "content": _ASSISTANT[which].format(**words)})
    return messages


async def _prefill(path: Path, key: str, entries: int) -> float:
    """Give `key` a live session of `entries` entries, appended in batches; returns seconds."""
    started = time.perf_counter()
    async with await Database.open(path) as db:
        store = SessionStore(db)
        session = await store.live(key)
        messages = _chat(entries)
        for index in range(0, len(messages), PREFILL_BATCH):
            batch = messages[index : index + PREFILL_BATCH]
            await store.append(session, [NewEntry("message", m) for m in batch])
        if await store.count(session) != entries:
            raise BenchError("the pre-filled session has the wrong number of entries")
    return time.perf_counter() - started


@dataclass
class LongInfo:
    prefill_s: float = 0.0
    first_turn_ms: float = 0.0
    first_turn_calls: int = 0
    first_turn_messages: int = 0
    compaction_messages: int = 0
    messages_long: list[int] = field(default_factory=list)
    bytes_long: list[int] = field(default_factory=list)
    messages_empty: int = 0
    bytes_empty: int = 0
    compacting_turns: int = 0
    messages_direct: list[int] = field(default_factory=list)
    compacting_turns_direct: int = 0


async def _first_long_turn(b: _Bench, key: str, info: LongInfo) -> None:
    """The first turn in the pre-filled session: reads a full window, then compacts.

    The compaction's model call gets a short scripted summary (the default echo would stream
    the whole transcript back, word by word).
    """
    await b.fake.script(ECHO_REPLY, {"type": "Text", "content": SUMMARY})
    timing, calls = await b.turn(key)
    if len(calls) != 2:
        raise BenchError(
            f"expected the first turn in a full session to compact (2 model calls), "
            f"got {len(calls)}: the benchmark's assumptions no longer hold"
        )
    info.first_turn_ms = timing.wall * 1000
    info.first_turn_calls = len(calls)
    info.first_turn_messages = len(calls[0].messages)
    info.compaction_messages = len(calls[1].messages)


@dataclass
class _Round:
    """One round's samples, and whether a long-session turn in it compacted."""

    info: LongInfo
    samples: Samples = field(default_factory=Samples)
    compacted: bool = False

    def skip(self) -> None:
        self.compacted = True
        self.info.compacting_turns += 1


async def _long_round(
    b: _Bench,
    key: str,
    plain: Request,
    rng: random.Random,
    *,
    samples: Samples | None,
    info: LongInfo,
) -> None:
    """A turn in the long session, then the bare and provider calls with its very messages;
    and a turn in an empty session with its bare and provider calls. Shuffled. A round in
    which a long-session turn compacted (not a steady-state turn) is left out whole, so that
    the phase's lists stay aligned by round."""
    this_round = _Round(info)
    add, skip_round = this_round.samples.add, this_round.skip

    async def long_group() -> None:
        timing, calls = await b.turn(key)
        if len(calls) != 1:  # compacted after the turn: not a steady-state turn
            skip_round()
            return
        add("turn long", timing)
        request = calls[0]
        if samples is not None:
            info.messages_long.append(len(request.messages))
            info.bytes_long.append(request.size)
        parts: list[tuple[str, Callable[[], Awaitable[Timing]]]] = [
            ("bare long", lambda: b.bare(request)),
            ("provider long", lambda: b.provider(request)),
        ]
        rng.shuffle(parts)
        for name, part in parts:
            add(name, await part())

    async def empty_group() -> None:
        async def turn() -> Timing:
            timing, calls = await b.turn(b.key())
            if len(calls) != 1:
                raise BenchError(f"a plain turn made {len(calls)} model calls")
            return timing

        parts: list[tuple[str, Callable[[], Awaitable[Timing]]]] = [
            ("turn empty", turn),
            ("bare empty", lambda: b.bare(plain)),
            ("provider empty", lambda: b.provider(plain)),
        ]
        rng.shuffle(parts)
        for name, part in parts:
            add(name, await part())

    async def instant_group() -> None:
        assert b.instant is not None
        parts = [("instant long", key), ("instant empty", b.key())]
        rng.shuffle(parts)
        for name, session in parts:
            timing, calls = await b.turn(session, stack=b.instant)
            if len(calls) != 1:
                skip_round()
                return
            add(name, timing)

    async def variant_group(prefix: str, variant: _Bench) -> None:
        order = ["long", "empty"]
        rng.shuffle(order)
        for session in order:
            timing, calls = await variant.turn(key if session == "long" else variant.key())
            if len(calls) != 1:
                skip_round()
                return
            add(f"{prefix} turn {session}", timing)
            add(f"{prefix} bare {session}", await variant.bare(calls[0]))

    groups: list[Callable[[], Awaitable[None]]] = [long_group, empty_group]
    if b.instant is not None:
        groups.append(instant_group)
    for prefix, variant in b.variants.items():
        groups.append(functools.partial(variant_group, prefix, variant))
    rng.shuffle(groups)
    for group in groups:
        await group()
    if samples is not None and not this_round.compacted:
        samples.merge(this_round.samples)


async def _alone_phase(
    direct: _Bench, instant: _Stack, key: str, rng: random.Random, info: LongInfo
) -> Samples:
    """`transport: direct` alone, then nanobot alone (the instant provider) alone: per round
    a turn in the long session and one in a new session, in random order.

    With nothing else in the rounds, a ratio of a few ms against a few ms is not drowned in
    noise: litellm's turns leave garbage and threads behind, and every other stack's turns
    in the long session add entries that the next turn must read and count.
    """
    samples = Samples()
    for prefix, stack in (("turn", direct.stack), ("instant", instant)):
        for index in range(DIRECT_WARMUPS + DIRECT_ROUNDS):
            order = ["long", "empty"]
            rng.shuffle(order)
            for session in order:
                timing, calls = await direct.turn(
                    key if session == "long" else direct.key(), stack=stack
                )
                if len(calls) != 1:  # compacted after the turn: not a steady-state turn
                    info.compacting_turns_direct += 1
                    continue
                if index >= DIRECT_WARMUPS:
                    samples.add(f"{prefix} {session}", timing)
                    if session == "long" and prefix == "turn":
                        info.messages_direct.append(len(calls[0].messages))
                await asyncio.sleep(PAUSE_S)
    return samples


async def _cold_starts(b: _Bench, key: str, rng: random.Random) -> Samples:
    """The first turn after start-up (a fresh `_agent`: cold caches), in the long and in an
    empty session, and a turn of the running app in the long session, interleaved."""
    samples = Samples()
    for _ in range(COLD_STARTS):
        keys = [("cold long", key), ("cold empty", b.key()), ("warm long", key)]
        rng.shuffle(keys)
        for name, session in keys:
            if name == "warm long":  # the running app, for comparison
                timing, calls = await b.turn(session)
            else:
                async with _stack(b.stack.config) as fresh:
                    timing, calls = await b.turn(session, stack=fresh)
            if len(calls) != 1:
                raise BenchError(f"a turn in the start-up comparison made {len(calls)} calls")
            samples.add(name, timing)
    return samples


# -- profile -----------------------------------------------------------------------------------

_NANOBOT_DIR = str(Path(nanobot.__file__).resolve().parent) + os.sep
_BENCH_DIRS = (str(REPO_ROOT / "bench") + os.sep, str(REPO_ROOT / "tests") + os.sep)
HTTP = "HTTP client (httpx over aiohttp)"
_OWNERS = (
    ("litellm", "litellm"),
    ("openai", "openai SDK"),
    *(
        (package, HTTP)
        for package in ("httpx", "httpcore", "anyio", "h11", "aiohttp", "yarl", "multidict")
    ),
)
IDLE = "idle: event loop waiting (fake server, SQLite thread)"
LOOP = "asyncio event loop"


def _owner(func: Func) -> str | None:
    """Who a function's own time belongs to; None for shared code (pydantic, the standard
    library, builtins), whose time goes to its callers' owners."""
    path, _, name = func
    if name == "<method 'poll' of 'select.epoll' objects>":
        return IDLE
    if path.startswith(_NANOBOT_DIR):
        return "nanobot"
    if path.startswith(_BENCH_DIRS):
        return "benchmark harness"
    for package, owner in _OWNERS:
        if f"{os.sep}site-packages{os.sep}{package}{os.sep}" in path:
            return owner
    if path.endswith((f"asyncio{os.sep}base_events.py", f"asyncio{os.sep}events.py")):
        return LOOP
    return None


def _raw(stats: pstats.Stats) -> RawStats:
    return cast(RawStats, vars(stats)["stats"])


def attribute(stats: pstats.Stats) -> dict[str, float]:
    """Seconds of the profile by owner.

    Shared code's own time is split among its callers in proportion to the time it spent for
    each, up the call graph to the nearest owner: the share of each owner in a shared function
    solves shares(f) = sum of weight(f, caller) * shares(caller), by Gauss-Seidel iteration
    (call graphs have cycles: recursion). What reaches no owner is "other".
    """
    raw = _raw(stats)
    weights: dict[Func, list[tuple[Func, float]]] = {}
    for func, (*_, callers) in raw.items():
        if _owner(func) is not None:
            continue
        known = {c: v for c, v in callers.items() if c in raw}
        by_time = sum(v[2] for v in known.values()) > 0  # else by number of calls
        total = sum(v[2] if by_time else v[1] for v in known.values())
        weights[func] = [(c, (v[2] if by_time else v[1]) / total) for c, v in known.items()]
    shares: dict[Func, dict[str, float]] = {func: {} for func in weights}

    def of(func: Func) -> dict[str, float]:
        owner = _owner(func)
        return {owner: 1.0} if owner is not None else shares[func]

    for _ in range(ATTRIBUTION_ROUNDS):
        change = 0.0
        for func, edges in weights.items():
            mixed: dict[str, float] = defaultdict(float)
            for caller, weight in edges:
                for owner, share in of(caller).items():
                    mixed[owner] += weight * share
            change += abs(sum(mixed.values()) - sum(shares[func].values()))
            shares[func] = mixed
        if change < 1e-9:
            break
    totals: dict[str, float] = defaultdict(float)
    for func, (_, _, tottime, _, _) in raw.items():
        found = of(func)
        for owner, share in found.items():
            totals[owner] += tottime * share
        totals["other"] += tottime * max(0.0, 1.0 - sum(found.values()))
    return dict(totals)


def _label(func: Func) -> str:
    path, line, name = func
    if path.startswith(_NANOBOT_DIR):
        path = path[len(_NANOBOT_DIR) :]
    return f"{path}:{line} {name}"


def nanobot_top(stats: pstats.Stats, count: int) -> list[tuple[str, float]]:
    """nanobot's functions by cumulative time (seconds), without those around the model call
    (LiteLLMProvider.complete and what it awaits), whose time is mostly litellm's."""
    raw = _raw(stats)
    callees: dict[Func, set[Func]] = defaultdict(set)
    for func, (*_, callers) in raw.items():
        for caller in callers:
            callees[caller].add(func)
    litellm_entry = {f for f in raw if _owner(f) == "litellm" and f[2] == "acompletion"}

    def calls_model(func: Func) -> bool:
        seen, todo = {func}, [func]
        while todo:
            for callee in callees[todo.pop()]:
                if callee in litellm_entry:
                    return True
                if callee not in seen:
                    seen.add(callee)
                    todo.append(callee)
        return False

    rows = [
        (_label(func), values[3])
        for func, values in raw.items()
        if _owner(func) == "nanobot" and not calls_model(func)
    ]
    return sorted(rows, key=lambda row: -row[1])[:count]


def ncalls(stats: pstats.Stats, path_end: str, name: str) -> int:
    """Calls of a (synchronous) function; for coroutines cProfile counts every resumption."""
    return sum(
        values[1]
        for (path, _, func), values in _raw(stats).items()
        if func == name and path.endswith(path_end)
    )


def cumulative(stats: pstats.Stats, path_end: str, name: str) -> float:
    return sum(
        values[3]
        for (path, _, func), values in _raw(stats).items()
        if func == name and path.endswith(path_end)
    )


async def _profile_turns(
    b: _Bench, turns: int, key: str | None = None, stack: _Stack | None = None
) -> pstats.Stats:
    """cProfile around `turns` turns (only the turns themselves are profiled)."""
    stack = stack or b.stack
    profile = cProfile.Profile()
    for _ in range(turns):
        request = TurnRequest(key or b.key(), MESSAGE)
        profile.enable()
        reply = await stack.loop.handle(request)
        profile.disable()
        _check(reply, MESSAGE, tool_call=False)
        del stack.provider.calls[:]
        await asyncio.sleep(PAUSE_S)
    return pstats.Stats(profile)


async def _profile_bare(b: _Bench, request: Request, calls: int) -> pstats.Stats:
    """cProfile around `calls` bare litellm calls (their background tasks run unprofiled)."""
    profile = cProfile.Profile()
    for _ in range(calls):
        profile.enable()
        await b.bare_call(request)
        profile.disable()
        await asyncio.sleep(0.01)
    return pstats.Stats(profile)


# -- micro-measurements ------------------------------------------------------------------------


def _median_us(fn: Callable[[], object], runs: int = MICRO_RUNS) -> float:
    values = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        values.append(time.perf_counter() - start)
    return statistics.median(values) * 1e6


async def _median_us_async(fn: Callable[[], Awaitable[object]], runs: int = MICRO_RUNS) -> float:
    values = []
    for _ in range(runs):
        start = time.perf_counter()
        await fn()
        values.append(time.perf_counter() - start)
    return statistics.median(values) * 1e6


@dataclass(frozen=True)
class Micro:
    operation: str
    us_per_call: float
    calls_per_turn: float

    @property
    def ms_per_turn(self) -> float:
        return self.us_per_call * self.calls_per_turn / 1000


async def _micro(b: _Bench, profile: pstats.Stats, turns: int) -> list[Micro]:
    """nanobot's per-turn operations, priced one by one (no profiler); calls per plain turn
    from the profile."""
    config = b.stack.config
    registry = app.build_tools(config, sandbox=app.build_sandbox(config))
    context = ContextBuilder(config.workspace_path)
    context.system_prompt()
    provider = b.stack.provider.inner
    message = [{"role": "user", "content": f"[{time_envelope(datetime.now(UTC))}]\n{MESSAGE}"}]
    litellm = b.litellm

    def cost() -> None:
        with contextlib.suppress(Exception):
            litellm.cost_per_token(model=MODEL, prompt_tokens=900, completion_tokens=12)

    def per_turn(path_end: str, name: str) -> float:
        return ncalls(profile, path_end, name) / turns

    round_trips = per_turn("nanobot/store/database.py", "submit")
    async with await Database.open(config.state_db_path) as db:
        select = await _median_us_async(lambda: db.fetchone("SELECT 1"))
        store = SessionStore(db)
        scratch = await store.live("bench:micro")
        entry = [NewEntry("message", {"role": "assistant", "content": f"echo: {MESSAGE}"})]
        append = await _median_us_async(lambda: store.append(scratch, entry))
    return [
        Micro(
            "ToolRegistry.schemas(): JSON schemas of the 8 tools (pydantic)",
            _median_us(registry.schemas),
            per_turn("nanobot/tools/registry.py", "schemas"),
        ),
        Micro(
            "SQLite statement via the store's thread (`SELECT 1` round trip)",
            select,
            round_trips,
        ),
        Micro(
            "SessionStore.append(1 entry): BEGIN IMMEDIATE, INSERT … RETURNING, COMMIT (one trip)",
            append,
            per_turn("nanobot/store/sessions.py", "_encode"),
        ),
        Micro(
            "LiteLLMProvider.count_tokens(1 message) (litellm.token_counter)",
            _median_us(lambda: provider.count_tokens(message)),
            per_turn("nanobot/providers/litellm_provider.py", "count_tokens"),
        ),
        Micro(
            "litellm.cost_per_token (LiteLLMProvider._cost; unknown model: raises)",
            _median_us(cost),
            per_turn("nanobot/providers/litellm_provider.py", "_cost"),
        ),
        Micro(
            "ContextBuilder.system_prompt(), files unchanged",
            _median_us(context.system_prompt),
            per_turn("nanobot/agent/context.py", "system_prompt"),
        ),
        Micro(
            "asyncio task created (create_task; ensure_future in Runner._race)",
            _median_us(lambda: asyncio.ensure_future(asyncio.sleep(0)).cancel()),
            per_turn("asyncio/base_events.py", "create_task"),
        ),
    ]


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Measurements:
    short: Samples
    short_requests: ShortRequests
    local: Samples
    long: Samples
    direct_long: Samples
    cold: Samples
    info: LongInfo
    profile: pstats.Stats
    profile_instant: pstats.Stats
    profile_long: pstats.Stats
    profile_long_bare: pstats.Stats
    micro: list[Micro]
    long_request: Request


async def measure() -> Measurements:
    rng = random.Random(SEED)
    info = LongInfo()
    long_key = "bench:long"
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-turn-") as tmp:
        # First, while the process is fresh: with the fake in this process, every object the
        # later phases leave alive (profiles, samples, caches) would slow its garbage
        # collections (measured: 3.2 ms of overhead at the end of the run, 2.1-2.3 fresh).
        _progress(
            f"empty sessions, fake in this process: {LOCAL_WARMUP_ROUNDS} warm-up + "
            f"{LOCAL_ROUNDS} rounds ..."
        )
        async with FakeLLM() as server:
            local_fake = _LocalFake(server)
            config = _config(Path(tmp) / "data-local", local_fake.base_url)
            async with _stack(config) as s:
                local, _ = await _short_phase(
                    _Bench(s, local_fake, "local"), LOCAL_WARMUP_ROUNDS, LOCAL_ROUNDS, rng
                )
        data_dir = Path(tmp) / "data"
        _progress(f"pre-filling a session with {LONG_ENTRIES:,} entries ...")
        info.prefill_s = await _prefill(data_dir / "state.db", long_key, LONG_ENTRIES)
        async with (
            _ProcessFake.running() as fake,
            _stack(_config(data_dir, fake.base_url)) as s,
            _stack(_config(data_dir, fake.base_url), instant=True) as instant,
            _stack(_config(data_dir, fake.base_url, ROUTE_MODEL)) as routed,
            _stack(_config(data_dir, fake.base_url, transport="auto")) as direct,
        ):
            variants = {
                "route": _Bench(routed, fake, "route"),
                "direct": _DirectBench(direct, fake, "direct"),
            }
            b = _Bench(s, fake, "process", instant, variants)
            _progress(
                f"empty sessions, fake in its own process: {WARMUP_ROUNDS} warm-up + "
                f"{ROUNDS} rounds ..."
            )
            short, requests = await _short_phase(b, WARMUP_ROUNDS, ROUNDS, rng)
            info.messages_empty = len(requests.plain.messages)
            info.bytes_empty = requests.plain.size

            _progress(f"10,000-entry session: first turn, then {LONG_ROUNDS} rounds ...")
            await _first_long_turn(b, long_key, info)
            long = Samples()
            for index in range(LONG_WARMUPS + LONG_ROUNDS):
                sink = long if index >= LONG_WARMUPS else None
                await _long_round(b, long_key, requests.plain, rng, samples=sink, info=info)
            _progress(
                f"10,000-entry session, transport: auto (direct) alone, then nanobot alone: "
                f"{DIRECT_WARMUPS} warm-up + {DIRECT_ROUNDS} rounds each ..."
            )
            direct_long = await _alone_phase(variants["direct"], instant, long_key, rng, info)
            _progress(f"first turn after start-up: {COLD_STARTS} x 2 fresh stacks ...")
            cold = await _cold_starts(b, long_key, rng)

            _progress("profiling ...")
            profile = await _profile_turns(b, PROFILE_TURNS)
            profile_instant = await _profile_turns(b, PROFILE_TURNS, stack=instant)
            profile_long = await _profile_turns(b, PROFILE_LONG_TURNS, long_key)
            _, calls = await b.turn(long_key)
            long_request = calls[0]
            profile_long_bare = await _profile_bare(b, long_request, PROFILE_LONG_CALLS)
            micro = await _micro(b, profile, PROFILE_TURNS)

    return Measurements(
        short=short,
        short_requests=requests,
        local=local,
        long=long,
        direct_long=direct_long,
        cold=cold,
        info=info,
        profile=profile,
        profile_instant=profile_instant,
        profile_long=profile_long,
        profile_long_bare=profile_long_bare,
        micro=micro,
        long_request=long_request,
    )


def _difference(values_a: Sequence[float], values_b: Sequence[float]) -> list[float]:
    return [a - b for a, b in zip(values_a, values_b, strict=True)]


def _short_metrics(s: Samples, prefix: str, *, full: bool) -> list[Metric]:
    """The plain and the tool turn in empty sessions: the layers and the overheads."""
    paired = "median of the per-round differences"
    metrics: list[Metric] = []
    for kind, target, bare, provider in (
        ("plain", PLAIN_TARGET_MS, ["bare plain"], ["provider plain"]),
        (
            "tool",
            TOOL_TARGET_MS,
            ["bare tool 1", "bare tool 2"],
            ["provider tool 1", "provider tool 2"],
        ),
    ):
        turn = f"turn {kind}"
        calls = "" if kind == "plain" else ", both calls"

        def overhead(clock: str, turn: str = turn, bare: list[str] = bare) -> float:
            return s.median(turn, clock) - statistics.median(s.summed(*bare, clock=clock))

        def wrapper(clock: str, bare: list[str] = bare, provider: list[str] = provider) -> float:
            return statistics.median(s.summed(*provider, clock=clock)) - statistics.median(
                s.summed(*bare, clock=clock)
            )

        metrics += [
            Metric(f"{prefix}{kind} turn: (3) AgentLoop.handle", "ms", s.ms(turn)),
            Metric(f"{prefix}{kind}: (1) bare litellm{calls}", "ms", s.summed(*bare)),
        ]
        if full:
            metrics.append(
                Metric(
                    f"{kind}: (0) turn, instant provider (nanobot alone)",
                    "ms",
                    s.ms(f"instant {kind}"),
                )
            )
        if full and kind == "tool":
            metrics += [
                Metric("tool: (1a) bare, call 1 (asks for the tool)", "ms", s.ms(bare[0])),
                Metric("tool: (1b) bare, call 2 (answers)", "ms", s.ms(bare[1])),
            ]
        if full:
            metrics.append(
                Metric(f"{kind}: (2) LiteLLMProvider.complete{calls}", "ms", s.summed(*provider))
            )
        metrics += [
            Metric(
                f"{prefix}{kind}: nanobot overhead (3)-(1)",
                "ms",
                [overhead("wall")],
                target=target,
                note="difference of the medians, wall clock",
            ),
            Metric(
                f"{prefix}{kind}: nanobot overhead (3)-(1), CPU",
                "ms",
                [overhead("cpu")],
                target=target,
                note="difference of the medians, process CPU time",
            ),
        ]
        if full:
            metrics += [
                Metric(
                    f"{kind}: (3)-(1) per round",
                    "ms",
                    _difference(s.ms(turn), s.summed(*bare)),
                    note=paired,
                ),
                Metric(f"{kind}: provider wrapper (2)-(1)", "ms", [wrapper("wall")]),
                Metric(f"{kind}: provider wrapper (2)-(1), CPU", "ms", [wrapper("cpu")]),
            ]
    return metrics


def metrics_of(m: Measurements) -> list[Metric]:
    long, cold = m.long, m.cold

    def overhead(session: str, clock: str) -> float:
        return long.median(f"turn {session}", clock) - long.median(f"bare {session}", clock)

    def ratio(clock: str) -> float:
        return long.median("turn long", clock) / long.median("turn empty", clock)

    def paired(session: str) -> float:
        turns, bares = long.ms(f"turn {session}"), long.ms(f"bare {session}")
        return statistics.median(_difference(turns, bares))

    return [
        *_short_metrics(m.short, "", full=True),
        *_short_metrics(m.local, "in-process fake, ", full=False),
        Metric("empty session: turn", "ms", long.ms("turn empty")),
        Metric("empty session: bare litellm call", "ms", long.ms("bare empty")),
        Metric("10k session: turn", "ms", long.ms("turn long")),
        Metric("10k session: bare litellm call", "ms", long.ms("bare long")),
        Metric("10k session: LiteLLMProvider.complete", "ms", long.ms("provider long")),
        Metric(
            "(a) turn, 10k / empty",
            "x",
            [ratio("wall")],
            target=LONG_TARGET_X,
            note="ratio of the medians, wall clock",
        ),
        Metric(
            "(a) turn, 10k / empty, CPU",
            "x",
            [ratio("cpu")],
            target=LONG_TARGET_X,
            note="ratio of the medians, process CPU time",
        ),
        Metric(
            "(a) per round",
            "x",
            [a / b for a, b in zip(long.ms("turn long"), long.ms("turn empty"), strict=True)],
        ),
        Metric("empty session: overhead (turn - bare)", "ms", [overhead("empty", "wall")]),
        Metric("10k session: overhead (turn - bare)", "ms", [overhead("long", "wall")]),
        Metric(
            "(b) overhead, 10k / empty",
            "x",
            [overhead("long", "wall") / overhead("empty", "wall")],
            target=LONG_TARGET_X,
            note="ratio of the differences of the medians, wall clock",
        ),
        Metric(
            "(b) overhead, 10k / empty, paired",
            "x",
            [paired("long") / paired("empty")],
            note="ratio of the medians of the per-round differences turn - bare, wall clock",
        ),
        Metric("empty session: overhead, CPU", "ms", [overhead("empty", "cpu")]),
        Metric("10k session: overhead, CPU", "ms", [overhead("long", "cpu")]),
        Metric(
            "(b) overhead, 10k / empty, CPU",
            "x",
            [overhead("long", "cpu") / overhead("empty", "cpu")],
            target=LONG_TARGET_X,
            note="ratio of the differences of the medians, process CPU time",
        ),
        Metric("instant provider: empty session turn", "ms", long.ms("instant empty")),
        Metric("instant provider: 10k session turn", "ms", long.ms("instant long")),
        Metric(
            "(b') nanobot alone, 10k / empty",
            "x",
            [long.median("instant long") / long.median("instant empty")],
            target=LONG_TARGET_X,
            note="instant-provider turns, ratio of the medians, wall clock",
        ),
        Metric(
            "(b') nanobot alone, 10k / empty, CPU",
            "x",
            [long.median("instant long", "cpu") / long.median("instant empty", "cpu")],
            target=LONG_TARGET_X,
            note="instant-provider turns, ratio of the medians, process CPU time",
        ),
        *_variant_metrics(m, "route"),
        *_variant_metrics(m, "direct"),
        *_alone_metrics(m.direct_long, "transport auto (direct), own rounds:", "turn", "(a) turn"),
        *_alone_metrics(m.direct_long, "nanobot alone, own rounds:", "instant", "(b')"),
        Metric("first turn after start-up: 10k session", "ms", cold.ms("cold long")),
        Metric("10k session turn, running app (interleaved)", "ms", cold.ms("warm long")),
        Metric("first turn after start-up: empty session", "ms", cold.ms("cold empty")),
        Metric(
            "first turn after start-up: 10k / empty",
            "x",
            [cold.median("cold long") / cold.median("cold empty")],
        ),
        Metric("first turn in the pre-filled session (+compaction)", "ms", [m.info.first_turn_ms]),
    ]


def _alone_metrics(samples: Samples, label: str, prefix: str, ratio: str) -> list[Metric]:
    """The long and the empty session's turn of one stack's own rounds, and their ratio
    (wall clock and CPU time), from the items `{prefix} long` and `{prefix} empty`."""
    long, empty = f"{prefix} long", f"{prefix} empty"
    return [
        Metric(f"{label} empty session: turn", "ms", samples.ms(empty)),
        Metric(f"{label} 10k session: turn", "ms", samples.ms(long)),
        *(
            Metric(
                f"{label} {ratio}, 10k / empty{suffix}",
                "x",
                [samples.median(long, clock) / samples.median(empty, clock)],
                target=LONG_TARGET_X,
                note=f"ratio of the medians, {what}",
            )
            for clock, suffix, what in (
                ("wall", "", "wall clock"),
                ("cpu", ", CPU", "process CPU time"),
            )
        ),
    ]


def _variant_metrics(m: Measurements, prefix: str) -> list[Metric]:
    """The same app reaching the model another way: "route", litellm's own HTTP handler
    (ROUTE_MODEL, no openai SDK); "direct", `agent.transport: auto`, the default, which
    calls this model directly (no litellm at all; its "bare" call is
    `DirectOpenAIProvider.complete`)."""
    s, long = m.short, m.long
    if prefix == "route":
        label, bare = ROUTE_MODEL.split("/", maxsplit=1)[0] + "/", "bare litellm"
    else:
        label, bare = "transport auto (direct):", "DirectOpenAIProvider.complete"

    def overhead(session: str) -> float:
        return long.median(f"{prefix} turn {session}") - long.median(f"{prefix} bare {session}")

    return [
        Metric(f"{label} plain turn: (3)", "ms", s.ms(f"{prefix} turn plain")),
        Metric(f"{label} plain: (1) {bare}", "ms", s.ms(f"{prefix} bare plain")),
        Metric(
            f"{label} plain: nanobot overhead (3)-(1)",
            "ms",
            [s.median(f"{prefix} turn plain") - s.median(f"{prefix} bare plain")],
            note="difference of the medians, wall clock",
        ),
        Metric(f"{label} empty session: turn", "ms", long.ms(f"{prefix} turn empty")),
        Metric(f"{label} 10k session: turn", "ms", long.ms(f"{prefix} turn long")),
        Metric(f"{label} 10k session: {bare}", "ms", long.ms(f"{prefix} bare long")),
        Metric(
            f"{label} (a) turn, 10k / empty",
            "x",
            [long.median(f"{prefix} turn long") / long.median(f"{prefix} turn empty")],
            target=LONG_TARGET_X,
            note="ratio of the medians, wall clock",
        ),
        Metric(
            f"{label} (b) overhead, 10k / empty",
            "x",
            [overhead("long") / overhead("empty")],
            target=LONG_TARGET_X,
            note="ratio of the differences of the medians, wall clock",
        ),
    ]


def _per_turn(seconds: float, turns: int) -> float:
    return seconds / turns * 1000


def _print_profile(title: str, stats: pstats.Stats, turns: int) -> dict[str, Any]:
    totals = attribute(stats)
    whole = sum(totals.values())
    busy = whole - totals.get(IDLE, 0.0)
    print(f"\n{title}: {turns} turns, {_per_turn(whole, turns):.2f} ms per turn under cProfile")
    for owner, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        share = "" if owner == IDLE else f"  {seconds / busy:6.1%} of the CPU"
        print(f"  {_per_turn(seconds, turns):7.2f} ms  {owner}{share}")
    top = nanobot_top(stats, 14)
    print("  nanobot functions by cumulative time, per turn (the model call task excluded):")
    for label, seconds in top:
        print(f"  {_per_turn(seconds, turns):7.2f} ms  {label}")
    return {
        "turns": turns,
        "per_turn_ms": {k: _per_turn(v, turns) for k, v in totals.items()},
        "nanobot_top_ms": [(label, _per_turn(v, turns)) for label, v in top],
    }


def report(m: Measurements, metrics: Sequence[Metric]) -> dict[str, Any]:
    info = m.info
    print(format_table(metrics))
    plain = m.short_requests.plain
    messages_long = statistics.median(info.messages_long)
    bytes_long = statistics.median(info.bytes_long)
    slope = (m.long.median("bare long") - m.long.median("bare empty")) / (
        messages_long - info.messages_empty
    )
    transform_s = cumulative(
        m.profile_long_bare, "openai/_utils/_transform.py", "async_maybe_transform"
    )
    transform_ms = _per_turn(transform_s, PROFILE_LONG_CALLS)
    bare_owners = attribute(m.profile_long_bare)
    bare_profiled_ms = _per_turn(
        sum(bare_owners.values()) - bare_owners.get(IDLE, 0.0), PROFILE_LONG_CALLS
    )
    print(
        f"\nRequests: an empty-session turn sends {info.messages_empty} messages "
        f"({info.bytes_empty / 1024:.1f} KiB of messages, {len(plain.tools)} tools); the "
        f"10k-session turn {messages_long:.0f} ({bytes_long / 1024:.0f} KiB). The first turn in "
        f"the pre-filled session sent {info.first_turn_messages} and its compaction "
        f"{info.compaction_messages}; measured turns that compacted: {info.compacting_turns}. "
        f"In the direct transport's own rounds the long session sent "
        f"{statistics.median(info.messages_direct):.0f} messages (median; "
        f"{min(info.messages_direct)}-{max(info.messages_direct)}) and "
        f"{info.compacting_turns_direct} turns compacted."
    )
    print(
        f"The bare litellm call costs {slope:.3f} ms more per extra message. Under cProfile, "
        f"openai's request transform (async_maybe_transform) takes {transform_ms:.1f} ms of "
        f"{bare_profiled_ms:.1f} ms per 10k-session call "
        f"({transform_ms / len(m.long_request.messages) * 1000:.0f} µs per message, profiled)."
    )
    print(
        "Requests as the fake received them = what nanobot gave the provider (null fields "
        f"aside): {m.short_requests.recorded_equal}. "
        f"Pre-fill: {info.prefill_s:.2f} s."
    )
    profiles = {
        "plain": _print_profile("Profile of plain turns", m.profile, PROFILE_TURNS),
        "instant": _print_profile(
            "Profile of plain turns with the instant provider", m.profile_instant, PROFILE_TURNS
        ),
        "long": _print_profile("Profile of 10k-session turns", m.profile_long, PROFILE_LONG_TURNS),
    }
    print("\nnanobot's per-turn operations, priced without the profiler (plain turn):")
    for item in m.micro:
        print(
            f"  {item.us_per_call:8.1f} µs x {item.calls_per_turn:5.1f}/turn = "
            f"{item.ms_per_turn:6.2f} ms  {item.operation}"
        )
    return {
        "metrics": [metric.as_json() for metric in metrics],
        "samples": {
            "empty_sessions_process_fake": m.short.as_json(),
            "empty_sessions_in_process_fake": m.local.as_json(),
            "long_session": m.long.as_json(),
            "long_session_direct_alone": m.direct_long.as_json(),
            "first_turn_after_start_up": m.cold.as_json(),
        },
        "long_session": {
            "entries": LONG_ENTRIES,
            "prefill_s": info.prefill_s,
            "first_turn_ms": info.first_turn_ms,
            "first_turn_model_calls": info.first_turn_calls,
            "first_turn_messages": info.first_turn_messages,
            "compaction_messages": info.compaction_messages,
            "messages_per_request_long": messages_long,
            "message_bytes_long": bytes_long,
            "messages_per_request_empty": info.messages_empty,
            "message_bytes_empty": info.bytes_empty,
            "compacting_turns": info.compacting_turns,
            "messages_per_request_long_direct": statistics.median(info.messages_direct),
            "compacting_turns_direct": info.compacting_turns_direct,
            "bare_ms_per_extra_message": slope,
            "openai_transform_ms_profiled": transform_ms,
            "bare_call_ms_profiled": bare_profiled_ms,
        },
        "recorded_request_equal": m.short_requests.recorded_equal,
        "profiles": profiles,
        "micro": [
            {
                "operation": item.operation,
                "us_per_call": item.us_per_call,
                "calls_per_turn": item.calls_per_turn,
                "ms_per_turn": item.ms_per_turn,
            }
            for item in m.micro
        ],
        "runs": {
            "rounds": {"warmups": WARMUP_ROUNDS, "measured": ROUNDS},
            "in_process_rounds": {"warmups": LOCAL_WARMUP_ROUNDS, "measured": LOCAL_ROUNDS},
            "long_rounds": {"warmups": LONG_WARMUPS, "measured": LONG_ROUNDS},
            "cold_starts": COLD_STARTS,
            "profiled_turns": {"plain": PROFILE_TURNS, "long": PROFILE_LONG_TURNS},
        },
    }


def main() -> None:
    for name in [n for n in os.environ if n.startswith("NANOBOT_")]:
        del os.environ[name]  # the Config built here must be exactly this benchmark's
    log.setup(level="WARNING")
    load_before = os.getloadavg()
    m = asyncio.run(measure())
    load_after = os.getloadavg()
    metrics = metrics_of(m)
    payload = report(m, metrics)
    print(
        f"Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; "
        f"after: {', '.join(f'{x:.2f}' for x in load_after)} (other processes slow every figure)."
    )
    payload["load_average"] = {"before": load_before, "after": load_after}
    path = write_results(NAME, payload)
    print(f"\nResults: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
