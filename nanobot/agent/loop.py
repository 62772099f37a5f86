"""The agent loop: the stateful shell around the runner.

Per session it keeps a lane (`nanobot.lanes.Lanes`): turns of one session run strictly one
after another, in the caller's task, while different sessions run concurrently (up to
`max_concurrent_turns`). A message for a session whose turn is running or waiting for a slot
is queued for that turn (steering by default, or follow-up; the queues are the loop's own).
Each turn stores the user's message before the model is called and every other entry as it
happens.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Literal

from nanobot.agent.approver import Approver, Caller
from nanobot.agent.compaction import Compactor, shrink_tool_results
from nanobot.agent.context import HEARTBEAT_FILE, ContextBuilder, user_message
from nanobot.agent.history import History, Window, repair, summary_message
from nanobot.agent.images import has_images, inline_images, with_images, without_images
from nanobot.agent.run import (
    EventListener,
    LoopLimits,
    RunHooks,
    RunInput,
    RunResult,
    ToolPolicy,
    listeners,
)
from nanobot.agent.runner import Runner
from nanobot.agent.taint import Ledger, earlier, in_prompt, message_texts
from nanobot.bus.events import QueueMode
from nanobot.lanes import Lanes
from nanobot.providers.base import LLMProvider, Message
from nanobot.store import NewEntry, SessionStore, UsageLedger
from nanobot.tools.base import SendText, ToolContext, current_context, wrapped_sources
from nanobot.tools.taint import TurnTaint, cut
from nanobot.workspace import Workspace

Delivery = Literal["one", "all"]
MARGIN = 1024  # tokens kept free for the envelope and the provider's own framing
FILL_CACHE_SIZE = 1024


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """A user message for a session, and where the turn's output goes."""

    session_key: str
    text: str
    channel: str = "cli"
    chat_id: str = "default"
    sender_id: str | None = None
    send: SendText | None = None
    listener: EventListener | None = None
    live: bool = False  # `listener` shows the answer as it is written (see RunHooks.live)
    mode: QueueMode | None = None  # how to queue it if the session is busy; None: the default
    inbound_id: int | None = None  # its inbound journal row, stored with the user's entry
    images: tuple[Path, ...] = ()  # photos sent with it, shown to models that can see
    on_reply: ReplySink | None = None  # replies of further turns this call runs (see handle)
    on_start: Callable[[], None] | None = None  # called once its turn has a slot and starts
    thread_id: str | None = None  # the thread or topic of the chat, where there is one
    caller: Caller | None = None  # who asks for approvals; None: no call is asked about
    files: tuple[Path, ...] = ()  # files sent with it, saved under the inbox (for the ledger)


@dataclass(frozen=True, slots=True)
class Reply:
    """What to tell the user after a turn. `text` is None when the message tool already
    sent it. `inbound_ids` are the journal rows of the user messages this turn answered."""

    text: str | None
    result: RunResult
    inbound_ids: tuple[int, ...] = ()


ReplySink = Callable[[Reply], Awaitable[None]]


@dataclass
class _Queued:
    """A session's messages for its running turn, and that turn's bookkeeping."""

    run_id: str | None = None
    steering: deque[Message] = field(default_factory=deque)
    follow_up: deque[Message] = field(default_factory=deque)
    next_turn: deque[Message] = field(default_factory=deque)  # each waits for a turn of its own
    inbound: dict[int, int] = field(default_factory=dict)  # id(message) -> journal row
    answered: list[int] = field(default_factory=list)

    @property
    def waiting(self) -> bool:
        return bool(self.steering or self.follow_up or self.next_turn)

    def queue(self, message: Message, mode: QueueMode, inbound_id: int | None) -> None:
        queues = {"steer": self.steering, "follow_up": self.follow_up, "next_turn": self.next_turn}
        queues[mode].append(message)
        if inbound_id is not None:
            self.inbound[id(message)] = inbound_id

    def entry(self, message: Message, run_id: str | None = None) -> NewEntry:
        """The entry for a user message, linked to its journal row if it has one."""
        inbound_id = self.inbound.pop(id(message), None)
        if inbound_id is not None:
            self.answered.append(inbound_id)
        return NewEntry("message", message, run_id, inbound_id)


@dataclass(frozen=True, slots=True)
class LoopSettings:
    max_tokens: int = 4096
    max_concurrent_turns: int = 1000
    limits: LoopLimits = field(default_factory=LoopLimits)
    policy: ToolPolicy = field(default_factory=ToolPolicy)
    queue_mode: QueueMode = "steer"
    steering_delivery: Delivery = "one"
    follow_up_delivery: Delivery = "one"
    timezone: tzinfo | None = None


