"""One benchmark context: a stack, its fake, and the three ways of making the same call."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import httpx

from bench._common import BenchError
from bench._turns.fake import Fake
from bench._turns.scenario import MESSAGE, TOOL_MESSAGE, TOOL_REPLY
from bench._turns.stack import INSTANT_TOOL_CALL, Stack
from bench._turns.timing import Timing, timed
from nanobot.agent.turn import NO_SINK, Reply, TurnRequest, TurnSink
from nanobot.providers.base import Message, ToolSchema
from nanobot.providers.litellm_provider import _litellm


@dataclass(frozen=True)
class Request:
    """What one model call was given."""

    messages: list[Message]
    tools: list[ToolSchema]

    @property
    def size(self) -> int:
        return len(json.dumps(self.messages))


class Bench:
    """A stack and its fake, and the three ways of making the same model call."""

    def __init__(
        self,
        stack: Stack,
        fake: Fake,
        label: str,
        instant: Stack | None = None,
        variants: dict[str, Bench] | None = None,
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

    def _kwargs(self, request: Request, streamed: bool) -> dict[str, Any]:
        """Exactly what LiteLLMTransport passes to litellm.acompletion."""
        agent = self.stack.config.agent
        kwargs: dict[str, Any] = {
            "model": agent.model,
            "messages": list(request.messages),
            "max_tokens": agent.max_tokens,
            "temperature": agent.temperature,
            "max_retries": 0,
            "api_key": "sk-bench",
            "api_base": self.fake.base_url,
        }
        if streamed:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
            kwargs["timeout"] = agent.request_timeout
        else:
            kwargs["timeout"] = httpx.Timeout(agent.request_timeout, read=agent.max_turn_seconds)
        if request.tools:
            kwargs["tools"] = list(request.tools)
        return kwargs

    async def bare_call(self, request: Request, *, streamed: bool = True) -> None:
        """The model call litellm makes for a turn: streamed, as for a turn someone watches
        being written (a chat's), or asked for whole."""
        answer = await self.litellm.acompletion(**self._kwargs(request, streamed))
        if streamed:
            async for _ in answer:
                pass

    async def bare(
        self, request: Request, tool_call: bool = False, *, streamed: bool = True
    ) -> Timing:
        """Layer 1. `tool_call`: the fake answers with the tool call, as in the turn."""
        if tool_call:
            await self.fake.script(TOOL_REPLY)
        timing, _ = await timed(self.bare_call(request, streamed=streamed))
        return timing

    async def provider(self, request: Request, tool_call: bool = False) -> Timing:
        """Layer 2, streamed as in a watched turn."""
        if tool_call:
            await self.fake.script(TOOL_REPLY)
        inner = self.stack.provider.inner
        call = inner.complete(request.messages, request.tools, on_delta=_unseen)
        timing, _ = await timed(call)
        return timing

    async def turn(
        self,
        key: str,
        *,
        tool_call: bool = False,
        stack: Stack | None = None,
        watched: bool = True,
    ) -> tuple[Timing, list[Request]]:
        """Layer 3: one turn in session `key`; returns its timing and its model calls.

        `watched`: someone is shown the answer while it is written, as in a chat (the model
        streams); otherwise it is asked for whole, as for `agent -m`."""
        stack = stack or self.stack
        if tool_call and stack.provider.instant:
            stack.provider.scripted.append(INSTANT_TOOL_CALL)
        elif tool_call:
            await self.fake.script(TOOL_REPLY)
        calls = stack.provider.calls
        before = len(calls)
        text = TOOL_MESSAGE if tool_call else MESSAGE
        request = TurnRequest(key, text, sink=_Unseen() if watched else NO_SINK)
        timing, reply = await timed(stack.loop.handle(request))
        made = [Request(m, t) for m, t in calls[before:]]
        del calls[:]
        check_reply(reply, text, tool_call)
        return timing, made


def _unseen(_: object) -> None:
    """A listener that shows the answer to nobody (it costs nothing to compare with)."""


class _Unseen(TurnSink):
    """A turn watched as in a chat (the model streams), its answer shown to nobody."""

    live = True

    def event(self, event: object) -> None:
        _unseen(event)


class DirectBench(Bench):
    """A stack calling the model directly (`agent.transport: auto` with this model, as with
    `direct`): its "bare" call is the provider's own (`Provider.complete` over the
    `DirectTransport`), as there is no litellm below it to call instead."""

    async def bare_call(self, request: Request, *, streamed: bool = True) -> None:
        on_delta = _unseen if streamed else None
        await self.stack.provider.inner.complete(request.messages, request.tools, on_delta=on_delta)


def check_reply(reply: Reply | None, text: str, tool_call: bool) -> None:
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
