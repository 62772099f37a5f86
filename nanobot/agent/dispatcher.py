"""The dispatcher: from the inbound bus to answered, journaled, delivered replies.

The only caller of the agent loop. Every inbound event, a person's message or one nanobot
produced itself (a cron run, the heartbeat, a background task's result), gets its own task
(owned here): chat commands are answered at once, everything else becomes a turn in the
event's session, whose lanes keep one session's turns in order while different sessions run
side by side. A turn's reply is written to the outbox in the same transaction that marks
its events answered, then published for delivery to the event's chat (if it has one to
tell); the producer of an event that asked for it (cron) is told how the turn ended. On
start, `recover()` re-publishes undelivered replies and finishes turns a crash interrupted,
whatever produced them. A turn a store failure cut short leaves its message unanswered; with
`held`, it is answered once the store takes writes again (`nanobot.agent.held`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from typing import Protocol

from loguru import logger

from nanobot.agent.approver import Caller
from nanobot.agent.held import Held
from nanobot.agent.loop import AgentLoop, Reply, TurnRequest
from nanobot.agent.run import EventListener, RunEvent, RunState, listeners
from nanobot.agent.subagents import Subagents
from nanobot.bus.events import (
    ChatRef,
    InboundMessage,
    OutboundMessage,
    Source,
    StreamUpdate,
    TurnOutcome,
    Typing,
)
from nanobot.bus.queue import MessageBus
from nanobot.bus.records import inbound_from, outbound_from, outbound_record
from nanobot.errors import StoreError
from nanobot.store import Journal
from nanobot.tasks import TaskSet

HELP = (
    "I'm nanobot, your assistant. Just write to me. Commands:\n"
    "/new - start a fresh conversation (the old one is kept)\n"
    "/stop - stop what I'm doing, background tasks included\n"
    "/tasks - background tasks in this chat and their state\n"
    "/status - model, tokens used, context fill and state\n"
    "/approvals - what waits for your approval, and the saved rules\n"
    "/approve ID [once|chat|always], /deny ID - decide on a request (the card's buttons do it)\n"
    "/help - this message"
)
UNTRUSTED_SOURCES: Mapping[Source, str] = {"task": "a subagent's result"}


FAILED = "Sorry, something went wrong on my side and I could not answer that."
HELD = (
    "I can't save anything right now (a storage problem on my side), so I can't answer yet; "
    "I'll answer this as soon as I can."
)
EMPTY_ANSWER = "(The model returned an empty answer. Ask again, or rephrase.)"
_INVISIBLE = re.compile(
    r"```[^\n`]*\n?\s*```"  # a code block with nothing in it
    r"|!\[[^\]]*\]\([^)]*\)"  # an image link: no image is sent, and its text is not shown
    r"|<!--.*?-->",  # a comment
    re.DOTALL,
)


STREAM_INTERVAL = 0.5  # seconds between two stream updates of one reply


class _StreamIds:
    """The stream id of each run a request starts. The first run's is `base`, so a reply
    resumed after a restart finishes the message its stream began; later runs (messages
    that waited for a turn of their own) get ids of their own, so each of their answers is
    a message of its own instead of an edit of the one before."""

    def __init__(self, base: str) -> None:
        self._base = base
        self._ids: dict[str, str] = {}

    def of(self, run_id: str) -> str:
        if run_id not in self._ids:
            self._ids[run_id] = f"{self._base}-{len(self._ids)}" if self._ids else self._base
        return self._ids[run_id]


def _streamer(
    bus: MessageBus,
    chat: ChatRef,
    reply_to: str | None,
    streams: _StreamIds | str,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> EventListener:
    """A run listener that publishes the reply's text so far (under each run's stream id).

    The first update goes out once the answer has been arriving for STREAM_INTERVAL, later
    ones at most every STREAM_INTERVAL: an answer that streams in faster than that reaches
    the chat whole, as one message instead of a message and an edit (half the platform
    calls, and no half-written message flashing by).
    """
    parts: list[str] = []
    last: float | None = None  # when text last went out, or first arrived
    ids = _StreamIds(streams) if isinstance(streams, str) else streams

    def on_event(event: RunEvent) -> None:
        nonlocal last
        if event.kind == "message_start":
            parts.clear()
        elif event.kind == "message_update" and event.text:
            parts.append(event.text)
            now = clock()
            if last is None:
                last = now
            elif now - last >= STREAM_INTERVAL:
                last = now
                stream_id = ids.of(event.run_id)
                bus.offer(StreamUpdate(chat, stream_id, "".join(parts), reply_to))

    return on_event


class OutcomeSink(Protocol):
    """A producer that wants to know how the turns of its events ended (cron records its
    runs). Told once per event, in the process that finished the turn."""

    async def finished(self, message: InboundMessage, outcome: TurnOutcome) -> None:
        """`message`'s turn ended as `outcome` says. Must not raise."""
        ...


