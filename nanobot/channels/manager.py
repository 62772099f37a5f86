"""The ChannelManager: runs every enabled channel and delivers its outbound traffic.

Each channel gets two tasks: a supervisor that runs it and restarts it with backoff when it
crashes (not when the platform refused it, `ChannelRefused`: that stops it for good, in one
line), and a delivery task that drains its outbound queue, so a slow platform never delays
another. Within a channel, chats are delivered to in parallel, each chat in order, and
nothing one chat waits for is shared: a chat whose delivery backs off (seconds, or minutes of
a platform's 5xx and rate limits) holds up only its own later items. There is no bound on
the chats delivered to at once that a chat would hold while it waits (such a bound, 32
slots held across every retry's wait, once let 32 failing chats stop all the others): the
channel's own client bounds the requests in flight, each holding its turn only while it is
made (Telegram's `Sender`; discord.py's rate-limit buckets).

A reply is confirmed (its outbox row marked delivered) only after the platform accepted it.
One that fails for a reason that may pass (`DeliveryError`) is tried again a few times, then
stays in the outbox for the next start. One the platform refused for good (`Undeliverable`)
is given up at once: its row is marked failed with the reason, logged once, and the chat's
next item goes ahead. When the refusal says the chat is closed to the bot (it was blocked,
removed, the chat is gone), nothing more is sent there (replies are marked failed unsent)
until the chat writes again: an item that answers one of its messages (`reply_to`).

A reply to be spoken (`speak`) has its audio made (`voices`) in its chat's turn, before it
is delivered: the chat's later items wait for it, other chats do not. Audio that cannot be
made leaves the text to go alone; a reply whose voice note is out already (a restart
between its parts) is not spoken again.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from loguru import logger

from nanobot.bus.events import ChatRef, Outbound, OutboundMessage, StreamUpdate, Typing
from nanobot.bus.queue import MessageBus
from nanobot.channels.base import (
    Channel,
    ChannelRefused,
    ChannelUnreachable,
    DeliveryError,
    OutboxPort,
    Undeliverable,
    Voices,
)
from nanobot.channels.health import ChannelHealth
from nanobot.lanes import Lanes

RESTART_DELAYS = (1.0, 2.0, 5.0, 15.0, 30.0, 60.0)
STABLE_AFTER = 60.0  # seconds connected after which a crash starts the backoff afresh
DELIVERY_RETRIES = (2.0, 5.0, 15.0)
# What a channel that cannot reach its platform raises (no network at boot, DNS, a refused
# or timed-out connection): routine on a laptop or before the network is up, so one warning
# per try, no traceback.
UNREACHABLE = (ChannelUnreachable, ConnectionError, TimeoutError, socket.gaierror)


class ChannelManager:
    """Owns the channels' tasks. `run()` until cancelled; `drain()` before stopping."""

    def __init__(
        self,
        channels: Sequence[Channel],
        bus: MessageBus,
        outbox: OutboxPort,
        health: ChannelHealth | None = None,
        voices: Voices | None = None,
    ) -> None:
        """`health` records each channel's state as it changes (in memory only if None).
        `voices` makes the audio of replies to be spoken (None: they go as text only)."""
        self._channels = list(channels)
        self._voices = voices
        self.health = health or ChannelHealth(
            [c.name for c in self._channels], None, lambda: datetime.now(UTC)
        )
        self._bus = bus
        self._outbox = outbox
        self._ready = {c.name: asyncio.Event() for c in self._channels}
        self._idle = {c.name: asyncio.Event() for c in self._channels}
        # Chats closed to the bot, (channel, chat id) → why; until the chat writes again.
        self._closed: dict[tuple[str, str], str] = {}
        self._stopped_for_good: set[str] = set()  # channels stopped for good (`ChannelRefused`)
        # Set once every channel has stopped for good: nothing comes in or goes out any more.
        self.all_refused = asyncio.Event()

    @property
    def names(self) -> list[str]:
        return [c.name for c in self._channels]

    async def run(self) -> None:
        """Run and deliver for every channel until cancelled or the outbound side closes."""
        async with asyncio.TaskGroup() as group:
            for channel in self._channels:
                group.create_task(self._supervise(channel), name=f"channel-{channel.name}")
                group.create_task(self._deliver(channel), name=f"deliver-{channel.name}")

    async def drain(self) -> None:
        """Until every outbound queue is empty and no delivery is in progress."""
        for channel in self._channels:
            while self._bus.pending(channel.name) or not self._idle[channel.name].is_set():
                self._idle[channel.name].clear()
                await self._idle[channel.name].wait()

    async def _supervise(self, channel: Channel) -> None:
        attempt = 0
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()

            def ready(channel: Channel = channel) -> None:
                logger.info("{} connected", channel.name)
                self.health.connected(channel.name)
                self._ready[channel.name].set()

            unreachable = None
            try:
                await channel.run(ready)
                logger.warning("{} stopped by itself; restarting", channel.name)
                self.health.failed(channel.name, "stopped by itself")
            except ChannelRefused as exc:  # it would be refused again: no restart, no traceback
                logger.error("{} stopped: {}", channel.name, exc)
                self.health.failed(channel.name, str(exc), for_good=True)
                self._stopped_for_good.add(channel.name)
                if self._stopped_for_good >= set(self.names):
                    logger.error(
                        "every channel was refused; none is left running: the gateway stops "
                        "with exit 2 (a configuration error: fix it, then start it again)"
                    )
                    self.all_refused.set()
                return
            except UNREACHABLE as exc:
                unreachable = _reason(exc)
                self.health.failed(channel.name, unreachable)
            except Exception as exc:  # noqa: BLE001 - a channel crash must not end the gateway
                logger.opt(exception=exc).error("{} crashed: {}", channel.name, exc)
                self.health.failed(channel.name, _reason(exc))
            if loop.time() - started > STABLE_AFTER:
                attempt = 0
            delay = RESTART_DELAYS[min(attempt, len(RESTART_DELAYS) - 1)]
            attempt += 1
            if unreachable is not None:  # routine offline: one line a try, no traceback
                logger.warning(
                    "{} cannot reach its platform ({}); trying again in {:.0f}s",
                    channel.name,
                    unreachable,
                    delay,
                )
            else:
                logger.info("restarting {} in {:.0f}s", channel.name, delay)
            await asyncio.sleep(delay)

    async def _deliver(self, channel: Channel) -> None:
        """Drain the channel's queue: chats in parallel (a slow or failing chat holds up no
        other), each chat's items strictly in order."""
        idle = self._idle[channel.name]
        idle.set()
        await self._ready[channel.name].wait()
        lanes: Lanes[ChatRef] = Lanes(name=f"deliver-{channel.name}")  # unbounded: see above
        outstanding = 0  # items taken from the queue and not yet delivered (or given up)

        async def deliver(item: Outbound) -> None:
            nonlocal outstanding
            try:
                await self._deliver_one(channel, item)
            finally:
                outstanding -= 1
                if not outstanding and not self._bus.pending(channel.name):
                    idle.set()

        try:
            async for item in self._bus.outbound(channel.name):
                idle.clear()
                outstanding += 1
                lanes.add(item.chat, deliver(item))
        except BaseException:
            await lanes.close()  # cancelled: what is left stays in the outbox
            raise
        else:
            await lanes.close(grace=None)  # the queue ended: deliver what was taken
        finally:
            idle.set()

    async def _deliver_one(self, channel: Channel, item: Outbound) -> None:
        message = item if isinstance(item, OutboundMessage) else None
        if self._skipped(item):
            if message is not None:
                reason = self._closed[_chat_key(item.chat)]
                logger.debug("{} chat {}: not sent, {}", channel.name, item.chat.chat_id, reason)
                await self._give_up(channel, message, f"not sent: {reason}")
            return
        if message is not None:
            item = message = await self._prepared(channel, message)
        for delay in (*DELIVERY_RETRIES, None):
            try:
                sent_id = await channel.deliver(item)
            except Undeliverable as exc:
                if message is not None:
                    await self._refused(channel, message, exc)
                return
            except DeliveryError as exc:
                if message is None:
                    return
                await self._failed(message, str(exc))
                if delay is None:
                    logger.error(
                        "could not deliver to {} chat {}; kept for the next start: {}",
                        channel.name,
                        message.chat.chat_id,
                        exc,
                    )
                    return
                await asyncio.sleep(delay)
                continue
            except Exception as exc:  # noqa: BLE001 - a delivery bug must not stop the queue
                logger.exception("delivering to {} failed", channel.name)
                if message is not None:  # counted like any failed attempt, kept for later
                    await self._failed(message, f"{type(exc).__name__}: {exc}")
                return
            if message is not None and message.outbox_id is not None:
                await self._outbox.confirm(message.outbox_id, sent_id)
            return

    async def _prepared(self, channel: Channel, message: OutboundMessage) -> OutboundMessage:
        """`message` with what the channel needs beside it: the platform id of the message
        it edits, the audio of its spoken form."""
        if message.edits is not None:
            message = replace(message, replaces=await self._replaced(message.edits))
        if message.speak and not message.parts_sent:  # else its voice note is out already
            message = replace(message, voice=await self._voice(channel, message))
        return message

    async def _voice(self, channel: Channel, message: OutboundMessage) -> Path | None:
        """The audio of a reply to be spoken; None (the text goes alone) when none is made."""
        if self._voices is None:
            return None
        try:
            return await self._voices.voice(message)
        except Exception:  # noqa: BLE001 - a bug in speech must not hold the text back
            logger.exception("{}: the speech of reply {} failed", channel.name, message.outbox_id)
            return None

    async def _failed(self, message: OutboundMessage, error: str) -> None:
        """Record a failed attempt to deliver `message`; it stays owed."""
        if message.outbox_id is not None:
            await self._outbox.fail(message.outbox_id, error)

    async def _replaced(self, outbox_id: int) -> str | None:
        """The platform id of the message an edit replaces; None (post it anew) when it
        never went out or cannot be read."""
        try:
            return await self._outbox.sent_id(outbox_id)
        except Exception:  # noqa: BLE001 - storage trouble: a new message is the fallback
            logger.exception("could not read which message outbox row {} was", outbox_id)
            return None

    def _skipped(self, item: Outbound) -> bool:
        """Whether `item` is for a chat closed to the bot. An item answering one of the
        chat's messages reopens it: the chat wrote again."""
        key = _chat_key(item.chat)
        if key not in self._closed:
            return False
        answers = isinstance(item, OutboundMessage | StreamUpdate) and item.reply_to is not None
        if answers:
            del self._closed[key]
            logger.info("{} chat {} wrote again; sending there again", *key)
            return False
        return not (isinstance(item, Typing) and not item.active)  # a turn's end still counts

    async def _refused(
        self, channel: Channel, message: OutboundMessage, exc: Undeliverable
    ) -> None:
        """The platform refused `message` for good: say so once, and give it up."""
        chat = message.chat.chat_id
        if exc.chat_closed:
            self._closed[_chat_key(message.chat)] = f"the chat is closed to the bot ({exc})"
            logger.warning(
                "{} chat {} takes no messages from the bot: {}; nothing more is sent there "
                "until it writes again",
                channel.name,
                chat,
                exc,
            )
        else:
            logger.warning("{} refused a reply to chat {}; given up: {}", channel.name, chat, exc)
        await self._give_up(channel, message, str(exc))

    async def _give_up(self, channel: Channel, message: OutboundMessage, reason: str) -> None:
        if message.outbox_id is None:
            return
        try:
            await self._outbox.give_up(message.outbox_id, reason)
        except Exception:  # noqa: BLE001 - at worst it is tried once more after a restart
            logger.opt(exception=True).warning(
                "{}: could not mark reply {} failed", channel.name, message.outbox_id
            )


def _chat_key(chat: ChatRef) -> tuple[str, str]:
    """A chat as a whole, every thread or topic in it: what a platform closes to the bot."""
    return chat.channel, chat.chat_id


def _reason(exc: BaseException) -> str:
    """A failure in one line: its text, or its kind where it has none (a bare timeout)."""
    return str(exc) or type(exc).__name__
