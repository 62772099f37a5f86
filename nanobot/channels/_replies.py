"""Replies in a chat that edits messages: shown while they are written, then sent in full.

The bookkeeping is the same on every such platform; what differs (rendering, the size of a
message, how a call is made and retried) comes in as a `split` function and an `Outlet`
(a `CardOutlet` where the platform shows buttons under a message).
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from loguru import logger

from nanobot.bus.events import Button, ChatRef, OutboundMessage, StreamUpdate
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


class CardOutlet(Outlet, Protocol):
    """An Outlet that also puts buttons under a message: for cards, and for edits of them.

    `Replies` always names `buttons` when it calls these (an outlet may read a call without
    them differently: Discord's `edit` then leaves the buttons as they are, which stream
    edits, made through `Outlet.edit`, rely on)."""

    async def send(
        self, chat: ChatRef, text: str, *, reply_to: str | None, buttons: Sequence[Button] = ()
    ) -> int:
        """Post one message answering `reply_to`, with `buttons` under it; returns its id."""
        ...

    async def edit(
        self, chat: ChatRef, message_id: int, text: str, *, buttons: Sequence[Button] = ()
    ) -> bool:
        """Make message `message_id` show `text` and exactly `buttons` (none: the buttons it
        had are removed); False when it can no longer be edited."""
        ...


class VoiceOutlet(Protocol):
    """How `Replies` sends a reply's voice note (a spoken reply: `OutboundMessage.speak`)."""

    def caption_fits(self, part: str) -> bool:
        """Whether `part` (one part of a reply, as `split` made it) can be a voice note's
        caption."""
        ...

    async def send_voice(
        self, chat: ChatRef, audio: Path, *, caption: str | None, reply_to: str | None
    ) -> int:
        """Post the audio file `audio` as a voice note (or an audio attachment), with
        `caption` under it, answering `reply_to`; returns its id. Raises as `Outlet.send`
        does; `Undeliverable` too for a file that cannot be read."""
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

    A message with `buttons` (a card) or one that `replaces` an earlier message goes out
    through `cards`: its buttons are under its last part; its first part edits the message it
    replaces (the text, and the buttons, removed when it has none), or is posted as a new
    message when that one can no longer be edited. Without `cards` such a message is refused
    (`Undeliverable`).

    With `outbox`, a stream's message is stored when it is posted and forgotten once the
    final message is out; a stream open before a restart (`recover` reads them) is edited,
    by its later updates and by its final message, as if it had been posted here.

    A reply to be spoken (`speak`) goes out through `voices`, its voice note first: a text
    that is one part and fits a caption is that caption (one part, voice note and text
    together); a longer one follows the voice note, which counts as the reply's first part
    whether or not there was audio to send (so a restart never takes a text part for it).
    A voice note the platform refuses (a user who takes none) leaves the text to go alone.
    Without `voices`, or without audio (`voice` None), the text goes as it would unspoken.

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
        cards: CardOutlet | None = None,
        voices: VoiceOutlet | None = None,
    ) -> None:
        self._outlet = outlet
        self._cards = cards
        self._voices = voices
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

    async def send(self, item: OutboundMessage) -> str | None:
        """Every part in order; the id of the message that holds the last part (and the
        buttons), None when no part was left to send. Raises DeliveryError (see the class
        docstring)."""
        try:
            return await self._send(item)
        except Undeliverable:
            self._progress.pop(id(item), None)
            if item.stream_id:
                await self._forget(item.stream_id)
            raise

    async def _send(self, item: OutboundMessage) -> str | None:
        cards = self._cards_for(item)
        parts = self._split(item.text)
        entry = self._progress.get(id(item))
        done = entry[1] if entry is not None and entry[0] is item else item.parts_sent
        stream = self._open_stream(item.stream_id) if item.stream_id else None
        if item.speak and self._voices is not None and cards is None:
            return await self._send_spoken(item, self._voices, parts, done, stream)
        sent: int | None = None
        for index in range(done, len(parts)):
            first, last = index == 0, index == len(parts) - 1
            buttons = item.buttons if last else ()
            sent = await self._edit_first(item, cards, stream, parts[0], buttons) if first else None
            if sent is None:
                reply_to = item.reply_to if first else None
                if cards is None:
                    sent = await self._outlet.send(item.chat, parts[index], reply_to=reply_to)
                else:
                    sent = await cards.send(
                        item.chat, parts[index], reply_to=reply_to, buttons=buttons
                    )
            _remember(self._progress, id(item), (item, index + 1))
            if not last:  # the last one: the manager confirms the whole reply
                await self._record(item, index + 1)
        self._progress.pop(id(item), None)
        if item.stream_id:
            await self._forget(item.stream_id, stored=stream is not None)
        return None if sent is None else str(sent)

    async def _send_spoken(
        self,
        item: OutboundMessage,
        voices: VoiceOutlet,
        parts: list[str],
        done: int,
        stream: _Stream | None,
    ) -> str | None:
        """A spoken reply: its voice note, then its text (see the class docstring)."""
        shown = stream is not None and stream.message_id is not None  # its text is out there
        sent: int | None
        if len(parts) == 1 and not shown and voices.caption_fits(parts[0]):
            sent = await self._voice(item, voices, parts[0])
            if sent is None:
                sent = await self._outlet.send(item.chat, parts[0], reply_to=item.reply_to)
        else:
            reply_to = None
            if done == 0:
                if await self._voice(item, voices, None) is None:
                    reply_to = item.reply_to  # the text answers the message instead
                done = 1
                _remember(self._progress, id(item), (item, done))
                await self._record(item, done)
            sent = None
            for index in range(done - 1, len(parts)):
                edited = None
                if index == 0 and stream is not None:
                    edited = await self._edit_first(item, None, stream, parts[0], ())
                sent = edited or await self._outlet.send(item.chat, parts[index], reply_to=reply_to)
                reply_to = None
                _remember(self._progress, id(item), (item, index + 2))
                if index < len(parts) - 1:
                    await self._record(item, index + 2)
        self._progress.pop(id(item), None)
        if item.stream_id:
            await self._forget(item.stream_id, stored=stream is not None)
        return None if sent is None else str(sent)

    async def _voice(
        self, item: OutboundMessage, voices: VoiceOutlet, caption: str | None
    ) -> int | None:
        """Send `item`'s voice note (with `caption`); its id, or None when there is no audio
        or the platform refused it (the text goes alone: nothing else is lost)."""
        if item.voice is None:
            return None
        try:
            return await voices.send_voice(
                item.chat, item.voice, caption=caption, reply_to=item.reply_to
            )
        except Undeliverable as exc:
            if exc.chat_closed:
                raise
            logger.warning(
                "{}: the voice note of reply {} was refused; its text goes alone: {}",
                self._name,
                item.outbox_id,
                exc,
            )
            return None

    def _cards_for(self, item: OutboundMessage) -> CardOutlet | None:
        """The outlet for a card or an edit (None for other messages)."""
        if not item.buttons and item.replaces is None:
            return None
        if self._cards is None:
            raise Undeliverable(f"{self._name} cannot show buttons or edit earlier messages")
        return self._cards

    async def _edit_first(
        self,
        item: OutboundMessage,
        cards: CardOutlet | None,
        stream: _Stream | None,
        text: str,
        buttons: Sequence[Button],
    ) -> int | None:
        """Put the first part in the message it replaces, or in its stream's message; that
        message's id if it did (None: post the part)."""
        if item.replaces is not None:
            number = int(item.replaces) if item.replaces.isdigit() else None
            if (
                number is not None
                and cards is not None
                and await cards.edit(item.chat, number, text, buttons=buttons)
            ):
                return number
            logger.info(
                "{}: message {} cannot be edited; posting it anew", self._name, item.replaces
            )
            return None
        if stream is None or stream.message_id is None:
            return None
        edited = await self._finish(item.chat, stream, text, cards, buttons)
        return stream.message_id if edited else None

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

    async def _finish(
        self,
        chat: ChatRef,
        stream: _Stream,
        first: str,
        cards: CardOutlet | None = None,
        buttons: Sequence[Button] = (),
    ) -> bool:
        """The final edit: exact, and at once.

        It does not wait out the stream interval: the reply would only come later, and the
        chat's next items with it (a single edit right after the last one is well within the
        platforms' limits).
        """
        if stream.message_id is None:
            return False
        if stream.shown == first and not buttons:
            return True
        stream.at = asyncio.get_running_loop().time()
        if cards is not None:
            return await cards.edit(chat, stream.message_id, first, buttons=buttons)
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
