"""The vocabulary of a run: its input, limits, states, events and result.

A run (or turn) is one pass of the agent for one session, from input to final reply. The
runner (`agent/runner.py`) executes it; the loop (`agent/loop.py`) feeds it and stores what
it produces. Everything here is plain data.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Container, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol

from nanobot.providers.base import Message, ToolCall, Usage


class RunState(StrEnum):
    IDLE = "idle"
    PREPARING = "preparing"
    MODEL_RUNNING = "model_running"
    TOOL_RUNNING = "tool_running"
    AWAITING_HUMAN = "awaiting_human"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


FINAL_STATES = frozenset({RunState.COMPLETED, RunState.FAILED, RunState.ABORTED})
_ENDINGS = FINAL_STATES
_STOPPED = frozenset({RunState.FAILED, RunState.ABORTED})

# Which state may follow which. The runner refuses any other move (a bug, not a user error).
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.IDLE: frozenset({RunState.PREPARING}),
    # Only the model's answer completes a run; before it, and while tools run or wait for
    # a person, a run can only fail or be aborted.
    RunState.PREPARING: frozenset({RunState.MODEL_RUNNING}) | _STOPPED,
    RunState.MODEL_RUNNING: frozenset({RunState.TOOL_RUNNING, RunState.PREPARING}) | _ENDINGS,
    RunState.TOOL_RUNNING: frozenset({RunState.MODEL_RUNNING, RunState.AWAITING_HUMAN}) | _STOPPED,
    RunState.AWAITING_HUMAN: frozenset({RunState.TOOL_RUNNING}) | _STOPPED,
    RunState.COMPLETED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.ABORTED: frozenset(),
}

RunStatus = Literal["completed", "failed", "aborted"]
EventKind = Literal[
    "run_start",
    "run_end",
    "turn_start",
    "turn_end",
    "message_start",
    "message_update",
    "message_end",
    "tool_start",
    "tool_update",
    "tool_end",
    "status",
    "error",
]


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """Which tools a run may use and how.

    `allow_list` None means every registered tool. `max_parallel` > 1 runs one batch of
    calls concurrently (results still go back in the model's order).
    """

    enabled: bool = True
    allow_list: Sequence[str] | None = None
    max_parallel: int = 1
    max_calls_per_run: int = 50
    call_timeout: float | None = None


@dataclass(frozen=True, slots=True)
class LoopLimits:
    """Bounds of one run; reaching any of them ends it as `failed`, saying which."""

    max_iterations: int = 20
    max_tool_rounds: int = 20
    max_run_duration: float = 600.0
    max_overflow_retries: int = 2


@dataclass(frozen=True, slots=True)
class RunInput:
    """What a run starts from. `messages` is the full model input, system prompt first."""

    session_id: str
    messages: Sequence[Message]
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    system_prompt: str | None = None
    allowed_tools: Container[str] | None = None  # None: every tool
    policy: ToolPolicy = field(default_factory=ToolPolicy)
    limits: LoopLimits = field(default_factory=LoopLimits)


@dataclass(frozen=True, slots=True)
class RunEvent:
    """Something that happened in a run, for whoever listens (a channel editing a message).

    `call_index` counts model calls in the run; `seq` orders deltas within one call. A delta
    is identified by (run_id, call_index, seq); the runner emits each at most once.
    `taint` on a `tool_end`: the content from outside its result carries (`ToolResult.taint`).
    """

    kind: EventKind
    run_id: str
    session_id: str
    state: RunState | None = None
    call_index: int = 0
    seq: int = 0
    text: str = ""
    tool_call: ToolCall | None = None
    is_error: bool = False
    message: Message | None = None
    taint: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a run ended.

    `final_text` is what the user should read: the model's answer, or for a failed or aborted
    run a plain line saying what happened (that line is never stored as assistant history).
    `entries` are the messages the run added, in order, as they were persisted.
    """

    run_id: str
    session_id: str
    status: RunStatus
    final_text: str
    final_message: Message | None = None
    error: BaseException | None = None
    usage: Usage = field(default_factory=Usage)
    tools_used: tuple[str, ...] = ()
    entries: tuple[Message, ...] = ()


EventListener = Callable[[RunEvent], None]


def listeners(*each: EventListener | None) -> EventListener | None:
    """One listener that calls each given one in turn (None when none is given)."""
    given = [listener for listener in each if listener is not None]
    if len(given) <= 1:
        return given[0] if given else None

    def listener(event: RunEvent) -> None:
        for one in given:
            one(event)

    return listener


Persist = Callable[[Message], Awaitable[None]]
TakeMessages = Callable[[], Sequence[Message]]
Compact = Callable[[Sequence[Message]], Awaitable[Sequence[Message]]]


@dataclass(frozen=True, slots=True)
class Asking:
    """A call waits for a person's decision: `decision` resolves to None (run it) or to the
    error text to record as its result instead (denied, expired). Cancelled when the run is
    aborted or out of time; it must then withdraw the request."""

    decision: Awaitable[str | None]


Approval = str | Asking | None
"""What `approve` says of a call: None, run it; a text, refused now (recorded as its error
result instead of running it); `Asking`, wait for a person."""

Approve = Callable[[ToolCall], Awaitable[Approval]]


class OverBudget(Exception):
    """A model call was not made: it would not fit a budget. `reason` says which, for the
    user (the run's `error` when it ended for it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Spend(Protocol):
    """The budgets a run's model calls are held against (`RunHooks.spend`). `model`: the
    model the held call is to use instead of the primary one (None: the primary)."""

    model: str | None

    async def reserve(self, messages: Sequence[Message]) -> str | None:
        """Hold the expected cost of a call with `messages` against every budget that
        applies; None when it is held (the call may be made), else why not, for the user.
        Raises what the store raises."""
        ...

    async def spent(self, usage: Usage) -> None:
        """The held call was made and cost `usage`: it replaces the hold. Never raises."""
        ...

    async def release(self) -> None:
        """The held call failed or was cancelled: its hold goes. Never raises."""
        ...


@dataclass(frozen=True, slots=True)
class RunHooks:
    """How a run talks to the stateful shell around it. Every hook is optional.

    - `persist(message)`: store a new entry before the run goes on; if it raises, the run
      ends as failed (memory and storage must never diverge).
    - `steering()`: user messages queued while the run works, delivered after the current
      tool finishes (the rest of that batch is skipped).
    - `compact(messages)`: a shorter equivalent of `messages` after a context overflow. A
      `ProviderError` (its summary call failed) fails the run with that error; any other
      exception fails it as a `persist` failure does.
    - `approve(call)`: whether the call may run, is refused, or waits for a person (see
      `Approval`; the run is `awaiting_human` while it waits); asked of every call before it
      runs; must not raise.
    - `listener(event)`: called synchronously for every event; must not raise.
    - `live`: someone shows the answer while it is written (`message_update` events with its
      text go to `listener`). Only then is the model's answer streamed: unwatched, it comes
      whole, which through litellm costs under half the CPU (litellm handles every streamed
      chunk at some 250 µs).
    - `spend`: the budgets; each model call is made only once `spend.reserve` held it (a
      refusal ends the run as failed after the calls made so far, with what it has and
      the reason, its `error` an `OverBudget`).
    """

    persist: Persist | None = None
    steering: TakeMessages | None = None
    compact: Compact | None = None
    approve: Approve | None = None
    listener: EventListener | None = None
    live: bool = False
    spend: Spend | None = None
