"""Lanes: work per key strictly in order, different keys at the same time, optionally bounded.

Each key (a chat, a session) has a lane while it has work: items of one key run one after
another in the order they came, items of different keys run concurrently, and with a `limit`
at most that many items run at once over all keys (the others wait for a slot, first come
first served). A lane exists only while its key has an item running or waiting, so memory
follows the work in hand, not the number of keys ever seen.

An item is a coroutine, given in one of two ways:
- `add(key, work)` queues it and returns at once. The lanes own the task that takes a key's
  queued items (one task per key while it has work, not one per item).
- `await run(key, work)` runs it in the caller's own task once its turn comes and returns
  its result: no task at all, for the hot path of the agent loop.

Every layer may use it: it imports nothing of nanobot but the task set.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine, Hashable, Iterator
from typing import Any, Generic, TypeVar

from loguru import logger

from nanobot.tasks import TaskSet

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")

Work = Coroutine[Any, Any, Any]


class Closed(RuntimeError):
    """The lanes were closed before the item could start; it never ran."""


_Lane = deque[Work | asyncio.Future[None]]
"""A key's items that have not started, in order: coroutines from `add`, and the futures
of `run` callers waiting for their turn. Its item in progress is not in it. A lane is held
by one thing at a time: its taker task or a `run` caller, who hands it on when done."""


class Lanes(Generic[K]):
    """Per key in order, concurrently across keys, at most `limit` items running at once.

    An item that raises does not stop its lane: for `add`, the exception is logged
    (`logger.exception`) and the lane goes on with the next item; for `run`, the caller
    gets it.

    `close(grace)` is the one way to stop: it takes no new items, lets the lanes go on for
    up to `grace` seconds, then drops what has not started (coroutines are closed unrun,
    waiting `run` callers get `Closed`), cancels the items it owns (from `add`) and awaits
    them. An item from `run` belongs to its caller's task, which `close` never cancels.
    """

    def __init__(self, *, limit: int | None = None, name: str = "lane") -> None:
        """`limit`: at most this many items run at once over all keys (None: no bound).
        `name` names the tasks (`{name}-{key}`) and the log lines."""
        self._name = name
        self._slots = asyncio.Semaphore(limit) if limit is not None else None
        self._lanes: dict[K, _Lane] = {}
        self._takers = TaskSet(name)
        self._closed = False
        self._empty: asyncio.Event | None = None  # set when the last lane goes; for close

    def __len__(self) -> int:
        """How many keys have an item running or waiting."""
        return len(self._lanes)

    def __contains__(self, key: object) -> bool:
        return key in self._lanes

    def __iter__(self) -> Iterator[K]:
        """The keys that have an item running or waiting (a copy)."""
        return iter(list(self._lanes))

    def busy(self, key: K) -> bool:
        """Whether `key` has an item running or waiting: a new one would wait."""
        return key in self._lanes

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def waiting(self) -> int:
        """How many items have not started yet, over all keys."""
        return sum(len(lane) for lane in self._lanes.values())

    def add(self, key: K, work: Work) -> None:
        """Queue `work` behind `key`'s earlier items; returns at once.

        Raises:
            Closed: the lanes are closed (`work` is closed unrun).
        """
        if self._closed:
            work.close()
            raise Closed(f"{self._name}: closed")
        lane = self._lanes.get(key)
        if lane is not None:
            lane.append(work)
            return
        lane = self._lanes[key] = deque((work,))
        self._takers.spawn(self._take(key, lane), name=f"{self._name}-{key}")

    async def run(self, key: K, work: Coroutine[Any, Any, R]) -> R:
        """Run `work` in this task after `key`'s earlier items, once a slot is free; return
        its result or raise its exception.

        Raises:
            Closed: the lanes were closed before its turn came (`work` is closed unrun).

        Cancellation-safe: cancelled while waiting, `work` is closed unrun and the lane goes
        on without it; cancelled while running, the lane goes on with the next item.
        """
        if self._closed:
            work.close()
            raise Closed(f"{self._name}: closed")
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = deque()
        else:
            turn = asyncio.get_running_loop().create_future()
            lane.append(turn)
            try:
                await turn
            except BaseException:
                work.close()
                if turn.done() and not turn.cancelled() and turn.exception() is None:
                    self._next(key, lane)  # given the turn, but cancelled before it began
                raise
        # The slot is taken here rather than through `_slotted`: one coroutine less on the
        # agent loop's hot path.
        slots = self._slots
        try:
            if slots is None:
                return await work
            try:
                await slots.acquire()
            except BaseException:
                work.close()
                raise
            try:
                return await work
            finally:
                slots.release()
        finally:
            self._next(key, lane)

    async def close(self, grace: float | None = 0.0) -> int:
        """Stop taking items; give the lanes up to `grace` seconds (None: as long as they
        need) to go on, queued items starting meanwhile; then drop the items not started,
        cancel the running ones from `add`, and await them. Returns how many items were
        dropped unrun.

        If `close` itself is cancelled while it gives the lanes time, it still drops,
        cancels and awaits, then re-raises.
        """
        self._closed = True
        try:
            if (grace is None or grace > 0) and self._lanes:
                self._empty = asyncio.Event()
                async with asyncio.timeout(grace):
                    await self._empty.wait()
        except TimeoutError:
            pass
        finally:
            dropped = self._drop_waiting()
            await self._takers.close()
        return dropped

    def _drop_waiting(self) -> int:
        dropped = 0
        for lane in list(self._lanes.values()):
            while lane:
                item = lane.popleft()
                if isinstance(item, asyncio.Future):
                    if not item.done():
                        item.set_exception(Closed(f"{self._name}: closed"))
                        dropped += 1
                else:
                    item.close()
                    dropped += 1
        return dropped

    async def _take(self, key: K, lane: _Lane) -> None:
        """Take `key`'s queued coroutines in order, until the queue is empty or its head is
        a `run` caller, who is then handed the lane."""
        try:
            while lane:
                work = lane[0]
                if isinstance(work, asyncio.Future):
                    break
                lane.popleft()
                try:
                    await (work if self._slots is None else self._slotted(work))
                except Exception:  # noqa: BLE001 - the item's boundary: the lane goes on
                    logger.exception("{}: an item of {} failed", self._name, key)
        finally:
            self._next(key, lane)

    async def _slotted(self, work: Coroutine[Any, Any, R]) -> R:
        if self._slots is None:
            return await work
        try:
            await self._slots.acquire()
        except BaseException:
            work.close()
            raise
        try:
            return await work
        finally:
            self._slots.release()

    def _next(self, key: K, lane: _Lane) -> None:
        """The lane's item ended: hand the lane to the next one, or drop it."""
        while lane:
            head = lane[0]
            if not isinstance(head, asyncio.Future):
                self._takers.spawn(self._take(key, lane), name=f"{self._name}-{key}")
                return
            lane.popleft()
            if not head.done():  # else its caller was cancelled while waiting
                head.set_result(None)
                return
        del self._lanes[key]
        if not self._lanes and self._empty is not None:
            self._empty.set()
