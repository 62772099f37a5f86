"""Writes that many tasks hand in at once, sent to the database together.

On PostgreSQL every statement is a round trip to another process, and its cost (the
driver's work on the event loop, the server's) is paid per statement, not per row. When a
thousand chats are answered at once, a thousand tasks append an entry or confirm a reply at
about the same moment: `Together` sends what they hand in as one statement.

No item waits for a timer. The first item starts a write at the event loop's next turn,
carrying every item handed in until then; items that come while it is under way go in the
next write, which starts as soon as it ends. Alone, an item is written at once, as it would
have been on its own; under load, one round trip carries many.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Generic, TypeVar

from nanobot.errors import StoreError
from nanobot.tasks import TaskSet

T = TypeVar("T")
R = TypeVar("R")

MOST: Final = 100
"""Items one write carries at most, unless its owner says otherwise."""


class Together(Generic[T, R]):
    """Items written together by `write`, which takes a batch (at most `most` items, in
    the order they were handed in) and returns one result per item, in that order."""

    def __init__(
        self,
        write: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        *,
        name: str,
        most: int,
        applies: Callable[[], bool] = lambda: True,
    ) -> None:
        """`applies`: whether the calling task may hand its item in now (not inside a
        `transaction()` block, whose statements must run on its own connection)."""
        self._write = write
        self._name = name
        self._most = most
        self._applies = applies
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._tasks = TaskSet(name)

    def applies(self) -> bool:
        """Whether the calling task may hand an item in now (else it writes on its own)."""
        return self._applies()

    async def __call__(self, item: T) -> R:
        """Write `item` with whatever else is handed in meanwhile; its result.

        Raises what writing it raised. A write of several that fails over what it said (a
        constraint, a missing row: nothing of it was kept) is made again item by item, so
        an item fails only for itself; one that fails for want of storage fails them all
        (it may or may not have run, and the next would meet the same). Cancelling the
        caller does not take the item back: it may or may not be written, as a statement
        whose caller was cancelled.
        """
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._writer is None:
            # In a context of its own: the writes belong to no caller's block or context.
            self._writer = self._tasks.spawn(self._drain(), name=self._name, fresh=True)
        return await future

    async def close(self) -> None:
        """Wait for the writes under way and those waiting to start."""
        await self._tasks.close(grace=None)

    async def _settle(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        results = await self._write([item for item, _ in batch])
        if len(results) != len(batch):
            raise AssertionError(f"{self._name}: {len(results)} results for {len(batch)}")
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def _drain(self) -> None:
        batch: list[tuple[T, asyncio.Future[R]]] = []
        try:
            while self._waiting:
                batch = self._waiting[: self._most]
                del self._waiting[: self._most]
                try:
                    await self._settle(batch)
                except StoreError as exc:
                    if exc.storage or len(batch) == 1:
                        _fail(batch, exc)
                        continue
                    for one in batch:  # only the item at fault fails
                        try:
                            await self._settle([one])
                        except Exception as alone:  # noqa: BLE001 - it is the caller's
                            _fail([one], alone)
                except Exception as exc:  # noqa: BLE001 - each caller gets it
                    _fail(batch, exc)
        finally:
            self._writer = None
            # Cancelled (the database closing): what it did not get to is not written.
            left, self._waiting = [*batch, *self._waiting], []
            _fail(left, StoreError(f"{self._name}: stopped before writing"))


async def write_one(
    together: Together[T, R] | None,
    write: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
    item: T,
) -> R:
    """`item`'s result, written with others' through `together` where it applies (see
    `Database.together`), else on its own by `write`, the same writer."""
    if together is not None and together.applies():
        return await together(item)
    [result] = await write([item])
    return result


def _fail(batch: Sequence[tuple[object, asyncio.Future[Any]]], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
