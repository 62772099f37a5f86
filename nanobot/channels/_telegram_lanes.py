"""Taking Telegram updates: concurrently across chats, in order within a chat.

PTB's Updater hands over a whole getUpdates batch and then asks for the next batch with a
higher offset, which is what confirms the first. Taken one after another, one chat's slow
update (a file to download, a journal write behind a busy event loop) held up every other
chat's. Here each chat's updates run in a lane of their own, and before the next getUpdates
request (`before_poll`) waits a moment for them. Updates still being taken then are not
waited for: the request asks again from the oldest of them (a lower offset confirms only
what came before it), so other chats' new messages come in meanwhile. What comes again and
is in hand already is skipped here; nothing is confirmed before the journal has it. (An
answer holds at most 100 updates, so while one is still being taken, at most the 99 after
it come in.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable

from loguru import logger
from telegram import Update
from telegram.error import NetworkError

POLL_PATIENCE = 1.0  # seconds a poll waits for updates still being taken before going ahead

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
    `before_poll()` raises `Unconfirmed` from then on: all of them come again
    after the channel restarts (a redelivery of one already journaled is recognised there).
    """

    def __init__(self, take: Take, *, patience: float = POLL_PATIENCE) -> None:
        """`patience`: seconds `before_poll` waits for the takes in progress."""
        self._take = take
        self._patience = patience
        self._lanes: dict[Hashable, asyncio.Task[None]] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._running: set[int] = set()  # ids of updates added and not yet taken
        self._taken: set[int] = set()  # ids taken that a poll has not confirmed yet
        self._failed = False

    def add(self, update: Update) -> None:
        """Start taking `update` after its chat's earlier updates; returns at once.

        An update already in hand (being taken, or taken and not yet confirmed) is skipped:
        it came again because a poll asked from an older one.
        """
        update_id = update.update_id
        if update_id in self._running or update_id in self._taken:
            return
        chat = update.effective_chat
        key = chat.id if chat is not None else None
        task = asyncio.create_task(
            self._run(self._lanes.get(key), update), name=f"telegram-take-{update_id}"
        )
        self._running.add(update_id)
        self._lanes[key] = task
        self._pending.add(task)
        task.add_done_callback(lambda done: self._forget(key, done))

    async def before_poll(self, fields: dict[str, str]) -> None:
        """Ready the getUpdates request whose form is `fields`: wait up to `patience` for
        the takes in progress; if some are still running, lower its `offset` to the oldest of
        them, so the request confirms only updates already taken. Its answer then repeats the
        updates in hand (skipped by `add`) and brings any new ones.

        Raises:
            Unconfirmed: an update could not be taken (see the class); the request is not
                made.
        """
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=self._patience)
        if self._failed:
            raise Unconfirmed("an update could not be taken; it is left for redelivery")
        offset = int(fields.get("offset") or 0)
        if self._running and offset > 0:
            offset = min(offset, *self._running)
            fields["offset"] = str(offset)
        self._taken = {update_id for update_id in self._taken if update_id >= offset}

    async def close(self) -> None:
        """Cancel the takes still running and wait for them; the lanes stay usable."""
        for task in self._pending:
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    async def _run(self, before: asyncio.Task[None] | None, update: Update) -> None:
        try:
            if before is not None:
                await asyncio.wait([before])  # its outcome is its own; only its end matters
            if self._failed:
                return
            try:
                taken = await self._take(update)
            except Exception:  # noqa: BLE001 - `take` reports its own failures; never lost
                logger.exception("telegram: taking update {} failed", update.update_id)
                taken = False
            except BaseException:  # cancelled: not taken either
                self._failed = True
                raise
            if taken:
                self._taken.add(update.update_id)
            else:
                self._failed = True
        finally:
            self._running.discard(update.update_id)

    def _forget(self, key: Hashable, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if self._lanes.get(key) is task:
            del self._lanes[key]
