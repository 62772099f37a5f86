"""Replies in a chat that edits messages: shown while they are written, then sent in full.

The bookkeeping is the same on every such platform; what differs (rendering, the size of a
message, how a call is made and retried) comes in as a `split` function and an `Outlet`.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from loguru import logger

from nanobot.bus.events import ChatRef, OutboundMessage, StreamUpdate
from nanobot.channels.base import DeliveryError, OutboxPort, Undeliverable

KEEP = 64  # streams, finished streams and partly sent replies remembered, of each

K = TypeVar("K")
V = TypeVar("V")


class Outlet(Protocol):
    """How `Replies` puts text in a chat. Both calls raise DeliveryError when the retries
    run out, `Undeliverable` when the platform refuses for good."""

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None) -> int:
        """Post one message answering `reply_to` (the bus's message id); returns its id."""
        ...

    async def edit(self, chat: ChatRef, message_id: int, text: str) -> bool:
        """Make message `message_id` show `text`; False when it can no longer be edited."""
        ...


@dataclass(slots=True)
class _Stream:
    """A reply being shown as it is written: the message that shows it, and what it shows."""

    message_id: int | None  # None: it can no longer be edited
    shown: str
    at: float  # loop time of the last post or edit


class Replies:
    """The replies of one channel, streamed or not.

    `stream` posts a stream's first update and edits that message with later ones, at most
    once per `interval`. `send` delivers a final message as the parts `split` makes of it:
    a streamed reply's message is edited to exactly the first part (at once), the rest are
    posted; stream updates after it are ignored. The parts already out are remembered, so
    when `send` raises DeliveryError and the same item is sent again it resumes with the
    part that failed; across a restart, `outbox.progress` keeps the count and the item comes
    back with `parts_sent`. When it raises `Undeliverable` the reply is over (it is never
    sent again): what was kept for it is forgotten.

    Stream updates go out through `best_effort`, which may give up sooner than `outlet` (the
    next update, or the final message, tries again); by default they share `outlet`.

    With `outbox`, a stream's message is stored when it is posted and forgotten once the
    final message is out; a stream open before a restart (`recover` reads them) is edited,
    by its later updates and by its final message, as if it had been posted here.

    Holds no tasks. Cancelling `send` leaves it resumable like a failure (the part in flight
    may go out twice). Memory is bounded: at most `KEEP` of each kind of entry.
    """

    def __init__(
        self,
        outlet: Outlet,
        split: Callable[[str], list[str]],
        *,
        interval: float,
        name: str,
        best_effort: Outlet | None = None,
        outbox: OutboxPort | None = None,
    ) -> None:
        self._outlet = outlet
        self._outbox = outbox
        self._recovered: dict[str, int] = {}
        self._best_effort = best_effort or outlet
        self._split = split
        self._interval = interval
        self._name = name
        self._streams: OrderedDict[str, _Stream] = OrderedDict()
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._progress: OrderedDict[int, tuple[OutboundMessage, int]] = OrderedDict()

    async def recover(self) -> None:
        """Read the streams a restart left open, so their replies finish in their messages.
        Called when the channel (re)connects, before any delivery; best effort (a failure is
        logged: those replies then come as new messages)."""
        if self._outbox is None:
            return
        try:
            self._recovered = await self._outbox.open_streams()
        except Exception:  # noqa: BLE001 - at worst a reply is posted anew
            logger.opt(exception=True).warning("{}: could not read open streams", self._name)

    async def send(self, item: OutboundMessage) -> None:
        """Every part in order. Raises DeliveryError (see the class docstring)."""
        try:
            await self._send(item)
        except Undeliverable:
            self._progress.pop(id(item), None)
            if item.stream_id:
                await self._forget(item.stream_id)
            raise

    async def _send(self, item: OutboundMessage) -> None:
        parts = self._split(item.text)
        entry = self._progress.get(id(item))
        done = entry[1] if entry is not None and entry[0] is item else item.parts_sent
        stream = self._open_stream(item.stream_id) if item.stream_id else None
        for index in range(done, len(parts)):
            first = index == 0
            edited = (
                first and stream is not None and await self._finish(item.chat, stream, parts[0])
            )
            if not edited:
                reply_to = item.reply_to if first else None
                await self._outlet.send(item.chat, parts[index], reply_to=reply_to)
            _remember(self._progress, id(item), (item, index + 1))
            if index + 1 < len(parts):  # the last one: the manager confirms the whole reply
                await self._record(item, index + 1)
        self._progress.pop(id(item), None)
        if item.stream_id:
            await self._forget(item.stream_id, stored=stream is not None)

    async def _forget(self, stream_id: str, *, stored: bool = True) -> None:
        """A stream's reply is over: later updates are ignored, its message forgotten."""
        self._streams.pop(stream_id, None)
        self._recovered.pop(stream_id, None)
        _remember(self._finished, stream_id, None)
        if stored:
            await self._store(stream_id, None)

    def _open_stream(self, stream_id: str) -> _Stream | None:
        """The stream's state: from this run, else from before a restart (taken over; never
        edited in this run, so its next update edits at once)."""
        state = self._streams.get(stream_id)
        if state is None and stream_id in self._recovered:
            # -inf, not `now - interval`: that difference, taken back from `now`, may come
            # out a rounding error short of the interval and skip the update.
            state = _Stream(self._recovered.pop(stream_id), "", -math.inf)
            _remember(self._streams, stream_id, state)
        return state

    async def _store(self, stream_id: str, message_id: int | None) -> None:
        """Store (or, with None, forget) a stream's message; best effort."""
        if self._outbox is None:
            return
        try:
            if message_id is None:
                await self._outbox.stream_finished(stream_id)
            else:
                await self._outbox.stream_started(stream_id, message_id)
        except Exception:  # noqa: BLE001 - at worst a restart posts the reply anew
            logger.opt(exception=True).warning(
                "{}: could not record stream {}", self._name, stream_id
            )

    async def _record(self, item: OutboundMessage, parts: int) -> None:
        if self._outbox is None or item.outbox_id is None:
            return
        try:
            await self._outbox.progress(item.outbox_id, parts)
        except Exception:  # noqa: BLE001 - the parts are out; at worst a restart resends them
            logger.opt(exception=True).warning(
                "{}: could not record that {} part(s) of reply {} were sent",
                self._name,
                parts,
                item.outbox_id,
            )

    async def _finish(self, chat: ChatRef, stream: _Stream, first: str) -> bool:
        """The final edit: exact, and at once.

        It does not wait out the stream interval: the reply would only come later, and the
        chat's next items with it (a single edit right after the last one is well within the
        platforms' limits).
        """
        if stream.message_id is None:
            return False
        if stream.shown == first:
            return True
        stream.at = asyncio.get_running_loop().time()
        return await self._outlet.edit(chat, stream.message_id, first)

    async def stream(self, update: StreamUpdate) -> None:
        """Show the reply so far: post it, then edit it. Best effort: never raises."""
        if update.stream_id in self._finished:
            return  # the final message is out; a late update must not start another
        parts = self._split(update.text)
        if not parts:
            return
        now = asyncio.get_running_loop().time()
        state = self._open_stream(update.stream_id)
        try:
            if state is None:
                sent = await self._best_effort.send(update.chat, parts[0], reply_to=update.reply_to)
                _remember(self._streams, update.stream_id, _Stream(sent, parts[0], now))
                await self._store(update.stream_id, sent)
            elif state.message_id is not None and state.shown != parts[0]:
                if now - state.at < self._interval:
                    return  # the final message is exact; skipped updates are not missed
                state.at = now
                # `shown` only changes once the edit went through: the final edit may be
                # skipped when the message already shows its text.
                if await self._best_effort.edit(update.chat, state.message_id, parts[0]):
                    state.shown = parts[0]
                else:
                    state.message_id = None
        except DeliveryError as exc:
            logger.debug("{} stream update skipped: {}", self._name, exc)


def _remember(cache: OrderedDict[K, V], key: K, value: V) -> None:
    """Put `key` in a small cache that forgets its oldest entries."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > KEEP:
        cache.popitem(last=False)
