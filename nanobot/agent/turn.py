"""The vocabulary of a turn as the agent loop's callers see it: the request, the sink its
output goes to while it runs, and the reply it ends with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nanobot.agent.approver import Caller
from nanobot.agent.run import RunEvent, RunResult
from nanobot.bus.events import ChatRef, QueueMode, Source


@dataclass(frozen=True, slots=True)
class Reply:
    """What to tell the user after a turn. `text` is None when the message tool already
    sent it. `inbound_ids` are the journal rows of the user messages this turn answered."""

    text: str | None
    result: RunResult
    inbound_ids: tuple[int, ...] = ()


class TurnSink:
    """Where a request's turns show what they do while they run, besides the reply
    `AgentLoop.handle` returns. This base shows nothing and sends nowhere: a caller
    subclasses it and overrides only what it uses. `started` and `event` must not raise;
    what `send` raises is the message tool's error, what `reply` raises ends the request
    (`handle` raises it).

    `live`: `event` shows the answer while it is written (see `RunHooks.live`); only then
    is the model's answer streamed. `sends`: `send` reaches a chat, so the message tool may
    send text mid-turn (without, it tells the model to put it in the final reply).
    """

    live: bool = False
    sends: bool = False

    def started(self) -> None:
        """The request's turn has a slot and starts; called once, before its first run."""

    def event(self, event: RunEvent) -> None:
        """An event of one of the request's runs, called synchronously as it happens."""

    async def send(self, text: str) -> None:
        """Send `text` to the chat now (the message tool); called only when `sends`."""

    async def reply(self, reply: Reply) -> None:
        """The reply of a turn before the request's last one: messages that came too late
        for a run get a turn of their own in the same call, and every turn but the last
        is answered here (the last one's reply is what `handle` returns)."""


NO_SINK = TurnSink()
NO_CHAT = ChatRef("cli", "default")  # a request from no chat (a test, a benchmark)


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """A user message for a session, the chat it belongs to, and where the turn's output
    goes (`sink`)."""

    session_key: str
    text: str
    chat: ChatRef = NO_CHAT
    sender_id: str | None = None
    sink: TurnSink = NO_SINK
    mode: QueueMode | None = None  # how to queue it if the session is busy; None: the default
    inbound_id: int | None = None  # its inbound journal row, stored with the user's entry
    images: tuple[Path, ...] = ()  # photos sent with it, shown to models that can see
    caller: Caller | None = None  # who asks for approvals; None: no call is asked about
    files: tuple[Path, ...] = ()  # files sent with it, saved under the inbox (for the ledger)
    source: Source = "chat"  # what started it: its budgets, and the usage ledger's column
