"""What every streaming transport shares: assembling a streamed answer, reading errors."""

from __future__ import annotations

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
            self.set_usage(usage["prompt_tokens"], usage.get("completion_tokens"))
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

    def set_usage(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        self.usage = Usage(int(prompt_tokens or 0), int(completion_tokens or 0))

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


def looks_like_overflow(text: str) -> bool:
    text = text.lower()
    return "context length" in text or "context_length" in text or "too many tokens" in text


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
