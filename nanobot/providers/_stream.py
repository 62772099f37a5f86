"""What every streaming transport shares: assembling a streamed answer, reading errors."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from nanobot.providers.base import (
    Completion,
    DeltaHandler,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)


class Assembler:
    """Turns a model's streamed pieces into deltas for the listener and one Completion.

    The core (`text`, `tool_call`, `finish`, `set_usage`) takes plain values; `add_json`
    reads a decoded OpenAI SSE chunk into it (the litellm transport reads litellm's chunk
    objects itself).
    """

    def __init__(self, on_delta: DeltaHandler | None) -> None:
        self._on_delta = on_delta
        self._seq = 0
        self._text: list[str] = []
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments...]
        self._finish = "stop"
        self.finished = False  # a finish reason arrived: the answer is whole
        self.usage = Usage()

    def add_json(self, chunk: dict[str, Any]) -> None:
        """One decoded `chat.completion.chunk`; fields the server leaves out or nulls are
        skipped."""
        usage = chunk.get("usage")
        if usage and usage.get("prompt_tokens") is not None:
            details = usage.get("prompt_tokens_details") or {}
            self.set_usage(
                usage["prompt_tokens"],
                usage.get("completion_tokens"),
                usage.get("cost"),
                details.get("cached_tokens") if isinstance(details, dict) else None,
            )
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason"):
                self.finish(choice["finish_reason"])
            delta = choice.get("delta")
            if not delta:
                continue
            if delta.get("content"):
                self.text(delta["content"])
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                self.tool_call(
                    call.get("index"),
                    call.get("id"),
                    function.get("name"),
                    function.get("arguments"),
                )

    def set_usage(
        self,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        cost: object = None,
        cached_tokens: object = None,
    ) -> None:
        """The answer's token counts (`cached_tokens`: OpenAI's
        `prompt_tokens_details.cached_tokens`), and the cost in USD the server put beside
        them (OpenRouter and LiteLLM's proxy send `usage.cost`); anything but a number
        there counts as none."""
        reported = None
        if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
            reported = float(cost)
        cached = cached_tokens if isinstance(cached_tokens, int) and cached_tokens > 0 else 0
        self.usage = Usage(
            int(prompt_tokens or 0),
            int(completion_tokens or 0),
            reported or 0.0,
            cached,
            reported is not None,
        )

    def header_cost(self, value: object) -> None:
        """The cost LiteLLM's proxy sends as its `x-litellm-response-cost` header, where the
        answer's `usage` carried none: a number at or above zero, as text or not."""
        if self.usage.cost or value is None or isinstance(value, bool):
            return
        try:
            cost = float(value) if isinstance(value, str | int | float) else math.nan
        except ValueError:
            return
        if math.isfinite(cost) and cost > 0:
            self.usage = dataclasses.replace(self.usage, cost=cost, reported=True)

    def finish(self, reason: str) -> None:
        self._finish = reason
        self.finished = True

    def text(self, piece: str) -> None:
        self._text.append(piece)
        self._emit(TextDelta(self._seq, piece))

    def tool_call(
        self, index: int | None, id_: str | None, name: str | None, arguments: str | None
    ) -> None:
        """A piece of the call at `index`: the first piece for an index names it, the rest
        carry more of its arguments."""
        index = int(index or 0)
        arguments = arguments or ""
        parts = self._calls.setdefault(index, ["", ""])
        if id_ and not parts[0]:
            parts[0] = id_
        if name and not parts[1]:
            parts[1] = name
        if arguments:
            parts.append(arguments)
        self._emit(ToolCallDelta(self._seq, index, id_, name, arguments))

    def _emit(self, delta: TextDelta | ToolCallDelta) -> None:
        self._seq += 1
        if self._on_delta is not None:
            self._on_delta(delta)

    def result(self, model: str, usage: Usage) -> Completion:
        calls = tuple(
            ToolCall(id=parts[0] or f"call_{index}", name=parts[1], arguments="".join(parts[2:]))
            for index, parts in sorted(self._calls.items())
        )
        text = "".join(self._text)
        finish = "tool_calls" if calls else self._finish
        return Completion(text or None, calls, finish, usage, model)


# How servers say that a request does not fit the model's context window (lower-cased). The
# status they send it with varies (400, 413, 500, or an error event in a stream), so the words
# decide; each is specific enough not to appear in other errors.
_OVERFLOW_WORDS = (
    "context length",  # OpenAI, vLLM: "maximum context length is"; Ollama: "max context length"
    "context_length",  # OpenAI's code: context_length_exceeded
    "context size",  # llama.cpp: "exceeds the available context size"
    "exceed_context_size",  # llama.cpp's error type
    "context window",  # "exceeds the context window"
    "contextwindowexceeded",  # LiteLLM's proxy: "litellm.ContextWindowExceededError: ..."
    "context limit",  # Anthropic: "exceed context limit"
    "prompt too long",  # Ollama: "prompt too long; exceeded max context length by N tokens"
    "prompt is too long",  # Anthropic, also through proxies
    "too many tokens",
    "input tokens exceed",  # Azure: "Input tokens exceed the configured limit"
    "maximum number of tokens allowed",  # Gemini
)


def looks_like_overflow(text: str) -> bool:
    """Whether an error's text says the request was too long for the model's context."""
    text = text.lower()
    return any(words in text for words in _OVERFLOW_WORDS)


def retry_after(exc: object) -> float | None:
    """Seconds the server asked us to wait, from `retry-after-ms` or `retry-after` on an
    exception's headers, its response's, or (aiohttp) a response's own."""
    # litellm keeps the vendor's headers on `litellm_response_headers`; `response.headers`
    # is empty on its own rate-limit errors.
    for source in (exc, getattr(exc, "response", None)):
        for attribute in ("litellm_response_headers", "headers"):
            headers = getattr(source, attribute, None)
            if not headers:
                continue
            for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
                try:
                    return max(0.0, float(headers[name]) * scale)
                except (KeyError, TypeError, ValueError):
                    continue
    return None
