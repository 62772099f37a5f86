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
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from typing import Protocol

from loguru import logger

from nanobot.agent import commands
from nanobot.agent._arrivals import Arrivals, Ticket
from nanobot.agent.approver import Caller
from nanobot.agent.chat_sink import ChatSink, StreamIds
from nanobot.agent.held import Held
from nanobot.agent.loop import AgentLoop
from nanobot.agent.run import OverBudget
from nanobot.agent.subagents import Subagents
from nanobot.agent.turn import Reply, TurnRequest
from nanobot.bus.events import (
    SKIPPED_FOR_BUDGET,
    ChatRef,
    InboundMessage,
    OutboundMessage,
    Source,
    TurnOutcome,
)
from nanobot.bus.queue import MessageBus
from nanobot.bus.records import inbound_from, outbound_from, outbound_record
from nanobot.errors import StoreError
from nanobot.media.reading import OWN_WORDS, Reader, listed
from nanobot.media.speech import VoiceReplies
from nanobot.store import Journal
from nanobot.tasks import TaskSet
from nanobot.tools.memory_search import MemoryRecall

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


class OutcomeSink(Protocol):
    """A producer that wants to know how the turns of its events ended (cron records its
    runs). Told once per event, in the process that finished the turn."""

    async def finished(self, message: InboundMessage, outcome: TurnOutcome) -> None:
        """`message`'s turn ended as `outcome` says. Must not raise."""
        ...


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
        reader: Reader | None = None,
        voices: VoiceReplies | None = None,
        recall: MemoryRecall | None = None,
    ) -> None:
        """`whole_replies`: channels whose replies arrive whole instead of being shown while
        the model writes them (`channels.<name>.stream: false`). `held`: where messages
        whose turn a store failure cut short wait for the store (none: they wait for the
        next start). `reader`: what reads the files people send (voice notes, documents);
        none: they are only named. `voices`: which replies are spoken too (none: no reply
        is). `recall`: the memory search `/search` uses (none: not offered)."""
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
        self._reader = reader
        self._arrivals = Arrivals()
        self._voices = voices
        self._recall = recall

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
            if row.channel not in channels and (message.route.deliver or message.source == "chat"):
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
                if held.hold(message, exc) and message.route.deliver:
                    self._bus.offer(
                        OutboundMessage(message.chat, HELD, "notice", _reply_to(message))
                    )
                return
            logger.exception(
                "processing {} message {} failed", message.chat.channel, message.message_id
            )
            if message.route.deliver:  # best effort: the store may be what failed
                self._bus.offer(OutboundMessage(message.chat, FAILED, "notice", _reply_to(message)))
            await self._report((message.journal_id,), TurnOutcome("error", error=exc))

    async def _turn(self, message: InboundMessage, *, resume: bool) -> None:
        ticket = self._arrivals.ticket(message.session_key)  # before any await: in arrival order
        try:
            await self._hand_over(message, ticket, resume=resume)
        finally:
            ticket.handed()

    async def _hand_over(self, message: InboundMessage, ticket: Ticket, *, resume: bool) -> None:
        """Read the message's files, then, once the session's earlier messages are with the
        loop, hand it over; its turn has the ticket handed on as it starts."""
        route = message.route
        chat = route.chat
        text = await self._text(message, resume=resume)
        if text is None:
            return
        await ticket.wait()
        speak = self._voices is not None and await self._voices.speaks(message)

        async def deliver(reply: Reply, stream_id: str) -> None:
            await self._deliver(message, reply, stream_id, speak=speak)

        # A quiet answer must not show while written; a spoken one is made of the whole.
        streamed = route.quiet is None and chat.channel not in self._whole_replies and not speak
        sink = ChatSink(
            self._bus,
            chat,
            deliver,
            StreamIds(f"{chat.channel}-{message.journal_id}"),
            shown=route.deliver,
            streamed=streamed,
            reply_to=_reply_to(message),
            ticket=ticket,
        )
        request = TurnRequest(
            message.session_key,
            text,
            chat=chat,
            sender_id=_runs_as(message),
            sink=sink,
            mode=route.mode,
            inbound_id=message.journal_id,
            caller=_caller(message),
            source=message.source,
            images=tuple(a.path for a in message.attachments if a.kind == "photo"),
            files=tuple(a.path for a in message.attachments),
        )
        if route.fresh and not resume:
            await self._loop.new_session(message.session_key)
        try:
            reply = await (self._loop.resume(request) if resume else self._loop.handle(request))
        finally:
            sink.stop()
        if reply is not None:
            await sink.reply(reply)

    async def _text(self, message: InboundMessage, *, resume: bool) -> str | None:
        """The turn's text: the message with what its files say (a resumed turn's message
        is in its session already). None: the message was answered here (a voice note that
        could not be heard, and nothing else)."""
        if resume or not message.attachments or self._reader is None:
            return listed(message.text, message.attachments)
        read = await self._reader.read(message.text, message.attachments)
        if read.heard and self._reader.model is not None:
            self._loop.heard(message.session_key, read.heard, self._reader.model)
        if read.problems and not read.said:
            await self._notice(message, "\n".join(read.problems))
            return None
        if read.problems and message.route.deliver:
            self._bus.offer(
                OutboundMessage(
                    message.chat, "\n".join(read.problems), "notice", _reply_to(message)
                )
            )
        return read.text

    async def _deliver(
        self, message: InboundMessage, reply: Reply, stream_id: str, *, speak: bool = False
    ) -> None:
        """Queue the reply in the outbox, marking what it answers done, then publish it and
        tell the producers of what it answered how it went. `speak`: the reply is to be
        spoken too (its audio is made on its way out)."""
        ids = reply.inbound_ids or ((message.journal_id,) if message.journal_id else ())
        text, result = reply.text, reply.result
        if self._held is not None and isinstance(result.error, StoreError):
            raise result.error  # not answered with the failure: held, and answered later
        if (
            text is not None
            and message.route.quiet is not None
            and _only(text, message.route.quiet)
        ):
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
        if text and message.route.deliver:
            outbound = OutboundMessage(
                message.chat,
                text,
                reply_to=_reply_to(message),
                stream_id=stream_id,
                speak=speak and text == reply.text,  # not a line of ours in its place
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
        delivered = message.route.deliver and result.status == "completed" and text is not None
        status: str = result.status
        if isinstance(result.error, OverBudget) and message.source in ("cron", "heartbeat"):
            status = SKIPPED_FOR_BUDGET
        await self._report(ids, TurnOutcome(status, text, result.error, delivered))

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
        text = await commands.answer(
            message, self._loop, self._subagents, self._voices, self._recall
        )
        ids = (message.journal_id,) if message.journal_id else ()
        if message.press is not None:  # a button: answered to the one who pressed it
            await self._journal.complete(ids, None)
            self._bus.offer(OutboundMessage(message.chat, text, "answer", message.press))
            await self._report(ids, TurnOutcome("completed", text, delivered=True))
            return
        await self._notice(message, text)

    async def _notice(self, message: InboundMessage, text: str) -> None:
        """Answer `message` with `text`, no turn taken: kept in the outbox with the message
        marked answered, then delivered."""
        ids = (message.journal_id,) if message.journal_id else ()
        outbound = OutboundMessage(message.chat, text, kind="notice", reply_to=message.message_id)
        record = (
            (message.chat.channel, outbound_record(outbound)) if message.route.deliver else None
        )
        outbox_id = await self._journal.complete(ids, record)
        if outbox_id is not None:
            await self._bus.publish(_with_outbox(outbound, outbox_id))
        await self._report(ids, TurnOutcome("completed", text, delivered=message.route.deliver))


def _with_outbox(message: OutboundMessage, outbox_id: int) -> OutboundMessage:
    return replace(message, outbox_id=outbox_id)


def _cron_run(message: InboundMessage) -> int | None:
    """The cron run `message` is, if it is one: its reply's delivery is recorded on the run."""
    if message.source != "cron" or message.ref is None or not message.ref.isdigit():
        return None
    return int(message.ref)


def _caller(message: InboundMessage) -> Caller:
    """Who asks for approval of the calls in `message`'s turn, and where."""
    chat = message.chat if message.route.deliver else None
    untrusted = [UNTRUSTED_SOURCES[message.source]] if message.source in UNTRUSTED_SOURCES else []
    if any(a.kind not in OWN_WORDS for a in message.attachments):
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


def _runs_as(message: InboundMessage) -> str | None:
    """The sender a turn of `message` runs as (`nanobot.people`): a cron job's maker (a
    whole `channel:user_id`), nobody for the heartbeat or a job from the CLI (the owner,
    `people.owner`, then), else who wrote it."""
    if message.source == "heartbeat" or (message.source == "cron" and message.sender_id == "cron"):
        return None
    return message.sender_id


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