class _TypingSignal:
    """A turn's "typing…" in its chat: on while the turn works, off while it waits for a
    person to approve a call (nothing is being written then), off when it ends."""

    def __init__(self, bus: MessageBus, chat: ChatRef) -> None:
        self._bus, self._chat = bus, chat
        self._started = self._on = False

    def start(self) -> None:
        self._started = True
        self._switch(on=True)

    def stop(self) -> None:
        self._started = False
        self._switch(on=False)

    def __call__(self, event: RunEvent) -> None:
        if event.kind == "status" and self._started:
            self._switch(on=event.state != RunState.AWAITING_HUMAN)

    def _switch(self, *, on: bool) -> None:
        if on != self._on and (self._bus.offer(Typing(self._chat, active=on)) or not on):
            self._on = on


class Dispatcher:
    """Consumes the inbound bus until it is closed: the only caller of the agent loop."""

    def __init__(
        self,
        loop: AgentLoop,
        bus: MessageBus,
        journal: Journal,
        *,
        subagents: Subagents | None = None,
        outcomes: Mapping[Source, OutcomeSink] | None = None,
        whole_replies: Collection[str] = (),
        held: Held | None = None,
    ) -> None:
        """`whole_replies`: channels whose replies arrive whole instead of being shown while
        the model writes them (`channels.<name>.stream: false`). `held`: where messages
        whose turn a store failure cut short wait for the store (none: they wait for the
        next start)."""
        self._loop = loop
        self._bus = bus
        self._journal = journal
        self._subagents = subagents
        self._outcomes = dict(outcomes or {})
        self._whole_replies = frozenset(whole_replies)
        self._awaited: dict[int, InboundMessage] = {}  # journal row -> event told when answered
        self._tasks = TaskSet("dispatcher")
        self._held = held
        self._retrying = TaskSet("dispatcher-held")

    async def run(self) -> None:
        """Dispatch inbound messages until the bus's inbound side is closed, then wait for
        the turns still running. Cancelling it cancels them."""
        if self._held is not None:
            self._retrying.spawn(self._retry(self._held), name="dispatcher-held")
        try:
            async for message in self._bus.inbound():
                self._tasks.spawn(self._process(message), name=f"inbound-{message.journal_id}")
        except BaseException:
            await self._tasks.close()
            raise
        finally:
            await self._retrying.close()  # what is still held waits for the next start
        await self._tasks.close(grace=None)

    @property
    def running(self) -> int:
        return len(self._tasks)

    def take(self, message: InboundMessage, *, resume: bool = False) -> None:
        """Answer `message`, taken from the journal rather than the bus (in a cluster, by
        this member; `resume`: its turn was interrupted elsewhere, finish it)."""
        kind = "resume" if resume else "inbound"
        self._tasks.spawn(
            self._process(message, resume=resume), name=f"{kind}-{message.journal_id}"
        )

    def drop_all(self) -> None:
        """Cancel every turn under way, and forget the messages held for the store's return,
        as a crash would: their messages stay pending, and whoever answers them next resumes
        them (in a cluster, the member that takes their sessions once this one has lost
        touch with the store; answering the held ones here too answered them twice)."""
        for task in self._tasks:
            task.cancel()
        if self._held is not None:
            self._held.drop()

    async def recover(self, channels: Collection[str]) -> None:
        """Publish undelivered replies; finish turns a crash or restart interrupted.

        Only what can be answered here is taken up: replies and messages of `channels` (the
        ones running), and nanobot's own events that deliver nowhere. The rest waits for a
        process that runs their channel (the terminal's, for one)."""
        for item in await self._journal.pending_outbox():
            if item.channel in channels:
                await self._bus.publish(outbound_from(item.message, item.id, item.parts_sent))
        pending = await self._journal.pending_inbound()
        reached = await self._journal.reached_session([p.id for p in pending])
        for row in pending:
            message = inbound_from(row.message, row.id)
            if row.channel not in channels and (message.deliver or message.source == "chat"):
                continue
            logger.info("recovering {} message {} after a restart", row.channel, message.message_id)
            self.take(message, resume=row.id in reached)

    async def _process(self, message: InboundMessage, *, resume: bool = False) -> None:
        if message.journal_id is not None and message.source in self._outcomes:
            self._awaited[message.journal_id] = message
        try:
            if message.command is not None or message.press is not None:
                await self._command(message)
            else:
                await self._turn(message, resume=resume)
        except Exception as exc:  # noqa: BLE001 - a task boundary: log, keep serving other chats
            held = self._held
            if isinstance(exc, StoreError) and held is not None and held.can_hold(message):
                if held.hold(message, exc) and message.deliver:
                    self._bus.offer(
                        OutboundMessage(message.chat, HELD, "notice", _reply_to(message))
                    )
                return
            logger.exception(
                "processing {} message {} failed", message.chat.channel, message.message_id
            )
            if message.deliver:  # best effort: the store may be what failed
                self._bus.offer(OutboundMessage(message.chat, FAILED, "notice", _reply_to(message)))
            await self._report((message.journal_id,), TurnOutcome("error", error=exc))

    async def _turn(self, message: InboundMessage, *, resume: bool) -> None:
        chat = message.chat
        streams = _StreamIds(f"{chat.channel}-{message.journal_id}")

        async def send_now(text: str) -> None:
            await self._bus.publish(OutboundMessage(chat, text, kind="progress"))

        async def deliver(reply: Reply) -> None:
            await self._deliver(message, reply, streams.of(reply.result.run_id))

        shown = message.deliver  # typing and the message tool
        typing = _TypingSignal(self._bus, chat)
        streamer = None
        # A quiet answer must not show while written.
        if shown and message.quiet is None and chat.channel not in self._whole_replies:
            streamer = _streamer(self._bus, chat, _reply_to(message), streams)
        request = TurnRequest(
            message.session_key,
            _with_attachments(message),
            channel=chat.channel,
            chat_id=chat.chat_id,
            thread_id=chat.thread_id,
            sender_id=message.sender_id,
            send=send_now if shown else None,
            listener=listeners(streamer, typing) if shown else None,
            live=streamer is not None,
            mode=message.mode,
            inbound_id=message.journal_id,
            caller=_caller(message),
            on_reply=deliver,
            images=tuple(a.path for a in message.attachments if a.kind == "photo"),
            files=tuple(a.path for a in message.attachments),
            # Typing shows once the turn has a slot: chats waiting for one do not keep a
            # typing indicator (and its API calls) going.
            on_start=typing.start if shown else None,
        )
        if message.fresh and not resume:
            await self._loop.new_session(message.session_key)
        try:
            reply = await (self._loop.resume(request) if resume else self._loop.handle(request))
        finally:
            typing.stop()
        if reply is not None:
            await deliver(reply)

    async def _deliver(self, message: InboundMessage, reply: Reply, stream_id: str) -> None:
        """Queue the reply in the outbox, marking what it answers done, then publish it and
        tell the producers of what it answered how it went."""
        ids = reply.inbound_ids or ((message.journal_id,) if message.journal_id else ())
        text, result = reply.text, reply.result
        if self._held is not None and isinstance(result.error, StoreError):
            raise result.error  # not answered with the failure: held, and answered later
        if text is not None and message.quiet is not None and _only(text, message.quiet):
            logger.info("{}: nothing to report", message.session_key)
            text = None
        elif text is not None and _blank(text):  # never a silent gap where an answer was due
            logger.warning(
                "run {} in {} answered nothing visible ({!r}); the user is told so",
                result.run_id,
                message.session_key,
                text[:80],
            )
            text = EMPTY_ANSWER
        outbound = None
        if text and message.deliver:
            outbound = OutboundMessage(
                message.chat, text, reply_to=_reply_to(message), stream_id=stream_id
            )
        record = (message.chat.channel, outbound_record(outbound)) if outbound else None
        outbox_id = await self._journal.complete(ids, record, cron_run=_cron_run(message))
        if record is not None and outbox_id is None:
            # Another member took the session over while this one had lost the store, and
            # answers (or answered) the same messages: its reply is the one that counts.
            logger.info(
                "{}: answered by another member; this reply is dropped", message.session_key
            )
            for inbound_id in ids:  # that member tells their producers how it went
                self._awaited.pop(inbound_id, None)
            return
        if outbound is not None and outbox_id is not None:
            await self._bus.publish(_with_outbox(outbound, outbox_id))
        delivered = message.deliver and result.status == "completed" and text is not None
        await self._report(ids, TurnOutcome(result.status, text, result.error, delivered))

    async def _retry(self, held: Held) -> None:
        async for message, resume in held.released():
            name = f"{'resume' if resume else 'inbound'}-{message.journal_id}"
            self._tasks.spawn(self._process(message, resume=resume), name=name)

    async def _report(self, inbound_ids: Iterable[int | None], outcome: TurnOutcome) -> None:
        for inbound_id in inbound_ids:
            message = self._awaited.pop(inbound_id, None) if inbound_id is not None else None
            if message is not None:
                await self._outcomes[message.source].finished(message, outcome)

    async def _command(self, message: InboundMessage) -> None:
        key = message.session_key
        approver = self._loop.approver
        match message.command:
            case "approve" | "deny" | "approvals":
                text = (
                    await approver.command(message)
                    if approver is not None
                    else "Approvals are not used here."
                )
            case "new":
                await self._loop.new_session(key)
                if approver is not None:
                    await approver.new_session(key)
                text = "Started a new conversation. The old one is kept."
            case "stop":
                cancelled = self._subagents.cancel_session(key) if self._subagents else 0
                text = _stopped(self._loop.abort(key), cancelled)
            case "tasks":
                text = (
                    self._subagents.describe(key)
                    if self._subagents is not None
                    else "Background tasks are not available here."
                )
            case "status":
                text = await self._loop.status(key)
            case None:  # a press of a button that is none of ours (forged, or very old)
                logger.info("{}: a press with unknown data was ignored", message.chat.channel)
                text = "This button does nothing."
            case _:
                text = HELP
        ids = (message.journal_id,) if message.journal_id else ()
        if message.press is not None:  # a button: answered to the one who pressed it
            await self._journal.complete(ids, None)
            self._bus.offer(OutboundMessage(message.chat, text, "answer", message.press))
            await self._report(ids, TurnOutcome("completed", text, delivered=True))
            return
        outbound = OutboundMessage(message.chat, text, kind="notice", reply_to=message.message_id)
        record = (message.chat.channel, outbound_record(outbound)) if message.deliver else None
        outbox_id = await self._journal.complete(ids, record)
        if outbox_id is not None:
            await self._bus.publish(_with_outbox(outbound, outbox_id))
        await self._report(ids, TurnOutcome("completed", text, delivered=message.deliver))


