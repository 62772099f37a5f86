"""What the turn of an inbound event shows in its chat while it runs: "typing…", the answer
as it is written, the message tool's texts; and where the replies of its further turns go."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from nanobot.agent._arrivals import Ticket
from nanobot.agent.run import EventListener, RunEvent, RunState, listeners
from nanobot.agent.turn import Reply, TurnSink
from nanobot.bus.events import ChatRef, OutboundMessage, StreamUpdate, Typing
from nanobot.bus.queue import MessageBus

STREAM_INTERVAL = 0.5  # seconds between two stream updates of one reply

DeliverReply = Callable[[Reply, str], Awaitable[None]]
"""Queue a turn's reply for the event's chat, under the stream id of the run it ends."""


class StreamIds:
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


def streamer(
    bus: MessageBus,
    chat: ChatRef,
    reply_to: str | None,
    streams: StreamIds | str,
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
    ids = StreamIds(streams) if isinstance(streams, str) else streams

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


class TypingSignal:
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


class ChatSink(TurnSink):
    """The output of an inbound event's turn. Where the event's chat is `shown` its turn,
    the turn shows "typing…" there once it has a slot (chats waiting for one keep no typing
    indicator, and its API calls, going), the message tool sends there, and with `streamed`
    the answer shows while it is written (`reply_to` the message it answers). The replies
    of its further turns go to `deliver`. `stop()` ends the typing once the request is
    done. `ticket`: the event's place among its session's messages, handed on as its turn
    starts."""

    def __init__(
        self,
        bus: MessageBus,
        chat: ChatRef,
        deliver: DeliverReply,
        streams: StreamIds,
        *,
        shown: bool,
        streamed: bool,
        reply_to: str | None,
        ticket: Ticket | None = None,
    ) -> None:
        self._bus, self._chat, self._deliver, self._streams = bus, chat, deliver, streams
        self._ticket = ticket
        self._typing = TypingSignal(bus, chat)
        stream = streamer(bus, chat, reply_to, streams) if shown and streamed else None
        self._listener = listeners(stream, self._typing) if shown else None
        self.sends = shown
        self.live = stream is not None

    def started(self) -> None:
        if self._ticket is not None:  # the session is busy with this turn: the next may come
            self._ticket.handed()
        if self.sends:
            self._typing.start()

    def stop(self) -> None:
        self._typing.stop()

    def event(self, event: RunEvent) -> None:
        if self._listener is not None:
            self._listener(event)

    async def send(self, text: str) -> None:
        await self._bus.publish(OutboundMessage(self._chat, text, kind="progress"))

    async def reply(self, reply: Reply) -> None:
        await self._deliver(reply, self._streams.of(reply.result.run_id))
