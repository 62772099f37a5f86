"""The ChannelManager: runs every enabled channel and delivers its outbound traffic.

Each channel gets two tasks: a supervisor that runs it and restarts it with backoff when it
crashes, and a delivery task that drains its outbound queue, so a slow platform never delays
another; within a channel, chats are delivered to in parallel, each chat in order. A reply
is confirmed (its outbox row marked delivered) only after the platform accepted it; one that
still fails after retries stays in the outbox for the next start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from loguru import logger

from nanobot.bus.events import ChatRef, Outbound, OutboundMessage
from nanobot.bus.queue import MessageBus
from nanobot.channels.base import Channel, DeliveryError, OutboxPort
from nanobot.lanes import Lanes

RESTART_DELAYS = (1.0, 2.0, 5.0, 15.0, 30.0, 60.0)
STABLE_AFTER = 60.0  # seconds connected after which a crash starts the backoff afresh
DELIVERY_RETRIES = (2.0, 5.0, 15.0)
PARALLEL_CHATS = 32  # chats of one channel delivered to at the same time


class ChannelManager:
    """Owns the channels' tasks. `run()` until cancelled; `drain()` before stopping."""

    def __init__(
        self,
        channels: Sequence[Channel],
        bus: MessageBus,
        outbox: OutboxPort,
    ) -> None:
        self._channels = list(channels)
        self._bus = bus
        self._outbox = outbox
        self._ready = {c.name: asyncio.Event() for c in self._channels}
        self._idle = {c.name: asyncio.Event() for c in self._channels}

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
                self._ready[channel.name].set()

            try:
                await channel.run(ready)
                logger.warning("{} stopped by itself; restarting", channel.name)
            except Exception as exc:  # noqa: BLE001 - a channel crash must not end the gateway
                logger.opt(exception=exc).error("{} crashed: {}", channel.name, exc)
            if loop.time() - started > STABLE_AFTER:
                attempt = 0
            delay = RESTART_DELAYS[min(attempt, len(RESTART_DELAYS) - 1)]
            attempt += 1
            logger.info("restarting {} in {:.0f}s", channel.name, delay)
            await asyncio.sleep(delay)

    async def _deliver(self, channel: Channel) -> None:
        """Drain the channel's queue: chats in parallel (a slow or failing chat holds up no
        other), each chat's items strictly in order."""
        idle = self._idle[channel.name]
        idle.set()
        await self._ready[channel.name].wait()
        lanes: Lanes[ChatRef] = Lanes(limit=PARALLEL_CHATS, name=f"deliver-{channel.name}")
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
        for delay in (*DELIVERY_RETRIES, None):
            try:
                await channel.deliver(item)
            except DeliveryError as exc:
                if message is None:
                    return
                if message.outbox_id is not None:
                    await self._outbox.fail(message.outbox_id, str(exc))
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
            except Exception:  # noqa: BLE001 - a delivery bug must not stop the queue
                logger.exception("delivering to {} failed", channel.name)
                return
            if message is not None and message.outbox_id is not None:
                await self._outbox.confirm(message.outbox_id)
            return
