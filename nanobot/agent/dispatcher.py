"""The dispatcher: from the inbound bus to answered, journaled, delivered replies.

Every inbound message gets its own task (owned here): chat commands are answered at once,
other messages become turns of the AgentLoop, whose lanes keep one session's turns in order
while different sessions run side by side. A turn's reply is written to the outbox in the
same transaction that marks its messages answered, then published for delivery. On start,
`recover()` re-publishes undelivered replies and finishes turns a crash interrupted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

from loguru import logger

from nanobot.agent.loop import AgentLoop, Reply, TurnRequest
from nanobot.agent.run import EventListener, RunEvent
from nanobot.agent.subagents import Origin, Subagents, follow_up
from nanobot.bus.events import ChatRef, InboundMessage, OutboundMessage, StreamUpdate, Typing
from nanobot.bus.queue import MessageBus
from nanobot.bus.records import inbound_from, outbound_from, outbound_record
from nanobot.store import Journal
from nanobot.tasks import TaskSet

HELP = (
    "I'm nanobot, your assistant. Just write to me. Commands:\n"
    "/new - start a fresh conversation (the old one is kept)\n"
    "/stop - stop what I'm doing, background tasks included\n"
    "/tasks - background tasks in this chat and their state\n"
    "/status - model, tokens used, context fill and state\n"
    "/help - this message"
)


class StatusSource(Protocol):
    """What `/status` reports for a session."""

    async def status(self, session_key: str) -> str: ...


STREAM_INTERVAL = 0.5  # seconds between two stream updates of one reply


def _streamer(
    bus: MessageBus,
    chat: ChatRef,
    reply_to: str | None,
    stream_id: str,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> EventListener:
    """A run listener that publishes the reply's text so far.

    The first update goes out once the answer has been arriving for STREAM_INTERVAL, later
    ones at most every STREAM_INTERVAL: an answer that streams in faster than that reaches
    the chat whole, as one message instead of a message and an edit (half the platform
    calls, and no half-written message flashing by).
    """
    parts: list[str] = []
    last: float | None = None  # when text last went out, or first arrived

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
                bus.offer(StreamUpdate(chat, stream_id, "".join(parts), reply_to))

    return on_event


class Dispatcher:
    """Consumes the inbound bus until it is closed."""

    def __init__(
        self,
        loop: AgentLoop,
        bus: MessageBus,
        journal: Journal,
        status: StatusSource,
        subagents: Subagents | None = None,
    ) -> None:
        self._loop = loop
        self._bus = bus
        self._journal = journal
        self._status = status
        self._subagents = subagents
        self._tasks = TaskSet("dispatcher")

    async def run(self) -> None:
        """Dispatch inbound messages until the bus's inbound side is closed, then wait for
        the turns still running. Cancelling it cancels them."""
        try:
            async for message in self._bus.inbound():
                self._tasks.spawn(self._process(message), name=f"inbound-{message.journal_id}")
        except BaseException:
            await self._tasks.close()
            raise
        await self._tasks.close(grace=None)

    @property
    def running(self) -> int:
        return len(self._tasks)

    async def recover(self) -> None:
        """Publish undelivered replies; finish turns a crash or restart interrupted."""
        for item in await self._journal.pending_outbox():
            await self._bus.publish(outbound_from(item.message, item.id, item.parts_sent))
        pending = await self._journal.pending_inbound()
        reached = await self._journal.reached_session([p.id for p in pending])
        for row in pending:
            message = inbound_from(row.message, row.id)
            logger.info("recovering {} message {} after a restart", row.channel, message.message_id)
            if row.id in reached:
                self._tasks.spawn(self._resume(message), name=f"resume-{row.id}")
            else:
                self._tasks.spawn(self._process(message), name=f"inbound-{row.id}")

    async def _process(self, message: InboundMessage) -> None:
        try:
            if message.command is not None:
                await self._command(message)
            else:
                await self._turn(message, resume=False)
        except Exception:  # noqa: BLE001 - a task boundary: log, keep serving other chats
            logger.exception(
                "processing {} message {} failed", message.chat.channel, message.message_id
            )

    async def _resume(self, message: InboundMessage) -> None:
        try:
            await self._turn(message, resume=True)
        except Exception:  # noqa: BLE001 - a task boundary
            logger.exception("resuming message {} failed", message.message_id)

    async def _turn(self, message: InboundMessage, *, resume: bool) -> None:
        stream_id = f"{message.chat.channel}-{message.journal_id}"

        async def send_now(text: str) -> None:
            await self._bus.publish(OutboundMessage(message.chat, text, kind="progress"))

        async def deliver(reply: Reply) -> None:
            await self._answer(message, reply, stream_id)

        request = TurnRequest(
            message.chat.session_key,
            _with_attachments(message),
            channel=message.chat.channel,
            chat_id=message.chat.chat_id,
            thread_id=message.chat.thread_id,
            sender_id=message.sender_id,
            send=send_now,
            listener=_streamer(self._bus, message.chat, message.message_id, stream_id),
            inbound_id=message.journal_id,
            on_reply=deliver,
            images=tuple(a.path for a in message.attachments if a.kind == "photo"),
            on_start=lambda: started.append(self._bus.offer(Typing(message.chat, active=True))),
        )
        # Typing shows once the turn has a slot: chats waiting for one do not keep a typing
        # indicator (and its API calls) going.
        started: list[bool] = []
        try:
            reply = await (self._loop.resume(request) if resume else self._loop.handle(request))
        finally:
            if started:
                self._bus.offer(Typing(message.chat, active=False))
        if reply is not None:
            await deliver(reply)

    async def follow_up(self, origin: Origin) -> None:
        """Let the agent tell the user about a background task that ended (its note is
        already in the session): a turn there, whose reply is journaled and delivered like
        any other. Raises what the turn raises (`StoreError`)."""
        chat = origin.chat
        stream_id = f"{chat.channel}-task-{uuid.uuid4().hex[:12]}"

        async def send_now(text: str) -> None:
            await self._bus.publish(OutboundMessage(chat, text, kind="progress"))

        async def deliver(reply: Reply) -> None:
            await self._deliver(chat, reply, stream_id, reply.inbound_ids)

        await self._bus.publish(Typing(chat, active=True))
        try:
            reply = await follow_up(
                self._loop,
                origin,
                send=send_now,
                listener=_streamer(self._bus, chat, None, stream_id),
                on_reply=deliver,
            )
        finally:
            await self._bus.publish(Typing(chat, active=False))
        if reply is not None:
            await deliver(reply)

    async def _answer(self, message: InboundMessage, reply: Reply, stream_id: str) -> None:
        ids = reply.inbound_ids or ((message.journal_id,) if message.journal_id else ())
        await self._deliver(message.chat, reply, stream_id, ids, message.message_id)

    async def _deliver(
        self,
        chat: ChatRef,
        reply: Reply,
        stream_id: str,
        inbound_ids: Sequence[int],
        reply_to: str | None = None,
    ) -> None:
        """Queue the reply in the outbox, marking what it answers done, then publish it."""
        outbound = None
        if reply.text:
            outbound = OutboundMessage(chat, reply.text, reply_to=reply_to, stream_id=stream_id)
        record = (chat.channel, outbound_record(outbound)) if outbound else None
        outbox_id = await self._journal.complete(inbound_ids, record)
        if outbound is not None and outbox_id is not None:
            await self._bus.publish(_with_outbox(outbound, outbox_id))

    async def send(self, chat: ChatRef, text: str) -> None:
        """Send `text` to `chat` on the agent's own initiative, durably (through the outbox)."""
        outbound = OutboundMessage(chat, text, kind="notice")
        outbox_id = await self._journal.enqueue(chat.channel, outbound_record(outbound))
        await self._bus.publish(_with_outbox(outbound, outbox_id))

    async def _command(self, message: InboundMessage) -> None:
        key = message.chat.session_key
        match message.command:
            case "new":
                await self._loop.new_session(key)
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
                text = await self._status.status(key)
            case _:
                text = HELP
        outbound = OutboundMessage(message.chat, text, kind="notice", reply_to=message.message_id)
        ids = (message.journal_id,) if message.journal_id else ()
        outbox_id = await self._journal.complete(
            ids, (message.chat.channel, outbound_record(outbound))
        )
        assert outbox_id is not None
        await self._bus.publish(_with_outbox(outbound, outbox_id))


def _with_outbox(message: OutboundMessage, outbox_id: int) -> OutboundMessage:
    return OutboundMessage(
        message.chat, message.text, message.kind, message.reply_to, outbox_id, message.stream_id
    )


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
