"""nanobot as the app builds it, its provider wrapped to record (or skip) model calls."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from bench._turns.scenario import MODEL, TOOL_CALL
from nanobot import app
from nanobot.agent.loop import AgentLoop
from nanobot.config import AgentConfig, Config
from nanobot.providers.base import Completion, DeltaHandler, Message, ToolCall, ToolSchema, Usage
from nanobot.providers.provider import Provider


class Recorder:
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

    def prepare(self, *, require_key: bool = True) -> None:
        self.inner.prepare(require_key=require_key)

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema] = (),
        *,
        on_delta: DeltaHandler | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
    ) -> Completion:
        self.calls.append((list(messages), list(tools)))
        if self.instant:
            return self.scripted.pop(0) if self.scripted else _echo(messages, self.model)
        return await self.inner.complete(
            messages, tools, on_delta=on_delta, max_tokens=max_tokens, model=model
        )

    def context_window(self) -> int:
        return self.inner.context_window()

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return self.inner.count_tokens(messages)

    def load_tokenizer(self) -> bool:
        return self.inner.load_tokenizer()


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
class Stack:
    config: Config
    loop: AgentLoop
    provider: Recorder


@contextlib.asynccontextmanager
async def open_stack(config: Config, *, instant: bool = False) -> AsyncIterator[Stack]:
    """nanobot as the app builds it (`app.open_parts`), its provider wrapped in a Recorder."""
    built: list[Recorder] = []
    build = app.build_provider

    def build_recorded(config: Config) -> Recorder:
        built.append(Recorder(build(config), instant=instant))
        return built[-1]

    async with contextlib.AsyncExitStack() as stack:
        with mock.patch.object(app, "build_provider", build_recorded):
            loop = (await stack.enter_async_context(app.open_parts(config))).loop
        yield Stack(config, loop, built[-1])


def bench_config(
    data_dir: Path, base_url: str, model: str = MODEL, transport: str = "litellm"
) -> Config:
    agent = AgentConfig.model_validate(
        {"model": model, "api_base": base_url, "api_key": "sk-bench", "transport": transport}
    )
    return Config(data_dir=data_dir, agent=agent)
