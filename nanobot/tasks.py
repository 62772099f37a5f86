"""TaskSet: a set of tasks that has an owner.

Whoever starts background work keeps its tasks here instead of in a set of its own: the
set names them, forgets them when they end, logs what they raise, and on `close()` lets them
finish for a while, then cancels and awaits the rest. Nothing started through it is ever
fire-and-forget. Every layer may use it: it imports nothing of nanobot.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from loguru import logger

T = TypeVar("T")


class TaskSet:
    """The running tasks of one owner.

    `spawn` starts a task and keeps it until it ends. A task's exception (not its
    cancellation) is logged once, with its traceback, when it ends: that is the boundary,
    so a task needs no broad `except` of its own unless it has something better to do.

    `close(grace)` ends them all: running tasks get up to `grace` seconds, the rest are
    cancelled, and it returns when every task has ended. Closing is not a state: the owner
    decides whether it takes new work afterwards (a channel that reconnects starts tasks
    again), so `spawn` always works.
    """

    def __init__(self, name: str = "tasks") -> None:
        """`name` prefixes the log line of a task that failed."""
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        """The tasks still running (a copy: safe to iterate while they end)."""
        return iter(list(self._tasks))

    def spawn(
        self, work: Coroutine[Any, Any, T], *, name: str, fresh: bool = False
    ) -> asyncio.Task[T]:
        """Start `work` as a task named `name` and keep it until it ends. `fresh`: in an
        empty context, not a copy of the caller's (its context variables at their
        defaults)."""
        context = contextvars.Context() if fresh else None
        task = asyncio.get_running_loop().create_task(work, name=name, context=context)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    async def close(self, grace: float | None = 0.0) -> None:
        """Wait up to `grace` seconds (None: as long as it takes) for the tasks, including
        any they start meanwhile, then cancel those still running and await every one.

        Never raises what the tasks raise (that is logged). If `close` itself is
        cancelled while it waits, it still cancels and awaits the tasks, then re-raises.
        """
        try:
            if grace is None or grace > 0:
                await self._wait(grace)
        finally:
            while self._tasks:
                tasks = list(self._tasks)
                for task in tasks:
                    task.cancel()
                await asyncio.wait(tasks)

    async def _wait(self, grace: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if grace is None else loop.time() + grace
        while self._tasks:
            timeout = None if deadline is None else deadline - loop.time()
            if timeout is not None and timeout <= 0:
                return
            await asyncio.wait(list(self._tasks), timeout=timeout)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            logger.opt(exception=error).error("{}: task {} failed", self._name, task.get_name())