def _with_outbox(message: OutboundMessage, outbox_id: int) -> OutboundMessage:
    return replace(message, outbox_id=outbox_id)


def _cron_run(message: InboundMessage) -> int | None:
    """The cron run `message` is, if it is one: its reply's delivery is recorded on the run."""
    if message.source != "cron" or message.ref is None or not message.ref.isdigit():
        return None
    return int(message.ref)


def _caller(message: InboundMessage) -> Caller:
    """Who asks for approval of the calls in `message`'s turn, and where."""
    chat = message.chat if message.deliver else None
    untrusted = [UNTRUSTED_SOURCES[message.source]] if message.source in UNTRUSTED_SOURCES else []
    if message.attachments:
        untrusted.append("a file sent in the chat")
    if message.source in ("cron", "heartbeat"):
        # Nobody is talking: the chat it delivers to decides, where that is someone's own.
        user = private_user(chat)
        return Caller(message.session_key, chat, user, user is not None, unattended=True)
    # A background task's report whose starter is not known (journaled before reports
    # carried it, as "task"): nobody's private chat; only configured approvers can decide.
    unknown = message.source == "task" and message.sender_id in ("", "task")
    talker = None if unknown else message.sender_id
    return Caller(message.session_key, chat, talker, message.is_private, untrusted=tuple(untrusted))


