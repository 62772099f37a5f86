"""The vocabulary that crosses the bus: where a message comes from and goes to, and what it is.

Channels turn platform events into these; the agent side never sees a platform object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal, get_args

CommandName = Literal[
    "new",
    "stop",
    "status",
    "help",
    "tasks",
    "approve",
    "deny",
    "approvals",
    "voice",
    "search",
    "usage",
    "budget",
]
COMMANDS: frozenset[str] = frozenset(get_args(CommandName))

Source = Literal["chat", "cron", "heartbeat", "task"]
"""Who an inbound event comes from: a person in a chat, or nanobot itself (a cron job's run,
the heartbeat, a background task's result)."""

QueueMode = Literal["steer", "follow_up", "next_turn"]
"""How a message for a busy session joins it: steering the running turn, following up when
the turn would end, or in a turn of its own after it."""


@dataclass(frozen=True, slots=True)
class ChatRef:
    """A conversation on a platform: a chat, and within it a thread or forum topic."""

    channel: str
    chat_id: str
    thread_id: str | None = None

    @property
    def session_key(self) -> str:
        """The session this chat talks in: a thread or topic is its own session."""
        base = f"{self.channel}:{self.chat_id}"
        return f"{base}:{self.thread_id}" if self.thread_id else base

    @classmethod
    def direct(cls, channel: str, user_id: str) -> ChatRef:
        """The private chat with user `user_id` on `channel` (`@<id>`: each channel finds
        or opens it; on Telegram it is the chat with the user's own id)."""
        return cls(channel, f"{DIRECT}{user_id}")

    @property
    def direct_user(self) -> str | None:
        """The user whose private chat this is, when it was named by `direct`."""
        return self.chat_id[len(DIRECT) :] if self.chat_id.startswith(DIRECT) else None


DIRECT = "@"


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file the user sent, already saved under the workspace's inbox. `duration`: the
    seconds of a voice note, audio or video, as the platform says (None: it did not)."""

    kind: Literal["photo", "document", "voice", "audio", "video", "video_note", "file"]
    path: Path
    mime_type: str | None = None
    size: int = 0
    duration: float | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """Where a turn runs and where its answer goes.

    The turn runs in `session` when that is not the chat's own (a cron job's, the
    heartbeat's), starting it afresh first when `fresh`; a message for a busy session joins
    it as `mode` says (None: the configured default). The answer goes to `chat` unless
    `deliver` is False; an answer that is exactly `quiet` means "nothing to say" and goes
    nowhere (and is not streamed).
    """

    chat: ChatRef
    session: str | None = None
    deliver: bool = True
    quiet: str | None = None
    fresh: bool = False
    mode: QueueMode | None = None

    @property
    def session_key(self) -> str:
        return self.session or self.chat.session_key


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """Something that starts a turn: a message from a user that passed access control, or an
    event nanobot produces itself (`source`). Each producer has its constructor (`from_chat`,
    `from_press`, `from_cron`, `from_heartbeat`, `from_task`), naming only what it knows.

    `message_id` is the platform's id for it (for nanobot's own events, an id of the
    producer's that names the event, e.g. `cron:<job>:<run>`); with the channel it identifies
    the message across redeliveries. `journal_id` is its row in the inbound journal once
    stored. `route` is where its turn runs and where the answer goes. `ref` is the
    producer's own reference (a cron run), handed back with the turn's outcome.

    A button press is a message too: its `text` is the button's `data` (a chat command such
    as `/approve ID once`) and `press` the platform's id for the press, which must be
    answered (`OutboundMessage` of kind `answer` with `reply_to=press`).
    """

    route: Route
    sender_id: str
    text: str
    message_id: str
    sender_name: str | None = None
    is_private: bool = True
    addressed: bool = True  # in a group: the bot was mentioned or replied to
    attachments: tuple[Attachment, ...] = ()
    received_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    journal_id: int | None = None
    source: Source = "chat"
    ref: str | None = None
    press: str | None = None

    @classmethod
    def from_chat(
        cls,
        chat: ChatRef,
        sender_id: str,
        text: str,
        message_id: str,
        *,
        sender_name: str | None = None,
        is_private: bool = True,
        addressed: bool = True,
        attachments: tuple[Attachment, ...] = (),
        received_at: datetime | None = None,
        session: str | None = None,
        deliver: bool = True,
    ) -> InboundMessage:
        """What a person wrote in `chat`; its turn runs in the chat's session (or `session`),
        its answer goes back there (nowhere without `deliver`: `agent -m` prints it)."""
        return cls(
            Route(chat, session=session, deliver=deliver),
            sender_id,
            text,
            message_id,
            sender_name,
            is_private,
            addressed,
            attachments,
            received_at or datetime.now(UTC),
        )

    @classmethod
    def from_press(
        cls,
        chat: ChatRef,
        sender_id: str,
        data: str,
        press: str,
        *,
        message_id: str | None = None,
        sender_name: str | None = None,
        is_private: bool = True,
        received_at: datetime | None = None,
        session: str | None = None,
    ) -> InboundMessage:
        """A press of a button (its `data`) under a message in `chat`; `press` is the
        platform's id for it, and `press:<press>` its message id unless `message_id` says."""
        return cls(
            Route(chat, session=session),
            sender_id,
            data,
            message_id or f"press:{press}",
            sender_name,
            is_private,
            True,
            received_at=received_at or datetime.now(UTC),
            press=press,
        )

    @classmethod
    def from_cron(
        cls,
        chat: ChatRef,
        job_id: str,
        text: str,
        run: int,
        *,
        deliver: bool,
        maker: str | None = None,
    ) -> InboundMessage:
        """Run `run` of cron job `job_id`: a turn of its own in the job's session, after any
        running one; its answer goes to `chat` if `deliver`. The run is its `ref`. `maker`:
        the person who made the job (`channel:user_id`), its sender, whom the turn runs as
        (None: "cron", the owner)."""
        return cls(
            Route(chat, session=f"cron:{job_id}", deliver=deliver, mode="next_turn"),
            maker or "cron",
            text,
            f"cron:{job_id}:{run}",
            source="cron",
            ref=str(run),
        )

    @classmethod
    def from_heartbeat(
        cls, text: str, beat: str, *, session: str, quiet: str, deliver_to: ChatRef | None
    ) -> InboundMessage:
        """Beat `beat` asking `text`: a turn in a fresh `session`, after any running one, its
        answer delivered to `deliver_to` (nowhere when None) unless it is just `quiet`."""
        route = Route(
            deliver_to or ChatRef(session, session),
            session=session,
            deliver=deliver_to is not None,
            quiet=quiet,
            fresh=True,
            mode="next_turn",
        )
        return cls(route, session, text, f"heartbeat:{beat}", source="heartbeat")

    @classmethod
    def from_task(
        cls,
        chat: ChatRef,
        sender_id: str,
        text: str,
        task_id: str,
        *,
        session: str,
        is_private: bool,
    ) -> InboundMessage:
        """The report of background task `task_id`, started by `sender_id` in `chat` (and
        `session`): a turn of its own there, after any running one, as that person's."""
        route = Route(chat, session=session, mode="next_turn")
        return cls(route, sender_id, text, f"task:{task_id}", is_private=is_private, source="task")

    @property
    def chat(self) -> ChatRef:
        """The chat the message came from, or nanobot's own event is about."""
        return self.route.chat

    @property
    def session_key(self) -> str:
        return self.route.session_key

    @property
    def command(self) -> CommandName | None:
        """The chat command this message is (`/stop`, `/new@nanobot_bot`, ...), if any. Only a
        person types commands: nanobot's own events are never one."""
        if self.source != "chat" or not self.text.startswith("/"):
            return None
        word = self.text[1:].split(maxsplit=1)[0] if len(self.text) > 1 else ""
        name = word.split("@", 1)[0].lower()
        return name if name in COMMANDS else None  # type: ignore[return-value]