class AgentLoop:
    """Answers user messages in sessions."""

    def __init__(
        self,
        provider: LLMProvider,
        runner: Runner,
        sessions: SessionStore,
        context: ContextBuilder,
        settings: LoopSettings | None = None,
        *,
        usage: UsageLedger | None = None,
        approver: Approver | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        """`ledger`: the taint ledger; with it, files sent in a chat are recorded with their
        sender, and prompt files it marks are shown as data and taint every turn."""
        self._provider = provider
        self._ledger = ledger
        self.approver = approver
        self._runner = runner
        self._sessions = sessions
        self._context = context
        self._settings = settings or LoopSettings()
        self._history = History(sessions, provider.count_tokens)
        self._compactor = Compactor(provider, sessions, self._history)
        self._lanes: Lanes[str] = Lanes(limit=self._settings.max_concurrent_turns, name="turn")
        self._queued: dict[str, _Queued] = {}  # sessions whose turn runs or waits
        self._prompt_tokens: tuple[str, int] = ("", 0)
        # Counts are upper bounds until a window the bounds call full needs exact ones.
        self._exact_counts = False
        self._usage = usage
        self._fill: OrderedDict[str, int] = OrderedDict()  # session key -> input tokens

    def busy(self, session_key: str) -> bool:
        return self._lanes.busy(session_key)

    def abort(self, session_key: str) -> bool:
        """Stop the running turn of `session_key`; False when none is running."""
        lane = self._queued.get(session_key)
        if lane is None or lane.run_id is None:
            return False
        lane.steering.clear()
        lane.follow_up.clear()
        return self._runner.abort(lane.run_id)

    async def new_session(self, session_key: str) -> None:
        """Start afresh: the next message opens a new session; the old one stays stored."""
        await self._sessions.archive(session_key)

    async def handle(self, request: TurnRequest) -> Reply | None:
        """Answer `request`; None when it was queued into the session's running turn.

        Messages queued too late for the running turn get a turn of their own right after,
        in this call: the replies of such further turns go to `request.on_reply` and the
        last reply is returned.

        Raises:
            StoreError: the session could not be read or the user's message not stored.
        """
        key = request.session_key
        if request.files and self._ledger is not None:
            where = f"{request.channel} chat {request.chat_id}"
            await self._ledger.received(request.files, where, request.sender_id or "?", key)
        lane = self._queued.setdefault(key, _Queued())
        message = user_message(request.text, self._now())
        if request.images and self._provider.supports_vision():
            message = with_images(message, request.images)
        if self._lanes.busy(key):
            lane.queue(message, request.mode or self._settings.queue_mode, request.inbound_id)
            return None
        if request.inbound_id is not None:
            lane.inbound[id(message)] = request.inbound_id
        # Idle, checked with no await since: `run` starts at once, in this task, and the
        # session is busy until it ends (its turns wait for a slot inside it).
        try:
            return await self._lanes.run(key, self._turns(lane, request, [message]))
        finally:
            self._settle(key, lane)

    async def resume(self, request: TurnRequest) -> Reply | None:
        """Finish the turn of a message that reached its session before a restart.

        Nothing new is stored for the user; the turn goes on from the stored history (a tool
        call that never got its result is answered "interrupted", not run again). If the
        turn had already finished, its answer is returned without calling the model.
        """
        key = request.session_key
        lane = self._queued.setdefault(key, _Queued())
        if self._lanes.busy(key):
            raise RuntimeError(f"cannot resume {key} while it is busy")
        if request.inbound_id is not None:
            lane.answered.append(request.inbound_id)
        try:
            return await self._lanes.run(key, self._turns(lane, request, []))
        finally:
            self._settle(key, lane)

    def _settle(self, session_key: str, lane: _Queued) -> None:
        """The session's turns ended (or never began): forget its queue unless it holds
        messages still."""
        lane.run_id = None
        if not lane.waiting:
            self._queued.pop(session_key, None)

    async def _turns(self, lane: _Queued, request: TurnRequest, inputs: Sequence[Message]) -> Reply:
        if request.on_start is not None:
            request.on_start()
        reply = await self._turn(lane, request, inputs)
        while lane.waiting:  # arrived after the run's last look, or wants a turn
            if request.on_reply is not None:
                await request.on_reply(reply)
            # What waits now gets a turn after the answer that was just delivered: steering
            # that came too late to steer, follow-ups (one at a time or all, as configured),
            # and what asked for a turn of its own.
            follow_ups = _take(lane.follow_up, self._settings.follow_up_delivery)
            queued = [*lane.steering, *follow_ups, *lane.next_turn]
            lane.steering.clear()
            lane.next_turn.clear()
            reply = await self._turn(lane, request, queued)
        return reply

    async def _turn(self, lane: _Queued, request: TurnRequest, inputs: Sequence[Message]) -> Reply:
        session_id = await self._sessions.live(request.session_key)
        if inputs:
            await self._sessions.append(session_id, [lane.entry(m) for m in inputs])
        else:
            finished = await self._finished_answer(session_id)
            if finished is not None:
                return self._reply(lane, finished, finished.final_text)
            await self._record_interrupted(session_id)
        system, untrusted = await self._system_prompt(request)
        budget = self._history_budget(system)
        window = await self._history.load(session_id, budget)
        if self._compactor.full(window, budget) and await self._counting_exactly():
            budget = self._history_budget(system)  # the bounds said full: count exactly
            window = await self._history.load(session_id, budget)
        # What this turn's own messages bring wrapped (a task's report waiting in the queue)
        # is named as itself; what the rest of the history still holds, as earlier.
        brought = [s for text in message_texts(inputs) for s in wrapped_sources(text)]
        untrusted = (*untrusted, *(cut(s) for s in dict.fromkeys(brought)))
        texts = (window.summary or "", *message_texts(window.messages))
        if (history := earlier(texts, besides=brought)) is not None:
            untrusted = (*untrusted, cut(f"earlier in this conversation: {history}"))
        head: list[Message] = [{"role": "system", "content": system}]
        if window.summary:
            head.append(summary_message(window.summary))
        run = RunInput(
            session_id=request.session_key,
            messages=[*head, *await _show_images(window.messages, inputs, self._context.files)],
            limits=self._settings.limits,
            policy=self._settings.policy,
        )
        lane.run_id = run.run_id
        context = ToolContext(
            request.channel,
            request.chat_id,
            request.session_key,
            run.run_id,
            request.sender_id,
            request.send,
            thread_id=request.thread_id,
            private=request.caller.private if request.caller else True,
            taint=TurnTaint(untrusted),
        )
        caller = replace(request.caller, untrusted=untrusted) if request.caller else None
        token = current_context.set(context)
        try:
            result = await self._runner.run(
                run, self._hooks(lane, replace(request, caller=caller), session_id, run, window)
            )
        finally:
            current_context.reset(token)
        await self._account(request.session_key, result, window.tokens)
        if self._compactor.worth_it(session_id, window, budget):
            await self._compactor.compact(session_id, window, budget)
        already_sent = result.status == "completed" and result.final_text in context.sent
        return self._reply(lane, result, None if already_sent else result.final_text)

    async def _system_prompt(self, request: TurnRequest) -> tuple[str, tuple[str, ...]]:
        """The system prompt, and what the turn starts out having read from outside: what
        its caller brought (a file sent with the message) and the prompt, memory and skill
        files the ledger marks (one lookup).

        Raises:
            StoreError: the ledger could not be read.
        """
        now = self._now()
        tainted: dict[str, str] = {}
        if self._ledger is not None:
            tainted = await self._ledger.prompt_taint(
                (*self._context.prompt_paths(now), self._context.heartbeat_file),
                under=[self._context.skills_dir],
            )
        brought = list(request.caller.untrusted if request.caller else ())
        # HEARTBEAT.md is no part of the prompt: an unattended turn (the heartbeat's, or a
        # cron job's, which cannot be told apart here) may have been handed it.
        beat = tainted.pop(HEARTBEAT_FILE, None)
        if beat is not None and request.caller is not None and request.caller.unattended:
            brought.append(cut(f"{HEARTBEAT_FILE}, {beat}"))
        return self._context.system_prompt(now, tainted), (*brought, *in_prompt(tainted))

    async def _account(self, session_key: str, result: RunResult, window_tokens: int) -> None:
        self._fill[session_key] = window_tokens + self._prompt_tokens[1]
        self._fill.move_to_end(session_key)
        if len(self._fill) > FILL_CACHE_SIZE:
            self._fill.popitem(last=False)
        if self._usage is not None and result.usage.total_tokens:
            await self._usage.record(
                session_key,
                result.run_id,
                model=self._provider.model,
                prompt_tokens=result.usage.prompt_tokens,
                completion_tokens=result.usage.completion_tokens,
                cost=result.usage.cost,
            )

    async def status(self, session_key: str) -> str:
        """A few lines for `/status`: model, tokens used, context fill, state."""
        lines = [f"Model: {self._provider.model}"]
        if self._usage is not None:
            totals = await self._usage.totals(session_key)
            cost = f", about ${totals.cost:.4f}" if totals.cost else ""
            lines.append(
                f"Tokens used in this chat: {totals.tokens:,} in {totals.runs} turns{cost}"
            )
        window = self._provider.context_window()
        fill = self._fill.get(session_key)
        if fill is not None:
            most = "" if self._exact_counts else "at most "
            share = f"{100 * fill / window:.0f}%"
            lines.append(f"Context: {most}{fill:,} of {window:,} tokens ({share})")
        else:
            lines.append(f"Context window: {window:,} tokens")
        lines.append("State: working on a reply" if self.busy(session_key) else "State: idle")
        return "\n".join(lines)

    def _reply(self, lane: _Queued, result: RunResult, text: str | None) -> Reply:
        answered, lane.answered = tuple(lane.answered), []
        return Reply(text, result, answered)

    async def _record_interrupted(self, session_id: int) -> None:
        """Store a result for every tool call a restart left without one."""
        recent = [e.data for e in await self._sessions.tail(session_id, 50) if e.kind == "message"]
        repaired = repair(recent)
        # Only calls at the very end are ours to settle: the crash interrupted the last turn.
        if repaired[: len(recent)] == recent and len(repaired) > len(recent):
            restarted = self.approver.restarted if self.approver is not None else {}
            missing = [
                {**m, "content": restarted[m["tool_call_id"]]}
                if m.get("tool_call_id") in restarted
                else m
                for m in repaired[len(recent) :]
            ]
            await self._sessions.append(session_id, [NewEntry("message", m) for m in missing])

    async def _finished_answer(self, session_id: int) -> RunResult | None:
        """The stored final answer if the session's last turn completed, else None."""
        last = await self._sessions.tail(session_id, 1)
        if not last or last[0].kind != "message":
            return None
        message = last[0].data
        if message.get("role") != "assistant" or message.get("tool_calls"):
            return None
        text = str(message.get("content") or "")
        run_id = last[0].run_id or ""
        return RunResult(run_id, "", "completed", text, final_message=message)

    def _hooks(
        self, lane: _Queued, request: TurnRequest, session_id: int, run: RunInput, window: Window
    ) -> RunHooks:
        async def persist(message: Message) -> None:
            entry = lane.entry(message, run.run_id) if message.get("role") == "user" else None
            entry = entry or NewEntry("message", message, run.run_id)
            await self._sessions.append(session_id, [entry])

        compacted = False
        turn_start = len(run.messages) - len(window.messages) + _last_user(window.messages)

        async def compact(messages: Sequence[Message]) -> Sequence[Message]:
            nonlocal compacted
            current = list(messages[turn_start:])
            summary = (
                None
                if compacted
                else await self._compactor.compact_for_overflow(session_id, window)
            )
            compacted = True
            if summary is not None:
                return [messages[0], summary_message(summary), *current]
            return [*messages[:turn_start], *shrink_tool_results(current)]

        listener, approve = request.listener, None
        if self.approver is not None and request.caller is not None:
            approval = self.approver.for_run(request.caller, run.run_id)
            listener, approve = listeners(listener, approval.observe), approval.approve
        return RunHooks(
            persist=persist,
            steering=lambda: _take(lane.steering, self._settings.steering_delivery),
            compact=compact,
            approve=approve,
            listener=listener,
            live=request.live,
        )

    async def _counting_exactly(self) -> bool:
        """Load the tokenizer (in a thread); whether the counts were bounds until now, and
        every one remembered is dropped."""
        loaded = await asyncio.to_thread(self._provider.load_tokenizer)
        self._exact_counts = True
        if not loaded:
            return False
        self._history.forget()
        self._prompt_tokens = ("", 0)
        return True

    def _history_budget(self, system: str) -> int:
        if self._prompt_tokens[0] != system:
            counted = self._provider.count_tokens([{"role": "system", "content": system}])
            self._prompt_tokens = (system, counted)
        window = self._provider.context_window()
        return max(1, window - self._settings.max_tokens - MARGIN - self._prompt_tokens[1])

    def _now(self) -> datetime:
        return datetime.now(self._settings.timezone).astimezone(self._settings.timezone)


async def _show_images(
    messages: Sequence[Message], inputs: Sequence[Message], workspace: Workspace
) -> list[Message]:
    """The window with this turn's own images inline (older ones stay placeholders), read
    confined to `workspace`."""
    shown = list(messages)
    pending = [m for m in inputs if has_images(m)]
    for index in range(len(shown) - 1, -1, -1):
        if not pending:
            break
        if shown[index].get("role") == "user" and shown[index] == without_images(pending[-1]):
            shown[index] = await inline_images(pending.pop(), workspace)
    return shown


def _take(queue: deque[Message], delivery: Delivery) -> list[Message]:
    if delivery == "all":
        taken = list(queue)
        queue.clear()
        return taken
    return [queue.popleft()] if queue else []


def _last_user(messages: Sequence[Message]) -> int:
    # From the end: the window may hold hundreds of messages, the last user message is near it.
    return next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), 0
    )
