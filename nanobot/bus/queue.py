"""The MessageBus: bounded queues between channels and the agent.

Inbound is one queue that channels feed and the agent drains. Outbound is one queue per
channel, so a slow platform never holds up another. Queues are bounded: a producer that gets
ahead waits (back-pressure) instead of growing memory without limit. Best-effort traffic
(stream updates, typing) is dropped rather than waited for when a channel's queue is full.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final, Generic, TypeVar

from loguru import logger

from nanobot.bus.events import InboundMessage, Outbound, OutboundMessage

T = TypeVar("T")

INBOUND_SIZE = 1000
OUTBOUND_SIZE = 1000


class _Closed:
    """The sentinel that ends a queue's consumers."""


_CLOSED: Final = _Closed()


class _Stream(Generic[T]):
    """A bounded queue whose end-of-stream sentinel always fits.

    Capacity is a semaphore rather than the queue's own bound, so `close()` never waits.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._space = asyncio.Semaphore(size)
        self._queue: asyncio.Queue[tuple[T, bool] | _Closed] = asyncio.Queue()

    def __len__(self) -> int:
        return self._queue.qsize()

    async def put(self, item: T) -> None:
        await self._space.acquire()
        self._queue.put_nowait((item, True))

    def offer(self, item: T) -> bool:
        if self._queue.qsize() >= self._size:
            return False
        self._queue.put_nowait((item, False))  # not counted against the semaphore
        return True

    async def items(self) -> AsyncIterator[T]:
        while True:
            entry = await self._queue.get()
            if isinstance(entry, _Closed):
                self._queue.put_nowait(entry)  # let every other consumer see it too
                return
            item, counted = entry
            if counted:
                self._space.release()
            yield item

    def close(self) -> None:
        self._queue.put_nowait(_CLOSED)


class MessageBus:
    """Inbound messages for the agent; outbound traffic for each channel."""

    def __init__(
        self, inbound_size: int = INBOUND_SIZE, outbound_size: int = OUTBOUND_SIZE
    ) -> None:
        self._inbound: _Stream[InboundMessage] = _Stream(inbound_size)
        self._outbound: dict[str, _Stream[Outbound]] = {}
        self._outbound_size = outbound_size

    async def publish_inbound(self, message: InboundMessage) -> None:
        """Queue a message for the agent; waits while the queue is full."""
        await self._inbound.put(message)

    def inbound(self) -> AsyncIterator[InboundMessage]:
        """Inbound messages in arrival order, until `close_inbound()`."""
        return self._inbound.items()

    def close_inbound(self) -> None:
        """Stop intake: consumers finish what is queued, then their iteration ends."""
        self._inbound.close()

    async def publish(self, item: Outbound) -> None:
        """Send `item` towards its chat's channel.

        A message waits while that channel's queue is full; a stream update or typing signal
        is dropped instead (it is best effort, and the final message supersedes it).
        """
        if isinstance(item, OutboundMessage):
            await self._channel(item.chat.channel).put(item)
        else:
            self.offer(item)

    def offer(self, item: Outbound) -> bool:
        """Queue best-effort traffic without waiting; False (and dropped) when full."""
        if self._channel(item.chat.channel).offer(item):
            return True
        logger.debug("{} outbound queue full; dropped a {}", item.chat.channel, type(item).__name__)
        return False

    def outbound(self, channel: str) -> AsyncIterator[Outbound]:
        """Outbound traffic for `channel`, in order, until `close_outbound()`."""
        return self._channel(channel).items()

    def close_outbound(self) -> None:
        for stream in self._outbound.values():
            stream.close()

    def pending(self, channel: str) -> int:
        return len(self._channel(channel))

    def _channel(self, channel: str) -> _Stream[Outbound]:
        stream = self._outbound.get(channel)
        if stream is None:
            stream = self._outbound[channel] = _Stream(self._outbound_size)
        return stream
