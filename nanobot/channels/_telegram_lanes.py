"""Per-chat lanes for Telegram intake: in order within a chat, concurrently across chats.

Taken one after another, one chat's slow update (a file to download, a journal write behind a
busy event loop) would hold up every other chat's. Each item runs in a task of its own that
first waits for the end of the item before it with the same key.

Kept small and free of Telegram so the shared per-key lanes primitive can replace it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Lanes(Generic[T]):
    """Runs `work(item)` for every item `add`ed: in order per key, concurrently across keys.

    `work` must not raise (what it raises is left in its task and ignored here). The lanes own
    their tasks: `close()` cancels the ones still running or waiting and awaits them all.
    """

    def __init__(self, work: Callable[[T], Awaitable[None]]) -> None:
        self._work = work
        self._tails: dict[Hashable, asyncio.Task[None]] = {}  # the last task of each key
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def busy(self) -> bool:
        """Whether an item added is not done yet."""
        return bool(self._tasks)

    def add(self, key: Hashable, item: T, *, name: str) -> None:
        """Start `work(item)` once `key`'s earlier items are done; returns at once."""
        task = asyncio.create_task(self._run(self._tails.get(key), item), name=name)
        self._tails[key] = task
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._forget(key, done))

    async def wait(self, seconds: float) -> None:
        """Until every item added so far is done, or for `seconds` at most."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=seconds)

    async def close(self) -> None:
        """Cancel every item not done and wait for them; the lanes stay usable."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _run(self, before: asyncio.Task[None] | None, item: T) -> None:
        if before is not None:
            await asyncio.wait([before])  # its outcome is its own; only its end matters
        await self._work(item)

    def _forget(self, key: Hashable, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._tails.get(key) is task:
            del self._tails[key]
        if not task.cancelled():
            task.exception()  # retrieved: `work` reports its own failures
