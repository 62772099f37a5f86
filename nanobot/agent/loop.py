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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, tzinfo

from loguru import logger

from nanobot.agent._approval_words import waiting_text
from nanobot.agent._lane import Delivery, Queued, take
from nanobot.agent._resumption import finished_answer, record_interrupted
from nanobot.agent.approver import Approver
from nanobot.agent.budget import UNATTENDED, Budgets, TurnSpend
from nanobot.agent.compaction import Compactor, shrink_tool_results
from nanobot.agent.context import HEARTBEAT_FILE, ContextBuilder, user_message
from nanobot.agent.history import History, Window, summary_message
from nanobot.agent.images import has_images, inline_images, with_images, without_images
from nanobot.agent.persons import Acting, Persons
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
from nanobot.agent.turn import Reply, TurnRequest
from nanobot.bus.events import QueueMode
from nanobot.lanes import Lanes
from nanobot.providers.base import LLMProvider, Message
from nanobot.store import NewEntry, SessionStore, UsageLedger
from nanobot.tools.base import ToolContext, current_context, wrapped_sources
from nanobot.tools.taint import TurnTaint, cut
from nanobot.workspace import Workspace

MARGIN = 1024  # tokens kept free for the envelope and the provider's own framing
FILL_CACHE_SIZE = 1024


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
        budgets: Budgets | None = None,
        persons: Persons | None = None,
    ) -> None:
        """`ledger`: the taint ledger; with it, files sent in a chat are recorded with their
        sender, and prompt files it marks are shown as data and taint every turn. `persons`:
        whom each turn runs as (`people.isolation`); without, every turn works in the whole
        workspace with `context`. `budgets`: the caps every model call of a turn is held
        against (None: none)."""
        self.budgets = budgets
        self._persons = persons
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
        self._queued: dict[str, Queued] = {}  # sessions whose turn runs or waits
        self._prompt_tokens: tuple[str, int] = ("", 0)
        # Counts are upper bounds until a window the bounds call full needs exact ones.
        self._exact_counts = False
        self._usage = usage
        self._fill: OrderedDict[str, int] = OrderedDict()  # session key -> input tokens
        self._heard: OrderedDict[str, tuple[int, str]] = OrderedDict()  # notes, by whom

    @property
    def usage(self) -> UsageLedger | None:
        """The usage ledger turns are recorded in (None: they are not)."""
        return self._usage

    @property
    def model(self) -> str:
        return self._provider.model

    def now(self) -> datetime:
        """Now, in the configured time zone."""
        return self._now()

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
        in this call: the replies of such further turns go to `request.sink` and the last
        reply is returned.

        Raises:
            StoreError: the session could not be read or the user's message not stored.
        """
        key = request.session_key
        if request.files and self._ledger is not None:
            where = f"{request.chat.channel} chat {request.chat.chat_id}"
            await self._ledger.received(request.files, where, request.sender_id or "?", key)
        lane = self._queued.setdefault(key, Queued())
        message = user_message(request.text, self._now())
        if request.images and self._provider.supports_vision():
            message = with_images(message, request.images)
        sender = _sender(request)
        if self._lanes.busy(key):
            mode = request.mode or self._settings.queue_mode
            lane.queue(message, mode, request.inbound_id, sender)
            await self._tell_if_waiting(request)
            return None
        lane.mark(message, request.inbound_id, sender)
        # Idle, checked with no await since: `run` starts at once, in this task, and the
        # session is busy until it ends (its turns wait for a slot inside it).
        try:
            return await self._lanes.run(key, self._turns(lane, request, [message]))
        finally:
            self._settle(key, lane)

    async def _tell_if_waiting(self, request: TurnRequest) -> None:
        """Say at once that a message queued behind a run waiting for an approval is read
        only once the card is decided (else it would get no word for up to the approval's
        timeout). Never raises: the message is queued whatever becomes of this notice."""
        asking = self.approver.waiting_in(request.session_key) if self.approver else None
        if asking is None or not request.sink.sends:
            return
        try:
            await request.sink.send(waiting_text(asking, self._now()))
        except Exception as exc:  # noqa: BLE001 - a notice lost costs only the notice
            logger.warning("could not say that a message waits for an approval: {}", exc)

    async def resume(self, request: TurnRequest) -> Reply | None:
        """Finish the turn of a message that reached its session before a restart.

        Nothing new is stored for the user; the turn goes on from the stored history (a tool
        call that never got its result is answered "interrupted", not run again). If the
        turn had already finished, its answer is returned without calling the model.
        """
        key = request.session_key
        lane = self._queued.setdefault(key, Queued())
        if self._lanes.busy(key):
            raise RuntimeError(f"cannot resume {key} while it is busy")
        if request.inbound_id is not None:
            lane.answered.append(request.inbound_id)
        try:
            return await self._lanes.run(key, self._turns(lane, request, []))
        finally:
            self._settle(key, lane)

    def _settle(self, session_key: str, lane: Queued) -> None:
        """The session's turns ended (or never began): forget its queue unless it holds
        messages still."""
        lane.run_id = None
        if not lane.waiting:
            self._queued.pop(session_key, None)

    async def _turns(self, lane: Queued, request: TurnRequest, inputs: Sequence[Message]) -> Reply:
        request.sink.started()
        reply = await self._turn(lane, request, inputs)
        while lane.waiting:  # arrived after the run's last look, or wants a turn
            await request.sink.reply(reply)
            # What waits now gets a turn after the answer that was just delivered.
            queued = lane.after_turn(self._settings.follow_up_delivery)
            reply = await self._turn(lane, request, queued)
        return reply

    async def _turn(self, lane: Queued, request: TurnRequest, inputs: Sequence[Message]) -> Reply:
        session_id = await self._sessions.live(request.session_key)
        if inputs:
            await self._sessions.append(session_id, [lane.entry(m) for m in inputs])
        else:
            finished = await finished_answer(self._sessions, session_id)
            if finished is not None:
                return self._reply(lane, finished, finished.final_text)
            restarted = self.approver.restarted if self.approver is not None else {}
            await record_interrupted(self._sessions, session_id, restarted)
        acting = await self._acting(request)
        system, untrusted = await self._system_prompt(request, acting)
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
        sink = request.sink
        context = ToolContext(
            request.chat.channel,
            request.chat.chat_id,
            request.session_key,
            run.run_id,
            request.sender_id,
            sink.send if sink.sends else None,
            thread_id=request.chat.thread_id,
            private=request.caller.private if request.caller else True,
            taint=TurnTaint(untrusted),
            person=acting.person,
            root=acting.root,
            shared=acting.shared,
            scope=acting.scope,
        )
        caller = replace(request.caller, untrusted=untrusted) if request.caller else None
        token = current_context.set(context)
        spend = self._spend(request)
        hooks = self._hooks(lane, replace(request, caller=caller), session_id, run, window)
        try:
            result = await self._runner.run(run, replace(hooks, spend=spend))
        finally:
            current_context.reset(token)
        await self._account(request, result, window.tokens, spend)
        if self._compactor.worth_it(session_id, window, budget):
            await self._compactor.compact(session_id, window, budget)
        already_sent = result.status == "completed" and result.final_text in context.sent
        # A run is aborted only by /stop (Ctrl-C at the terminal), whose answer says
        # "Stopped." already: the stopped turn's own "Stopped." would say it twice.
        said = already_sent or result.status == "aborted"
        text = None if said else result.final_text
        if spend is not None and spend.notes:  # a budget's warning, once per period
            text = "\n\n".join([*([text] if text else []), *spend.notes])
        return self._reply(lane, result, text)

    def _spend(self, request: TurnRequest) -> TurnSpend | None:
        if self.budgets is None:
            return None
        return self.budgets.for_turn(request.sender_id, request.source, request.chat.channel)

    async def _acting(self, request: TurnRequest) -> Acting:
        """Whom the turn of `request` runs as (everyone alike without `persons`)."""
        private = request.caller.private if request.caller else True
        return await self.acting_as(
            request.chat.channel, request.sender_id, request.session_key, private=private
        )

    async def acting_as(
        self, channel: str, user_id: str | None, session_key: str, *, private: bool
    ) -> Acting:
        """Whom a turn of `user_id` in `session_key` runs as (`Persons.of`); everyone alike
        without `persons`.

        Raises:
            StoreError: the store failed.
        """
        if self._persons is None:
            return Acting(None, self._context)
        return await self._persons.of(channel, user_id, session_key, private=private)

    async def _system_prompt(
        self, request: TurnRequest, acting: Acting
    ) -> tuple[str, tuple[str, ...]]:
        """The system prompt, and what the turn starts out having read from outside: what
        its caller brought (a file sent with the message) and the prompt, memory and skill
        files the ledger marks (one lookup).

        Raises:
            StoreError: the ledger could not be read.
        """
        now = self._now()
        tainted: dict[str, str] = {}
        context = acting.context
        if self._ledger is not None:
            marked = await self._ledger.prompt_taint(
                (*context.prompt_paths(now), context.heartbeat_file),
                under=[context.skills_dir],
            )
            tainted = {acting.key(path): source for path, source in marked.items()}
        brought = list(request.caller.untrusted if request.caller else ())
        # HEARTBEAT.md is no part of the prompt: an unattended turn (the heartbeat's, or a
        # cron job's, which cannot be told apart here) may have been handed it.
        beat = tainted.pop(HEARTBEAT_FILE, None)
        if beat is not None and request.caller is not None and request.caller.unattended:
            brought.append(cut(f"{HEARTBEAT_FILE}, {beat}"))
        return context.system_prompt(now, tainted), (*brought, *in_prompt(tainted))

    async def _account(
        self,
        request: TurnRequest,
        result: RunResult,
        window_tokens: int,
        spend: TurnSpend | None = None,
    ) -> None:
        session_key = request.session_key
        self._fill[session_key] = window_tokens + self._prompt_tokens[1]
        self._fill.move_to_end(session_key)
        if len(self._fill) > FILL_CACHE_SIZE:
            self._fill.popitem(last=False)
        if self._usage is not None and result.usage.total_tokens:
            await self._usage.record(
                session_key,
                result.run_id,
                model=(spend.model if spend is not None else None) or self._provider.model,
                prompt_tokens=result.usage.prompt_tokens,
                completion_tokens=result.usage.completion_tokens,
                cost=result.usage.cost,
                cached_tokens=result.usage.cached_tokens,
                priced=result.usage.priced,
                person=request.sender_id if request.source not in UNATTENDED else None,
                source=request.source,
            )

    def heard(self, session_key: str, count: int, model: str) -> None:
        """Note for `/status` that `count` voice notes of `session_key` were transcribed by
        `model` (kept since start, for the most recent chats)."""
        before = self._heard.pop(session_key, (0, model))[0]
        self._heard[session_key] = (before + count, model)
        if len(self._heard) > FILL_CACHE_SIZE:
            self._heard.popitem(last=False)

    async def status(self, session_key: str) -> str:
        """A few lines for `/status`: model, tokens used, context fill, state, and the MCP
        servers' tools the model has now (when any are configured)."""
        lines = [f"Model: {self._provider.model}"]
        if self._usage is not None:
            totals = await self._usage.totals(session_key)
            cost = f", about ${totals.cost:.4f}" if totals.cost else ""
            lines.append(
                f"Tokens used in this chat: {totals.tokens:,} in {totals.runs} "
                f"turn{'' if totals.runs == 1 else 's'}{cost}"
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
        if (heard := self._heard.get(session_key)) is not None:
            count, model = heard
            notes = "voice note" if count == 1 else "voice notes"
            lines.append(f"Transcribed here since the start: {count} {notes}, by {model}")
        servers = self._runner.tools.from_source
        if servers is not None:
            lines.append(_mcp_line(servers))
        return "\n".join(lines)

    def _reply(self, lane: Queued, result: RunResult, text: str | None) -> Reply:
        answered, lane.answered = tuple(lane.answered), []
        return Reply(text, result, answered)

    def _hooks(
        self, lane: Queued, request: TurnRequest, session_id: int, run: RunInput, window: Window
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

        listener: EventListener | None = request.sink.event
        approve = None
        if self.approver is not None and request.caller is not None:
            approval = self.approver.for_run(request.caller, run.run_id)
            listener, approve = listeners(listener, approval.observe), approval.approve
        return RunHooks(
            persist=persist,
            steering=lambda: take(lane.steering, self._settings.steering_delivery),
            compact=compact,
            approve=approve,
            listener=listener,
            live=request.sink.live,
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


def _mcp_line(names: Sequence[str], most: int = 200) -> str:
    if not names:
        return "MCP tools: none now (see `nanobot mcp list`)"
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"MCP tools ({len(names)}): {', '.join(names[:most])}{more}"


def _last_user(messages: Sequence[Message]) -> int:
    # From the end: the window may hold hundreds of messages, the last user message is near it.
    return next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), 0
    )


def _sender(request: TurnRequest) -> str | None:
    """Who sent `request`'s message, as its entry names them: their platform id
    (`telegram:123`; a cron job's maker is one already), None when nobody did."""
    user = request.sender_id
    if not user:
        return None
    return user if ":" in user else f"{request.chat.channel}:{user}"