def private_user(chat: ChatRef | None) -> str | None:
    """The user whose private chat `chat` is, when it is named for them (`ChatRef.direct`,
    `@<user id>`: how the cron tool names a private chat a job delivers to, and what
    `heartbeat.deliver_to` takes), on every platform alike; None for any other chat. A chat
    id alone does not tell (a Discord DM's channel id is not its user's id). User ids are
    numbers: an `@name` is no one's private chat (on Telegram, a public chat's username)."""
    user = chat.direct_user if chat is not None else None
    return user if user is not None and user.isdigit() else None


def _reply_to(message: InboundMessage) -> str | None:
    """The platform message an answer replies to: a person's message; nanobot's own events
    have no platform message."""
    return message.message_id if message.source == "chat" else None


def _blank(text: str) -> bool:
    """Whether `text` shows nothing once rendered in a chat."""
    return not _INVISIBLE.sub("", text).strip()


def _only(text: str, token: str) -> bool:
    """Whether `text` says nothing but `token` (give or take blanks and a full stop)."""
    return text.strip().rstrip(".") == token


def _with_attachments(message: InboundMessage) -> str:
    if not message.attachments:
        return message.text
    lines = [message.text] if message.text else []
    for attachment in message.attachments:
        lines.append(
            f"[{attachment.kind} received, saved as {attachment.path} "
            f"({attachment.size} bytes, {attachment.mime_type or 'unknown type'})]"
        )
    return "\n".join(lines)


def _stopped(turn: bool, tasks: int) -> str:
    if not tasks:
        return "Stopped." if turn else "Nothing is running."
    what = "1 background task" if tasks == 1 else f"{tasks} background tasks"
    return f"Stopped the reply and {what}." if turn else f"Stopped {what}."
