"""Subagents: background runs that the main agent starts with the `spawn` tool.

A subagent works alone on one self-contained task, in its own session (`subagent:<id>`), with
its own limits and a tool set without `spawn`, `message` or `cron`. When it ends, a note
with its outcome (its output wrapped as untrusted data) is added to the session it was started
from, and a follow-up event goes through the gate (`follow_up_event`): journaled, then a turn
there so the agent tells the user, delivered to the origin chat like any reply. A cancelled
one gets the note but no turn: the user asked for the stop. Its calls are approved like the
starting turn's, in that chat: a turn that had read content from outside passes that on
(the task it wrote may carry it), so they ask where that turn's would.

Progress is recorded as notes in the subagent's own session, next to its work: `started`,
then `ended` (state and note), `noted` (the note is in the origin session), `reported` (the
follow-up event is journaled; its turn resumes after a crash like a chat message's). After a
restart, `recover()` reports a subagent that never ended as interrupted and finishes whatever
step the restart cut short.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Container
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import Any, Literal, cast, get_args

from loguru import logger

from nanobot.agent.approver import Approver, Caller
from nanobot.agent.budget import Budgets
from nanobot.agent.persons import Persons
from nanobot.agent.run import LoopLimits, RunHooks, RunInput, RunResult
from nanobot.agent.runner import Runner
from nanobot.agent.subagent import (
    FOLLOW_UP,
    NEVER,
    PREFIX,
    STATE_WORDS,
    EveryTool,
    Origin,
    SubagentError,
    SubagentInfo,
    SubagentSettings,
    SubagentState,
    ending_note,
    follow_up_event,
    short_duration,
    state_of,
    subagent_tools,
)
from nanobot.bus.intake import EventIntake
from nanobot.providers.base import Message
from nanobot.store import NewEntry, SessionInfo, SessionStore, UsageLedger
from nanobot.tasks import TaskSet
from nanobot.tools.base import ToolContext, current_context
from nanobot.tools.taint import TurnTaint

# What others import from here: the service and the vocabulary it is used with.
__all__ = [
    "FOLLOW_UP",
    "PREFIX",
    "EveryTool",
    "Origin",
    "SubagentError",
    "SubagentInfo",
    "SubagentSettings",
    "SubagentState",
    "Subagents",
    "follow_up_event",
    "subagent_tools",
]

Event = Literal["started", "ended", "noted", "reported"]

KEEP_FINISHED = 200  # finished subagents remembered for `/tasks`
SHOWN = 10  # the newest ones `/tasks` lists

PROMPT = (
    "You are a background worker of nanobot, a personal AI assistant. The main agent gave you "
    "the task in the next message. Work on it alone with the tools you have: nobody can answer "
    "questions while you work and you cannot message the user. When you are done, reply with "
    "the result, complete and self-contained: your final reply is all the main agent sees. If "
    "you cannot finish, say what you found and what is missing.\nCurrent time: {now}."
)


class Subagents:
    """Starts, tracks, cancels and reports subagents. Owns their tasks: `stop()` cancels and
    awaits every one (a subagent cut short that way is reported as interrupted by `recover()`
    on the next start)."""

    def __init__(
        self,
        runner: Runner,
        sessions: SessionStore,
        intake: EventIntake,
        settings: SubagentSettings | None = None,
        *,
        usage: UsageLedger | None = None,
        model: str = "",
        approver: Approver | None = None,
        budgets: Budgets | None = None,
        persons: Persons | None = None,
    ) -> None:
        """`budgets`: what a task's model calls are held against, as its starter's (source
        `task`); None: none. `persons`: whom each task runs as, its starter
        (`people.isolation: person`: in their folder, their sandbox, their search); None:
        people share the workspace."""
        self._approver = approver
        self._budgets = budgets
        self._persons = persons
        self._runner = runner
        self._sessions = sessions
        self._intake = intake
        self._settings = settings or SubagentSettings()
        tools = self._settings.tools
        self._tools: Container[str] = (
            tools if isinstance(tools, EveryTool) else tuple(n for n in tools if n not in NEVER)
        )
        self._usage, self._model = usage, model
        self._infos: dict[str, SubagentInfo] = {}  # oldest change first
        self._run_ids: dict[str, str] = {}
        self._cancelled: set[str] = set()
        self._tasks = TaskSet("subagents")
        self._closed = False

    @property
    def running(self) -> int:
        return sum(1 for info in self._infos.values() if info.state == "running")

    def list(self, session_key: str) -> list[SubagentInfo]:
        """The subagents started from `session_key` that are remembered, oldest first."""
        found = [i for i in self._infos.values() if i.origin.session_key == session_key]
        return sorted(found, key=lambda info: info.started)

    def describe(self, session_key: str) -> str:
        """The answer to `/tasks`: the session's newest subagents and their states."""
        infos = self.list(session_key)[-SHOWN:]
        if not infos:
            return "No background tasks in this chat."
        now = _now()
        lines = ["Background tasks in this chat:"]
        for info in infos:
            if info.state == "running":
                when = f" for {short_duration((now - info.started).total_seconds())}"
            elif info.ended is not None and info.state != "interrupted":
                when = f" after {short_duration((info.ended - info.started).total_seconds())}"
            else:
                when = ""
            lines.append(f"• {info.id} {STATE_WORDS[info.state]}{when}: {info.summary}")
        return "\n".join(lines)

    async def spawn(self, task: str, origin: ToolContext, label: str | None = None) -> str:
        """Start `task` in the background for the conversation of `origin`; returns its id.

        Raises:
            SubagentError: too many are running, shutting down, or asked from a subagent.
            StoreError: its session could not be written (nothing was started).
        """
        limit = self._settings.max_subagents
        if self._closed:
            raise SubagentError("background tasks cannot start while nanobot shuts down")
        if origin.session_key.startswith(PREFIX):
            raise SubagentError("a background task cannot start another one")
        if limit <= 0:
            raise SubagentError("background tasks are turned off (agent.max_subagents is 0)")
        if self.running >= limit:
            raise SubagentError(
                f"{self.running} background tasks are running, the most allowed at once "
                f"(agent.max_subagents is {limit}). Wait for one to finish (its result comes to "
                "you as a note), or do this yourself now."
            )
        info = SubagentInfo(
            uuid.uuid4().hex[:8],
            task.strip(),
            Origin.of(origin),
            _now(),
            label=label or None,
            untrusted=self._inherited(origin.run_id),
        )
        self._remember(info)  # holds the slot while the session is written
        run = self._run_input(info)
        after = (
            f" (its starting turn had read {', '.join(info.untrusted)})" if info.untrusted else ""
        )
        try:
            session_id = await self._sessions.live(info.session_key)
            started = self._mark(
                "started",
                f"started: {info.summary}{after}",
                task=info.task,
                label=info.label,
                origin=asdict(info.origin),
                untrusted=list(info.untrusted),
            )
            messages = [NewEntry("message", dict(m), run.run_id) for m in run.messages]
            await self._sessions.append(session_id, [started, *messages])
        except BaseException:
            self._infos.pop(info.id, None)
            raise
        self._run_ids[info.id] = run.run_id
        self._tasks.spawn(self._work(info, session_id, run), name=f"subagent-{info.id}")
        logger.info(
            "subagent {} started from {}{}: {}", info.id, origin.session_key, after, info.summary
        )
        return info.id

    def _inherited(self, run_id: str) -> tuple[str, ...]:
        """What the run `run_id` (the one starting a subagent) has read from outside."""
        return () if self._approver is None else self._approver.taint_of(run_id).sources

    def cancel_session(self, session_key: str) -> int:
        """Stop the running subagents started from `session_key`; returns how many."""
        count = 0
        for info in self.list(session_key):
            if info.state == "running" and info.id not in self._cancelled:
                self._cancelled.add(info.id)  # in case its run has not begun yet
                self._runner.abort(self._run_ids[info.id])
                count += 1
        return count

    async def recover(self) -> None:
        """Learn the subagents of earlier runs; report those a restart interrupted, and
        finish reports a restart cut short. Call once at start, before any `spawn`."""
        for session in await self._sessions.sessions():
            if not session.key.startswith(PREFIX) or session.key[len(PREFIX) :] in self._infos:
                continue
            try:
                await self._recover(session)
            except (KeyError, TypeError, ValueError):
                logger.warning("session {} has no readable subagent record; skipped", session.key)

    async def run(self) -> None:
        """`recover()`, then keep the subagents until cancelled, then `stop()`: the shape of
        a gateway service."""
        await self.recover()
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Refuse new subagents, cancel the running ones and their reports, and wait."""
        self._closed = True
        await self._tasks.close()

    # -- one subagent ----------------------------------------------------------------------

    def _run_input(self, info: SubagentInfo) -> RunInput:
        settings = self._settings
        now = datetime.now(settings.timezone).astimezone(settings.timezone)
        prompt = PROMPT.format(now=f"{now:%Y-%m-%d %H:%M %Z}".strip())
        system: Message = {"role": "system", "content": prompt}
        return RunInput(
            session_id=info.session_key,
            messages=[system, {"role": "user", "content": info.task}],
            allowed_tools=self._tools,
            policy=settings.policy,
            limits=LoopLimits(
                max_iterations=settings.max_iterations,
                max_tool_rounds=settings.max_iterations,
                max_run_duration=settings.max_seconds,
            ),
        )

    async def _work(self, info: SubagentInfo, session_id: int, run: RunInput) -> None:
        clock = asyncio.get_running_loop().time
        begun = clock()
        result: RunResult | None = None
        try:
            result = await self._execute(info, session_id, run)
        except Exception:  # noqa: BLE001 - a task boundary: the subagent fails, nanobot goes on
            logger.exception("subagent {} crashed", info.id)
        state = state_of(result, clock() - begun, self._settings.max_seconds)
        ended = replace(info, state=state, ended=_now())
        self._remember(ended)
        self._cancelled.discard(info.id)
        self._run_ids.pop(info.id, None)
        logger.info("subagent {} {}", info.id, STATE_WORDS[state])
        note = ending_note(ended, result, self._settings.max_seconds)
        try:
            await self._sessions.append(session_id, [self._ended(state, note)])
            await self._account(info, result)
            await self._report(ended, session_id, note)
        except Exception:  # noqa: BLE001 - a task boundary
            logger.exception("could not report subagent {}; retried on the next start", info.id)

    async def _execute(self, info: SubagentInfo, session_id: int, run: RunInput) -> RunResult:
        if info.id in self._cancelled:
            return RunResult(run.run_id, run.session_id, "aborted", "Stopped.")

        async def persist(message: Message) -> None:
            await self._sessions.append(session_id, [NewEntry("message", message, run.run_id)])

        origin = info.origin
        untrusted = tuple(f"{s} in the turn that started this task" for s in info.untrusted)
        # It works as the person who started it, as their own turn would (recovered tasks
        # too: the origin, with its sender, is in the task's session).
        acting = None
        if self._persons is not None:
            acting = await self._persons.of(
                origin.channel, origin.sender_id, origin.session_key, private=origin.private
            )
        context = ToolContext(
            origin.channel,
            origin.chat_id,
            info.session_key,
            run.run_id,
            taint=TurnTaint(untrusted),  # what it writes is marked as its starter's would be
            person=acting.person if acting else None,
            root=acting.root if acting else None,
            shared=acting.shared if acting else None,
            scope=acting.scope if acting else None,
        )
        spend = None
        if self._budgets is not None:
            spend = self._budgets.for_turn(origin.sender_id, "task", origin.channel)
        hooks = RunHooks(persist=persist, spend=spend)
        if self._approver is not None:  # its calls are asked about in the chat it came from
            caller = Caller(
                origin.session_key,
                origin.chat,
                origin.sender_id,
                origin.private,
                untrusted=untrusted,
            )
            approval = self._approver.for_run(caller, run.run_id)
            hooks = RunHooks(
                persist=persist, approve=approval.approve, listener=approval.observe, spend=spend
            )
        token = current_context.set(context)
        try:
            return await self._runner.run(run, hooks)
        finally:
            current_context.reset(token)

    async def _account(self, info: SubagentInfo, result: RunResult | None) -> None:
        if self._usage is None or result is None or not result.usage.total_tokens:
            return
        await self._usage.record(
            info.origin.session_key,  # what a chat's subagents cost is what the chat cost
            result.run_id,
            model=self._model,
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
            cost=result.usage.cost,
            cached_tokens=result.usage.cached_tokens,
            priced=result.usage.priced,
            person=info.origin.sender_id,
            source="task",
        )

    async def _report(
        self, info: SubagentInfo, session_id: int, note: str, *, noted: bool = False
    ) -> None:
        """Put `note` into the origin session, then (unless cancelled) hand the follow-up to
        the gate. Raises what the store raises: the report is retried on the next start."""
        if not noted:
            origin_id = await self._sessions.live(info.origin.session_key)
            entry = NewEntry("note", {"source": f"subagent {info.id}", "text": note})
            await self._sessions.append(origin_id, [entry])
            await self._sessions.append(session_id, [self._mark("noted", "result noted")])
        if info.state == "cancelled":
            return
        await self._intake.submit(follow_up_event(info))
        await self._sessions.append(session_id, [self._mark("reported", "reported")])

    async def _recover(self, session: SessionInfo) -> None:
        first = await self._sessions.since(session.id, 0, 1)
        if not first or first[0].data.get("event") != "started":
            raise ValueError(session.key)
        start = first[0].data
        info = SubagentInfo(
            session.key[len(PREFIX) :],
            str(start["task"]),
            Origin(**start["origin"]),
            first[0].created_at,
            label=start.get("label"),
            untrusted=tuple(str(s) for s in start.get("untrusted", ())),
        )
        events = {
            e.data["event"]: e
            for e in await self._sessions.tail(session.id, 3)
            if e.kind == "note" and "event" in e.data
        }
        ended = events.get("ended")
        if ended is None:
            info = replace(info, state="interrupted", ended=_now())
            note = ending_note(info, None, self._settings.max_seconds)
            await self._sessions.append(session.id, [self._ended("interrupted", note)])
            logger.info("subagent {} was interrupted by a restart", info.id)
        else:
            state = cast(SubagentState, ended.data["state"])
            if state not in get_args(SubagentState):
                raise ValueError(state)
            info = replace(info, state=state, ended=ended.created_at)
            note = str(ended.data["note"])
        self._remember(info)
        done = "reported" in events or (info.state == "cancelled" and "noted" in events)
        if not done:
            noted = "noted" in events
            report = self._report_later(info, session.id, note, noted)
            self._tasks.spawn(report, name=f"report-{info.id}")

    async def _report_later(
        self, info: SubagentInfo, session_id: int, note: str, noted: bool
    ) -> None:
        try:
            await self._report(info, session_id, note, noted=noted)
        except Exception:  # noqa: BLE001 - a task boundary
            logger.exception("could not report subagent {}; retried on the next start", info.id)

    # -- plumbing --------------------------------------------------------------------------

    def _remember(self, info: SubagentInfo) -> None:
        self._infos.pop(info.id, None)
        self._infos[info.id] = info
        finished = [i.id for i in self._infos.values() if i.state != "running"]
        for old in finished[: max(0, len(finished) - KEEP_FINISHED)]:
            del self._infos[old]

    @staticmethod
    def _mark(event: Event, text: str, **data: Any) -> NewEntry:
        return NewEntry("note", {"source": "subagent", "event": event, "text": text, **data})

    def _ended(self, state: SubagentState, note: str) -> NewEntry:
        return self._mark("ended", STATE_WORDS[state], state=state, note=note)


def _now() -> datetime:
    return datetime.now(UTC)
