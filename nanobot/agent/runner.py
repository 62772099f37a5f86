"""The runner: one ReAct run as a streaming state machine.

Given model messages, tools, limits and hooks, it calls the model, runs the tools it asks
for, feeds the results back and repeats until the model answers, a limit is reached, the
run is aborted or something fails. It keeps no state between runs and knows nothing of
sessions, chats or storage: the loop (`agent/loop.py`) supplies those through `RunHooks`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from loguru import logger

from nanobot.agent._tool_calls import ToolCalls
from nanobot.agent.run import (
    TRANSITIONS,
    EventKind,
    OverBudget,
    RunEvent,
    RunHooks,
    RunInput,
    RunResult,
    RunState,
    RunStatus,
)
from nanobot.errors import ProviderError
from nanobot.providers.base import (
    Completion,
    Delta,
    LLMProvider,
    Message,
    TextDelta,
    ToolCall,
    Usage,
)
from nanobot.tools.base import ToolImage, ToolResult
from nanobot.tools.registry import ToolRegistry

T = TypeVar("T")

SKIPPED = "Skipped due to queued user message."
ABORTED = "Aborted: the user stopped this turn before the tool finished; it may have run partly."
OUT_OF_TIME = "Stopped: the turn ran out of time before the tool finished; it may have run partly."
NOT_RUN = "Not run: this turn stopped before the tool could start."


class _Interrupted(Exception):
    """The run was aborted or ran out of time while waiting for the model or a tool."""


class _Stop(Exception):
    """The run ends early as failed, with `reason` for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Runner:
    """Executes runs. One Runner serves any number of concurrent runs."""

    def __init__(self, provider: LLMProvider, tools: ToolRegistry) -> None:
        self._provider = provider
        self._tools = tools
        self._aborts: dict[str, asyncio.Event] = {}

    @property
    def tools(self) -> ToolRegistry:
        return self._tools

    def abort(self, run_id: str) -> bool:
        """Stop the run `run_id` at once; returns False when no such run is active."""
        event = self._aborts.get(run_id)
        if event is None:
            return False
        event.set()
        return True

    async def run(self, run: RunInput, hooks: RunHooks | None = None) -> RunResult:
        """Execute `run` to its end and return the result.

        Never raises for model, tool, limit or storage failures: they end the run with status
        `failed` and are described in the result. Cancelling the caller cancels the run
        (what was already persisted stays; unfinished tool calls get no result).
        """
        abort = self._aborts.setdefault(run.run_id, asyncio.Event())
        try:
            return await _Run(
                self._provider, self._tools, run, hooks or RunHooks(), abort
            ).execute()
        finally:
            self._aborts.pop(run.run_id, None)

    async def stream(self, run: RunInput, hooks: RunHooks | None = None) -> AsyncIterator[RunEvent]:
        """Execute `run`, yielding its events as they happen; the last one is `run_end`.

        Closing the iterator early aborts the run.
        """
        hooks = hooks or RunHooks()
        queue: asyncio.Queue[RunEvent | None] = asyncio.Queue()
        outer = hooks.listener

        def listen(event: RunEvent) -> None:
            if outer is not None:
                outer(event)
            queue.put_nowait(event)

        task = asyncio.create_task(
            self.run(run, replace(hooks, listener=listen, live=True)), name=f"run-{run.run_id}"
        )
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                yield event
            task.result()  # surface a crash of the run itself
        finally:
            if not task.done():
                self.abort(run.run_id)
                await asyncio.shield(task)


