"""The tool calls of one run: which tools it may use, whether a call may run (the tool
policy, its per-run limit, the approval hook) and running it within its timeout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol, TypeVar

from nanobot.agent.run import Approve, Asking, EventKind, RunInput, RunState
from nanobot.providers.base import ToolCall
from nanobot.tools.base import ToolResult
from nanobot.tools.registry import ToolRegistry

T = TypeVar("T")


class Run(Protocol):
    """What the tool calls need of the run that makes them."""

    def move(self, state: RunState) -> None:
        """Enter `state`. Raises RuntimeError when the run may not (it has ended)."""
        ...

    async def race(self, work: Awaitable[T]) -> T:
        """Await `work` unless the run is aborted or out of time first (then cancel it and
        raise the run's own interruption)."""
        ...

    def emit(self, kind: EventKind, **fields: Any) -> None:
        """Tell the run's listener of an event."""
        ...


class ToolCalls:
    """The calls one run makes. `used` names the tools that ran, in order; `started` holds
    the ids of calls whose tool began running (one cut short may have run partly)."""

    def __init__(
        self, tools: ToolRegistry, run_input: RunInput, approve: Approve | None, run: Run
    ) -> None:
        self._tools, self._input, self._approve, self._run = tools, run_input, approve, run
        self._policy = run_input.policy
        self._count = 0
        self.used: list[str] = []
        self.started: set[str] = set()

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools the run may use, as the model's next call is offered them (an MCP
        server's come and go while a run goes on)."""
        if not self._policy.enabled:
            return []
        return self._tools.schemas([n for n in self._tools.names if self._allowed(n)])

    def _allowed(self, name: str) -> bool:
        policy, wanted = self._policy, self._input.allowed_tools
        return (
            policy.enabled
            and (policy.allow_list is None or name in policy.allow_list)
            and (wanted is None or name in wanted)
        )

    async def one(self, call: ToolCall) -> ToolResult:
        """Run `call` once it may (its result instead when it may not), within the run's
        race."""
        denial = await self._approval(call)
        if denial is not None:
            return denial
        return await self._run.race(self._execute(call))

    async def parallel(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Ask about each of `calls` in turn, then run those that may together (at most
        `max_parallel` at once); their results in the model's order."""
        limit = asyncio.Semaphore(self._policy.max_parallel)
        approved = [await self._approval(call) for call in calls]

        async def one(call: ToolCall, denial: ToolResult | None) -> ToolResult:
            if denial is not None:
                return denial
            async with limit:
                return await self._execute(call)

        return list(
            await asyncio.gather(*(one(c, d) for c, d in zip(calls, approved, strict=True)))
        )

    async def _approval(self, call: ToolCall) -> ToolResult | None:
        """An error result when the call may not run; None when it may."""
        if not self._allowed(call.name):
            return ToolResult(f"Error: the tool {call.name!r} is not available here.", True)
        policy = self._policy
        if self._count >= policy.max_calls_per_run:
            limit = policy.max_calls_per_run
            return ToolResult(f"Error: this turn reached its limit of {limit} tool calls.", True)
        self._count += 1
        if self._approve is None:
            return None
        verdict = await self._approve(call)
        if isinstance(verdict, Asking):
            decision = asyncio.ensure_future(verdict.decision)
            try:
                self._run.move(RunState.AWAITING_HUMAN)
            except RuntimeError:  # the wait is never begun: it must not be left behind
                decision.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await decision
                raise
            verdict = await self._run.race(decision)
            self._run.move(RunState.TOOL_RUNNING)
        return None if verdict is None else ToolResult(verdict, is_error=True)

    async def _execute(self, call: ToolCall) -> ToolResult:
        self.started.add(call.id)
        self._run.emit("tool_start", tool_call=call)
        try:
            arguments = call.parsed_arguments()
        except ValueError as exc:
            result = ToolResult(f"Error: invalid arguments for {call.name}: {exc}", True)
        else:
            result = await self._with_timeout(call, self._tools.execute(call.name, arguments))
        self.used.append(call.name)
        self._run.emit(
            "tool_end",
            tool_call=call,
            text=result.content,
            is_error=result.is_error,
            taint=result.taint,
        )
        return result

    async def _with_timeout(self, call: ToolCall, work: Awaitable[ToolResult]) -> ToolResult:
        timeout = self._policy.call_timeout
        if timeout is None:
            return await work
        try:
            async with asyncio.timeout(timeout):
                return await work
        except TimeoutError:
            return ToolResult(f"Error: {call.name} timed out after {timeout:g} seconds.", True)