OutboundKind = Literal["reply", "progress", "notice", "card", "answer"]


@dataclass(frozen=True, slots=True)
class Button:
    """A button under a card: what it says, and the text a press sends back as a message
    (`InboundMessage.text`; at most 64 bytes, Telegram's limit)."""

    label: str
    data: str


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """Text for a chat.

    `reply` is a turn's final answer (durable: `outbox_id` is its outbox row until the
    platform confirms it); `progress` is sent now by the message tool; `notice` is a short
    system line (a command's answer, a pairing code); `card` is a message with `buttons`
    (an approval request), durable like a reply; `answer` answers a button press, shown to
    the one who pressed only (`reply_to` is the press id; best effort, never stored).
    `reply_to` is otherwise the platform message id to answer, where the platform supports
    replies.

    `edits` makes it replace an earlier message instead of being posted: the outbox row of
    that message (a card, to show how it was decided and take its buttons away). The manager
    fills in `replaces`, that message's platform id, before the channel delivers it; with
    none known (it never went out) the text is posted as a new message.

    `speak` (a reply only) asks for it spoken too: the manager fills in `voice`, the audio
    file of its spoken form, before the channel delivers it (None: nothing could be spoken,
    and the text goes alone). The channel sends the audio first, as a voice note: with the
    text as its caption where the text fits in one, else followed by the text's messages,
    the voice note counting as the first of the parts (`parts_sent`) whether or not it was
    made. A reply to be spoken is not streamed.
    """

    chat: ChatRef
    text: str
    kind: OutboundKind = "reply"
    reply_to: str | None = None
    outbox_id: int | None = None
    stream_id: str | None = None
    parts_sent: int = 0  # leading parts already on the platform (a restart mid-reply)
    buttons: tuple[Button, ...] = ()
    edits: int | None = None
    replaces: str | None = None
    speak: bool = False
    voice: Path | None = None


@dataclass(frozen=True, slots=True)
class StreamUpdate:
    """The text of a reply so far, for channels that show replies as they are written.

    `stream_id` ties updates to the final `OutboundMessage` with the same id. Best effort:
    never stored, and a channel may skip updates (it edits at most about once a second).
    """

    chat: ChatRef
    stream_id: str
    text: str
    reply_to: str | None = None


@dataclass(frozen=True, slots=True)
class Typing:
    """A turn started (`active`) or ended in `chat`: channels show a typing indicator."""

    chat: ChatRef
    active: bool


Outbound = OutboundMessage | StreamUpdate | Typing


SKIPPED_FOR_BUDGET: Final = "skipped_for_budget"
"""A `TurnOutcome.status`: a cron or heartbeat turn that made no call, over a budget."""


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """How the turn for an inbound event ended, for the producer that asked for it.

    `status` is the run's (`completed`, `failed`, `aborted`, ...; `error` when the turn
    could not run at all); `text` its answer; `error` the failure, where there is one;
    `delivered` whether an answer was queued for the event's chat (queued only: whether the
    platform took it is the outbox's to know, and a cron run's record learns it from there).
    """

    status: str
    text: str | None = None
    error: BaseException | None = None
    delivered: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "completed"