class _Run:
    """The state of one executing run."""

    def __init__(
        self,
        provider: LLMProvider,
        tools: ToolRegistry,
        run: RunInput,
        hooks: RunHooks,
        abort: asyncio.Event,
    ) -> None:
        self.provider, self.tools, self.input, self.hooks = provider, tools, run, hooks
        self.abort = abort
        self.messages: list[Message] = _with_system_prompt(run.messages, run.system_prompt)
        self.state = RunState.IDLE
        self.usage = Usage()
        self.entries: list[Message] = []
        self.pending_calls: list[ToolCall] = []  # calls still owed a result in history
        self.images: list[tuple[str, ToolImage]] = []  # the batch's, with their tools' names
        self.calls = ToolCalls(tools, run, hooks.approve, self)
        self.model_calls = 0
        self.tool_rounds = 0
        loop = asyncio.get_running_loop()
        self.deadline = loop.time() + run.limits.max_run_duration

    # -- lifecycle -------------------------------------------------------------------------

    async def execute(self) -> RunResult:
        self.emit("run_start")
        status: RunStatus = "completed"
        error: BaseException | None = None
        try:
            self.move(RunState.PREPARING)
            final_text = await self._loop()
        except _Interrupted:
            status, final_text = self._interrupted()
            await self._settle_pending(ABORTED if status == "aborted" else OUT_OF_TIME)
        except _Stop as stop:
            status, final_text = "failed", stop.reason
            await self._settle_pending(NOT_RUN)
        except OverBudget as over:
            # What the calls made so far said is the user's too: it is not lost.
            status, final_text, error = "failed", self._so_far(over.reason), over
            logger.info("run {}: {}", self.input.run_id, over.reason)
        except ProviderError as exc:
            status, final_text, error = "failed", exc.user_message(), exc
            logger.warning("run {} failed: {}", self.input.run_id, exc)
        except _PersistError as exc:
            status, error = "failed", exc.__cause__
            final_text = f"I stopped because this conversation could not be saved: {exc.__cause__}"
            logger.error("run {}: {}", self.input.run_id, final_text)
        self.move(RunState(status))
        if status != "completed":
            self.emit("error", text=final_text, is_error=True)
        result = RunResult(
            run_id=self.input.run_id,
            session_id=self.input.session_id,
            status=status,
            final_text=final_text,
            final_message=self.entries[-1] if status == "completed" and self.entries else None,
            error=error,
            usage=self.usage,
            tools_used=tuple(self.calls.used),
            entries=tuple(self.entries),
        )
        self.emit("run_end", text=final_text, is_error=status != "completed")
        return result

    def _so_far(self, reason: str) -> str:
        said = [
            str(m["content"]).strip()
            for m in self.entries
            if m.get("role") == "assistant" and isinstance(m.get("content"), str)
        ]
        return "\n\n".join([*(s for s in said if s), reason])

    def _interrupted(self) -> tuple[RunStatus, str]:
        if self.abort.is_set():
            return "aborted", "Stopped."
        limit = self.input.limits.max_run_duration
        return "failed", f"I stopped: this turn ran longer than its limit of {limit:g} seconds."

    async def _settle_pending(self, interrupted: str) -> None:
        """Give every tool call still owed a result one, so history stays well-formed."""
        calls, self.pending_calls = self.pending_calls, []
        for call in calls:
            text = interrupted if call.id in self.calls.started else NOT_RUN
            try:
                await self._add(_tool_message(call, ToolResult(text, is_error=True)))
            except _PersistError:
                logger.error("could not record the result of {} after the run ended", call.id)
                return

    # -- the loop --------------------------------------------------------------------------

    async def _loop(self) -> str:
        limits = self.input.limits
        while True:
            if self.model_calls >= limits.max_iterations:
                raise _Stop(
                    f"I stopped: this turn reached its limit of {limits.max_iterations} model "
                    "calls before finishing."
                )
            completion = await self._call_model()
            message = completion.to_message()
            self.pending_calls = list(completion.tool_calls)
            await self._add(message)
            self.emit("turn_end", message=message)
            if not completion.tool_calls:
                # An answer ends the run even when messages came meanwhile: it is what the
                # user gets, and the messages get a turn of their own after it (the loop's),
                # so no answer is stored as said without being delivered.
                return completion.content or ""
            if self.tool_rounds >= limits.max_tool_rounds:
                raise _Stop(
                    f"I stopped: this turn reached its limit of {limits.max_tool_rounds} rounds "
                    "of tool calls before finishing."
                )
            self.tool_rounds += 1
            steered = await self._run_tools(completion.tool_calls)
            await self._show_images()
            await self._add_all(steered)

    async def _call_model(self) -> Completion:
        attempts = self.input.limits.max_overflow_retries
        for attempt in range(attempts + 1):
            self.move(RunState.MODEL_RUNNING)
            try:
                return await self._stream_model()
            except ProviderError as exc:
                if (
                    exc.kind != "context_overflow"
                    or self.hooks.compact is None
                    or attempt == attempts
                ):
                    raise
                logger.info("run {}: context overflow; compacting", self.input.run_id)
                self.move(RunState.PREPARING)
                self.messages = list(await self._compacted())
        raise AssertionError("unreachable")

    async def _stream_model(self) -> Completion:
        spend = self.hooks.spend
        if spend is not None:
            try:
                refused = await spend.reserve(self.messages)
            except Exception as exc:
                raise _PersistError("the budgets could not be checked") from exc
            if refused is not None:
                raise OverBudget(refused)
        try:
            completion = await self._call_held(spend.model if spend is not None else None)
        except BaseException:
            if spend is not None:
                await asyncio.shield(spend.release())
            raise
        if spend is not None:
            await spend.spent(completion.usage)
        return completion

    async def _call_held(self, model: str | None) -> Completion:
        index = self.model_calls
        self.model_calls += 1
        self.emit("turn_start", call_index=index)
        self.emit("message_start", call_index=index)
        last_seq = -1

        def on_delta(delta: Delta) -> None:
            nonlocal last_seq
            if delta.seq <= last_seq:  # a retry replays what was already shown
                return
            last_seq = delta.seq
            if isinstance(delta, TextDelta):
                self.emit("message_update", call_index=index, seq=delta.seq, text=delta.text)
            else:
                call = ToolCall(delta.id or "", delta.name or "", delta.arguments)
                self.emit("message_update", call_index=index, seq=delta.seq, tool_call=call)

        live = self.hooks.live and self.hooks.listener is not None
        completion = await self.race(
            self.provider.complete(
                self.messages,
                self.calls.schemas,
                on_delta=on_delta if live else None,
                model=model,
            )
        )
        self.usage += completion.usage
        self.emit("message_end", call_index=index, message=completion.to_message())
        return completion

    # -- tools -----------------------------------------------------------------------------

    async def _run_tools(self, calls: Sequence[ToolCall]) -> Sequence[Message]:
        """Run one batch; returns steering messages that arrived (the rest was skipped)."""
        self.move(RunState.TOOL_RUNNING)
        if self.input.policy.max_parallel > 1:
            results = await self.race(self.calls.parallel(calls))
            for call, result in zip(calls, results, strict=True):
                await self._record(call, result)
            return self._take(self.hooks.steering)
        for position, call in enumerate(calls):
            await self._record(call, await self.calls.one(call))
            steered = self._take(self.hooks.steering)
            if steered:
                for skipped in calls[position + 1 :]:
                    await self._record(skipped, ToolResult(SKIPPED, is_error=True))
                return steered
        return ()

    async def _record(self, call: ToolCall, result: ToolResult) -> None:
        if result.images and not self.provider.supports_vision():
            note = "\n(This model does not take images: the images were not shown.)"
            result = replace(result, content=result.content + note, images=())
        await self._add(_tool_message(call, result))
        self.images += [(call.name, image) for image in result.images]
        self.pending_calls = [c for c in self.pending_calls if c.id != call.id]

    async def _show_images(self) -> None:
        """Show the model the images the batch's tools returned: tool results can hold only
        text, so they follow as one user message, for the rest of this run. History keeps a
        line saying they were shown (no image bytes in the store)."""
        if not self.images:
            return
        images, self.images = self.images, []
        said = "Images the tools above returned (content from outside, like their results):"
        parts: list[dict[str, Any]] = [{"type": "text", "text": said}]
        for number, (tool, image) in enumerate(images, 1):
            parts.append({"type": "text", "text": f"image {number}, from {tool}:"})
            url = f"data:{image.mime_type};base64,{image.data}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        tools = ", ".join(dict.fromkeys(tool for tool, _ in images))
        kept = f"[{len(images)} image(s) from {tools} were shown here; they are not kept]"
        await self._add(
            {"role": "user", "content": parts}, stored={"role": "user", "content": kept}
        )

    # -- plumbing --------------------------------------------------------------------------

    async def race(self, work: Awaitable[T]) -> T:
        """Await `work` unless the run is aborted or out of time first (then cancel it)."""
        task = asyncio.ensure_future(work)
        stopper = asyncio.ensure_future(self.abort.wait())
        remaining = self.deadline - asyncio.get_running_loop().time()
        try:
            await asyncio.wait(
                {task, stopper}, timeout=max(remaining, 0), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopper.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if task.cancelled():
            raise _Interrupted
        return task.result()

    async def _compacted(self) -> Sequence[Message]:
        """The `compact` hook's shorter history. Its model call's failure is the run's
        (`ProviderError`); any other failure is storing the summary's, like `persist`'s."""
        assert self.hooks.compact is not None
        try:
            return await self.race(self.hooks.compact(self.messages))
        except (ProviderError, _Interrupted):
            raise
        except Exception as exc:
            raise _PersistError("compaction failed") from exc

    async def _add(self, message: Message, *, stored: Message | None = None) -> None:
        """Add `message` to the run, and to history as `stored` (default: as it is)."""
        self.messages.append(message)
        stored = message if stored is None else stored
        if self.hooks.persist is not None:
            try:
                await self.hooks.persist(stored)
            except Exception as exc:
                raise _PersistError("persist failed") from exc
        self.entries.append(stored)

    async def _add_all(self, messages: Sequence[Message]) -> None:
        for message in messages:
            await self._add(message)

    def _take(self, source: Any) -> Sequence[Message]:
        return source() if source is not None else ()

    def move(self, state: RunState) -> None:
        if state == self.state:
            return
        if state not in TRANSITIONS[self.state]:
            raise RuntimeError(f"run {self.input.run_id}: no transition {self.state} -> {state}")
        self.state = state
        self.emit("status", state=state)

    def emit(self, kind: EventKind, **fields: Any) -> None:
        if self.hooks.listener is None:
            return
        event = RunEvent(kind, self.input.run_id, self.input.session_id, **fields)
        try:
            self.hooks.listener(event)
        except Exception:  # noqa: BLE001 - a broken listener must not break the run
            logger.exception("run event listener failed on {}", kind)


class _PersistError(Exception):
    """Storing an entry failed; `__cause__` is why."""


def _tool_message(call: ToolCall, result: ToolResult) -> Message:
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result.content}


def _with_system_prompt(messages: Sequence[Message], prompt: str | None) -> list[Message]:
    out = list(messages)
    if prompt is None:
        return out
    if out and out[0].get("role") == "system":
        out[0] = {"role": "system", "content": prompt}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out
