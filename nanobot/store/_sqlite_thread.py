"""The thread that owns the SQLite connection: calls queue up and run one at a time, in the
order they were submitted, and their results go back to the event loop in batches, one
wake-up for all that finished together (see `nanobot.store.sqlite`)."""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Final, TypeVar

# Results go back to the loop at least this often while statements keep coming.
_SETTLE_EVERY: Final = 64

_T = TypeVar("_T")


class Worker:
    """The thread that owns the sqlite3 connection and runs calls on it, one at a time, in
    the order they were submitted."""

    def __init__(self, loop: asyncio.AbstractEventLoop, uri: str) -> None:
        self._loop = loop
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._opened: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(
            target=self._serve, args=(uri,), name="nanobot-sqlite", daemon=True
        )

    @classmethod
    async def start(cls, uri: str) -> Worker:
        """Open `uri` (autocommit; rows by index or by name) in a new thread.

        Raises:
            sqlite3.Error: it could not be opened (the thread has ended).
        """
        worker = cls(asyncio.get_running_loop(), uri)
        worker._thread.start()
        await worker._opened
        return worker

    def submit(self, call: Callable[[sqlite3.Connection], _T]) -> asyncio.Future[_T]:
        """Queue `call(connection)`; the future gets its result or exception. Never blocks."""
        future: asyncio.Future[_T] = self._loop.create_future()
        self._queue.put((call, future))
        return future

    async def stop(self) -> None:
        """Close the connection once every call submitted so far has run; end the thread."""
        try:
            await self.submit(_close)
        finally:
            self._queue.put(None)

    def _serve(self, uri: str) -> None:
        try:
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
        except BaseException as exc:  # noqa: BLE001 - handed to the task opening it
            self._settle([(self._opened, None, exc)])
            return
        done: list[_Done] = [(self._opened, None, None)]
        while True:
            try:
                job = self._queue.get(block=not done)
            except queue.Empty:  # nothing more for now: hand back what has finished
                self._settle(done)
                done = []
                continue
            if job is None:
                self._settle(done)
                return
            call, future = job
            try:
                done.append((future, call(conn), None))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                done.append((future, None, exc))
            if len(done) >= _SETTLE_EVERY:
                self._settle(done)
                done = []

    def _settle(self, done: list[_Done]) -> None:
        # One wake-up of the loop for every result that is ready.
        if done:
            with suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                self._loop.call_soon_threadsafe(_resolve, done)


_Job = tuple[Callable[[sqlite3.Connection], Any], "asyncio.Future[Any]"]
_Done = tuple["asyncio.Future[Any]", Any, BaseException | None]


def _resolve(done: list[_Done]) -> None:
    for future, result, exc in done:
        if future.cancelled():  # its task was cancelled while the call ran
            continue
        if exc is None:
            future.set_result(result)
        else:
            future.set_exception(exc)


def _close(conn: sqlite3.Connection) -> None:
    conn.close()
