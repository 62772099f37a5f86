"""The model port: what the agent needs from an LLM, in nanobot's own types; and the
transport port: what the provider needs to make one call.

Messages cross this boundary as OpenAI-format chat dicts (the lingua franca every provider
library speaks); everything coming back is typed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Message = dict[str, Any]
ToolSchema = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model asked for. `arguments` is the raw JSON text the model wrote."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a dict.

        Raises:
            ValueError: the text is not a JSON object (models do produce broken JSON).
        """
        text = self.arguments.strip() or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments are not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"arguments must be a JSON object, not {type(value).__name__}")
        return value

    def to_message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts and cost in USD: as the server reported it (OpenRouter, LiteLLM's proxy;
    `reported`), else by the model's known price, else unknown (`priced` False, cost 0.0,
    which is then no figure at all). `cached_tokens`: the part of the prompt the provider
    read from its cache, where it says."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    cached_tokens: int = 0
    reported: bool = False
    priced: bool = True

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost + other.cost,
            self.cached_tokens + other.cached_tokens,
            self.reported and other.reported,
            self.priced and other.priced,
        )


@dataclass(frozen=True, slots=True)
class Completion:
    """One finished model call."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)
    model: str = ""

    def to_message(self) -> Message:
        """The assistant message to append to history."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_message() for call in self.tool_calls]
        return message


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of assistant text. `seq` counts deltas from 0 within one attempt of a call."""

    seq: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call: the first for an `index` carries id and name."""

    seq: int
    index: int
    id: str | None
    name: str | None
    arguments: str


Delta = TextDelta | ToolCallDelta
DeltaHandler = Callable[[Delta], None]


class LLMProvider(Protocol):
    """Something that answers chat messages, streaming.

    Implementations retry transient failures themselves (and try fallback models); what
    reaches the caller is either a `Completion` or a `ProviderError`.
    """

    @property
    def model(self) -> str:
        """The primary model id."""
        ...

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema] = (),
        *,
        on_delta: DeltaHandler | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
    ) -> Completion:
        """Run one model call and return the assembled result; `model`, where given, is
        called instead of the primary one (a cheaper model past a budget's warning).

        `on_delta` is called synchronously with each streamed piece as it arrives; it must not
        raise. After a retry, pieces start again at seq 0, so a listener that keys on
        (call, seq) sees each piece once.

        Raises:
            ProviderError: with the kind of the last failure, after retries and fallbacks.
        Cancellation is safe at any point: the HTTP stream is closed.
        """
        ...

    def context_window(self) -> int:
        """Input tokens the primary model accepts."""
        ...

    def count_tokens(self, messages: Sequence[Message]) -> int:
        """Tokens `messages` take for the primary model: exact where a tokenizer is known
        and loaded (`load_tokenizer`), else an upper bound."""
        ...

    def load_tokenizer(self) -> bool:
        """Make `count_tokens` exact from now on; whether it was not (the counts it gave
        until now were upper bounds). Blocking (it may take a few hundred ms): run it in a
        thread. Idempotent."""
        ...

    def supports_vision(self) -> bool:
        """Whether the primary model accepts images in user messages."""
        ...


@dataclass(frozen=True, slots=True)
class Call:
    """One model call, as the provider hands it to a transport."""

    model: str
    messages: Sequence[Message]
    tools: Sequence[ToolSchema]
    max_tokens: int
    temperature: float


class Transport(Protocol):
    """Makes one call to one model: no retries, no fallbacks, no prices (the provider's)."""

    async def stream(self, call: Call, on_delta: DeltaHandler | None) -> Completion:
        """Make `call` and return the assembled answer; its `usage` carries the cost the
        server reported with it, if any (the provider keeps that, and prices the call by the
        model's known price only where none was reported).

        `on_delta` as in `LLMProvider.complete`, seq counting from 0. Without one, a
        transport may ask for the answer whole instead of streamed (litellm's does: each
        streamed chunk costs it some 250 µs of CPU).

        Raises:
            ProviderError: any failure of the call, its `kind` classified (the provider
            retries and falls back by it).
        Cancellation is safe at any point: the HTTP stream is closed.
        """
        ...

    def prepare(self) -> None:
        """Load now what the first call would otherwise load. Blocking (run it in a
        thread); idempotent."""
        ...

    async def aclose(self) -> None:
        """Release connections; a later call opens them again."""
        ...
