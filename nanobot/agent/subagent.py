"""One subagent: what it is (its origin, its states, its settings), and what is said when it
ends (the note for the session it was started from, and the follow-up event that makes the agent
tell the user). Values and pure functions; `subagents.py` runs them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Literal

from nanobot.agent.run import RunResult, ToolPolicy
from nanobot.bus.events import ChatRef, InboundMessage
from nanobot.errors import NanobotError
from nanobot.providers.base import Message
from nanobot.tools.base import ToolContext, untrusted

SubagentState = Literal["running", "completed", "failed", "timed_out", "cancelled", "interrupted"]

PREFIX = "subagent:"
NEVER = frozenset({"spawn", "message", "cron"})  # no forking, no talking to the user
RESULT_CHARS = 8_000  # of a subagent's output in the note; the rest stays in its session
SUMMARY_CHARS = 60

FOLLOW_UP = (
    "[system: a background task you started has ended; its note is just above. Tell the user "
    "what came of it.]"
)
STATE_WORDS: dict[SubagentState, str] = {
    "running": "running",
    "completed": "completed",
    "failed": "failed",
    "timed_out": "timed out",
    "cancelled": "cancelled",
    "interrupted": "interrupted by a restart",
}


class SubagentError(NanobotError):
    """A subagent cannot start now; the message says why, for the model."""


@dataclass(frozen=True, slots=True)
class Origin:
    """The conversation a subagent was started from, where its result goes."""

    session_key: str
    channel: str
    chat_id: str
    thread_id: str | None = None
    sender_id: str | None = None  # who asked for it: who approves its calls in a private chat
    private: bool = True

    @classmethod
    def of(cls, context: ToolContext) -> Origin:
        return cls(
            context.session_key,
            context.channel,
            context.chat_id,
            context.thread_id,
            context.sender_id,
            context.private,
        )

    @property
    def chat(self) -> ChatRef:
        return ChatRef(self.channel, self.chat_id, self.thread_id)


@dataclass(frozen=True, slots=True)
class SubagentInfo:
    """One subagent as `/tasks` shows it. `ended` is None while it runs. `untrusted` is what
    the turn that started it had read from outside (its task may carry it): its own calls
    count it as theirs, so they ask as that turn's would."""

    id: str
    task: str
    origin: Origin
    started: datetime
    state: SubagentState = "running"
    label: str | None = None
    ended: datetime | None = None
    untrusted: tuple[str, ...] = ()

    @property
    def session_key(self) -> str:
        return PREFIX + self.id

    @property
    def summary(self) -> str:
        lines = self.task.strip().splitlines()
        text = self.label or (lines[0] if lines else "")
        return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


@dataclass(frozen=True, slots=True)
class SubagentSettings:
    """Limits of subagents. `tools` are the names they may use (see `subagent_tools`, or
    `EveryTool`)."""

    max_subagents: int = 4
    max_iterations: int = 15
    max_seconds: float = 300.0
    tools: Sequence[str] | EveryTool = ()
    policy: ToolPolicy = field(default_factory=ToolPolicy)
    timezone: tzinfo | None = None


@dataclass(frozen=True, slots=True)
class EveryTool:
    """The tools a subagent may use, asked one name at a time: every tool there is at that
    moment (an MCP server's too, as servers come and go) but spawn, message and cron; exec
    only when `exec`."""

    exec: bool = False

    def __contains__(self, name: object) -> bool:
        return name not in NEVER and (self.exec or name != "exec")


def subagent_tools(names: Iterable[str], *, allow_exec: bool) -> tuple[str, ...]:
    """The tools among `names` a subagent may use: never spawn, message or cron (it would
    reach the user on its own); exec only if allowed."""
    return tuple(n for n in names if n not in NEVER and (allow_exec or n != "exec"))


def follow_up_event(info: SubagentInfo) -> InboundMessage:
    """The event that makes the agent tell the user about `info`, which has ended (its note
    is in the origin session): a turn of its own there, after any running one, as the turn
    of the person who started the task (its calls that ask go to them, in that chat; "" when
    not known: then only configured approvers can decide)."""
    origin = info.origin
    # One follow-up per subagent (its id names it), even when a restart repeats it.
    return InboundMessage.from_task(
        origin.chat,
        origin.sender_id or "",
        FOLLOW_UP,
        info.id,
        session=origin.session_key,
        is_private=origin.private,
    )


def state_of(result: RunResult | None, elapsed: float, limit: float) -> SubagentState:
    if result is None:
        return "failed"
    if result.status == "completed":
        return "completed"
    if result.status == "aborted":
        return "cancelled"
    # The runner ends a run that ran out of time as failed, without an error.
    return "timed_out" if result.error is None and elapsed >= limit else "failed"


def ending_note(info: SubagentInfo, result: RunResult | None, limit: float) -> str:
    """The note for the origin session: our own words, then the subagent's, as data."""
    head = f"Background task {info.id} ({info.summary})"
    source = f"subagent {info.id}"
    match info.state:
        case "completed":
            assert result is not None
            return f"{head} finished. Its result:\n{untrusted(source, _cut(result.final_text))}"
        case "cancelled":
            return f"{head} was cancelled by the user."
        case "interrupted":
            return f"{head} was interrupted by a restart before it finished; it was not run again."
        case "timed_out":
            text = (
                f"{head} ran out of time: it was stopped at its limit of {short_duration(limit)}."
            )
        case _:
            reason = result.final_text if result is not None else "it crashed (see the log)"
            text = f"{head} failed: {reason}"
    last = _last_words(result.entries if result is not None else ())
    if last:
        text += f"\nIts last message before it stopped:\n{untrusted(source, _cut(last))}"
    return text


def _last_words(entries: Sequence[Message]) -> str:
    for message in reversed(entries):
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, str) and content.strip():
            return content
    return ""


def _cut(text: str) -> str:
    if len(text) <= RESULT_CHARS:
        return text
    left = len(text) - RESULT_CHARS
    return f"{text[:RESULT_CHARS]}\n[... {left} more characters are kept in its session]"


def short_duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"
