"""An in-memory `LLMProvider` that plays a script: for tests of what sits above the model port.

The runner, the loop and anything else that only needs *a* provider are tested with this,
in milliseconds and without HTTP; the real litellm (and the direct transport) are tested
against the fake HTTP server in `tests/fakes/llm.py`::

    provider = ScriptedProvider(
        Calls(tool_call("echo", {"text": "ping"}, id="c1")),
        Answer("Done.", usage=Usage(10, 2)),
    )
    result = await Runner(provider, tools).run(run_input)
    assert provider.requests[1].messages[-1]["content"] == "echoed ping"

Each `complete()` takes the next step of the script:

- `Answer(text)`: streams `text` word by word as `TextDelta`s, returns it, finish "stop".
- `Calls(*calls, content=None)`: streams the calls as `ToolCallDelta`s, finish "tool_calls".
- `Fail(kind)`: raises `ProviderError(kind)`, as the real provider does after its retries.
- `Hang(partial="")`: streams `partial`, then waits until cancelled (a model that never
  finishes); `ScriptedProvider.hanging` is set once it waits, `cancelled` counts cancellations.
- `Retried(partial, then)`: streams `partial`, then plays `then` with seq starting again at
  0, as the real provider does when it retries a call that broke mid-stream.

A call past the end of the script fails the test (an `AssertionError` in the caller), so a
test says exactly how many model calls it expects.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nanobot.errors import ProviderError, ProviderErrorKind
from nanobot.providers.base import (
    Completion,
    DeltaHandler,
    Message,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSchema,
    Usage,
)

_ids = itertools.count(1)


def tool_call(name: str, arguments: Mapping[str, Any] | str = "{}", *, id: str = "") -> ToolCall:
    """A tool call as the model would write it: a dict is JSON-encoded, a string sent as is.

    An empty `id` gets a fresh one (`call_1`, `call_2`, …, unique in the process).
    """
    text = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
    return ToolCall(id or f"call_{next(_ids)}", name, text)


@dataclass(frozen=True, slots=True)
class Answer:
    """A final text answer."""

    text: str
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True, slots=True)
class Calls:
    """The model asks for `calls` (in this order), optionally saying `content` first."""

    calls: tuple[ToolCall, ...]
    content: str | None = None
    usage: Usage = field(default_factory=Usage)

    def __init__(
        self, *calls: ToolCall, content: str | None = None, usage: Usage | None = None
    ) -> None:
        object.__setattr__(self, "calls", calls)
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "usage", usage or Usage())


@dataclass(frozen=True, slots=True)
class Fail:
    """The call fails with `ProviderError(kind)` (after the provider's retries, if any)."""

    kind: ProviderErrorKind = "unavailable"


@dataclass(frozen=True, slots=True)
class Hang:
    """The model streams `partial` and then never finishes."""

    partial: str = ""


@dataclass(frozen=True, slots=True)
class Retried:
    """A stream that broke after `partial` and was retried: `then` replays from seq 0."""

    partial: str
    then: Answer | Calls


Step = Answer | Calls | Fail | Hang | Retried


@dataclass(frozen=True, slots=True)
class Request:
    """What one `complete()` call was given (deep copies: later mutation does not show)."""

    messages: list[Message]
    tools: list[ToolSchema]
    max_tokens: int | None
    streamed: bool = False  # whether it was given an `on_delta` to stream to


class ScriptedProvider:
    """An `LLMProvider` whose answers are the script's steps, in order.

    `context_window`, token counting and vision are plain settings: tokens are counted as
    one per four characters of the JSON-encoded messages, which is all a caller that
    budgets by `count_tokens` needs to be consistent.
    """

    def __init__(
        self,
        *steps: Step,
        model: str = "scripted/model",
        context_window: int = 128_000,
        vision: bool = False,
    ) -> None:
        self._steps: deque[Step] = deque(steps)
        self._model = model
        self._window = context_window
        self._vision = vision
        self.requests: list[Request] = []
        self.hanging = asyncio.Event()
        self.cancelled = 0

    def script(self, *steps: Step) -> None:
        """Append steps to the script."""
        self._steps.extend(steps)

    @property
    def model(self) -> str:
        return self._model

    @property
    def remaining(self) -> int:
        """Steps not yet played."""
        return len(self._steps)

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema] = (),
        *,
        on_delta: DeltaHandler | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
    ) -> Completion:
        self.requests.append(
            Request(
                copy.deepcopy(list(messages)),
                copy.deepcopy(list(tools)),
                max_tokens,
                streamed=on_delta is not None,
            )
        )
        if not self._steps:
            raise AssertionError(f"the script has no step for model call {len(self.requests)}")
        step = self._steps.popleft()
        emit = on_delta or (lambda _: None)
        try:
            return await self._play(step, emit)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _play(self, step: Step, emit: DeltaHandler) -> Completion:
        await asyncio.sleep(0)  # a real call always yields to the loop at least once
        match step:
            case Answer(text, usage):
                _stream_text(text, emit)
                return Completion(text, usage=usage, model=self._model)
            case Calls(calls, content, usage):
                _stream_calls(calls, content, emit)
                return Completion(content, calls, "tool_calls", usage, self._model)
            case Fail(kind):
                raise ProviderError(kind, f"scripted {kind}", model=self._model)
            case Hang(partial):
                _stream_text(partial, emit)
                self.hanging.set()
                await asyncio.Future()  # until cancelled
                raise AssertionError("unreachable")
            case Retried(partial, then):
                _stream_text(partial, emit)
                return await self._play(then, emit)

    def context_window(self) -> int:
        return self._window

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return len(json.dumps(list(messages))) // 4

    def load_tokenizer(self) -> bool:
        return False  # its counts are exact already, by its own measure

    def supports_vision(self) -> bool:
        return self._vision


def _stream_text(text: str, emit: DeltaHandler, seq: int = 0) -> int:
    words = text.split(" ")
    pieces = [word + " " for word in words[:-1]] + [words[-1]]
    for piece in (p for p in pieces if p):
        emit(TextDelta(seq, piece))
        seq += 1
    return seq


def _stream_calls(calls: Sequence[ToolCall], content: str | None, emit: DeltaHandler) -> None:
    seq = _stream_text(content or "", emit)
    for index, call in enumerate(calls):
        emit(ToolCallDelta(seq, index, call.id, call.name, ""))
        emit(ToolCallDelta(seq + 1, index, None, None, call.arguments))
        seq += 2
