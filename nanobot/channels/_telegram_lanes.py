"""Taking Telegram updates: concurrently across chats, in order within a chat.

PTB's Updater hands over a whole getUpdates batch and then asks for the next batch with a
higher offset, which is what confirms the first. Taken one after another, one chat's slow
update (a file to download, a journal write behind a busy event loop) held up every other
chat's. Here each chat's updates run in a lane of their own, and the next getUpdates request
first waits until every update handed over has been taken (`settled`): still nothing is
confirmed before the journal has it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable

from loguru import logger
from telegram import Update
from telegram.error import NetworkError

Take = Callable[[Update], Awaitable[bool]]
"""Takes one update; False when it could not be, so it must not be confirmed."""


class Unconfirmed(NetworkError):
    """An update handed over could not be taken: the poll that would confirm it is not made.

    A `NetworkError`, so PTB treats it as a failed getUpdates (retried; when stopping,
    logged and skipped): Telegram then delivers the update again after a restart.
    """


class IntakeLanes:
    """Runs `take` for every update `add`ed: in order per chat, concurrently across chats.

    Once a take returns False, later updates (of every chat) are no longer taken, and
    `settled()` raises `Unconfirmed` from then on: all of them come again after the channel
    restarts (a redelivery of one already journaled is recognised there).
    """

    def __init__(self, take: Take) -> None:
        self._take = take
        self._lanes: dict[Hashable, asyncio.Task[None]] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._failed = False

    def add(self, update: Update) -> None:
        """Start taking `update` after its chat's earlier updates; returns at once."""
        chat = update.effective_chat
        key = chat.id if chat is not None else None
        task = asyncio.create_task(
            self._run(self._lanes.get(key), update), name=f"telegram-take-{update.update_id}"
        )
        self._lanes[key] = task
        self._pending.add(task)
        task.add_done_callback(lambda done: self._forget(key, done))

    async def settled(self) -> None:
        """Wait until every update added so far has been taken.

        Raises:
            Unconfirmed: one of them could not be (see the class).
        """
        while self._pending:
            await asyncio.wait(set(self._pending))
        if self._failed:
            raise Unconfirmed("an update could not be taken; it is left for redelivery")

    async def close(self) -> None:
        """Cancel the takes still running and wait for them; the lanes stay usable."""
        for task in self._pending:
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    async def _run(self, before: asyncio.Task[None] | None, update: Update) -> None:
        if before is not None:
            await asyncio.wait([before])  # its outcome is its own; only its end matters here
        if self._failed:
            return
        try:
            taken = await self._take(update)
        except Exception:  # noqa: BLE001 - `take` reports its own failures; never lost here
            logger.exception("telegram: taking update {} failed", update.update_id)
            taken = False
        except BaseException:  # cancelled: not taken either
            self._failed = True
            raise
        if not taken:
            self._failed = True

    def _forget(self, key: Hashable, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if self._lanes.get(key) is task:
            del self._lanes[key]
