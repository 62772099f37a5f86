"""The messages of one session handed to the agent loop in the order they came.

Each message is taken in a task of its own, and reading its files (a voice note heard, a
PDF read) takes from nothing to seconds: without an order, a question sent right after a
document reached the loop first, was answered without it, and the document came after.
Reading stays concurrent; only the handing over waits for the messages before.
"""

from __future__ import annotations

import asyncio


class Arrivals:
    """Per key, tickets in the order `ticket` was called."""

    def __init__(self) -> None:
        self._last: dict[str, asyncio.Future[None]] = {}

    def ticket(self, key: str) -> Ticket:
        """A place after every ticket of `key` not yet handed on. Call it as the message
        arrives, with no await between its arrival and this call."""
        mine = asyncio.get_running_loop().create_future()
        previous, self._last[key] = self._last.get(key), mine
        return Ticket(self._last, key, previous, mine)


class Ticket:
    """One message's place: `wait` until the messages before it are with the loop, then
    `handed` once this one is (or never will be)."""

    def __init__(
        self,
        last: dict[str, asyncio.Future[None]],
        key: str,
        previous: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
    ) -> None:
        self._last, self._key = last, key
        self._previous, self._mine = previous, mine

    async def wait(self) -> None:
        """Until every earlier message of the key is handed on. Cancellable (the earlier
        ones are not affected)."""
        if self._previous is not None:
            await asyncio.shield(self._previous)

    def handed(self) -> None:
        """This message is with the loop, or was answered or dropped without it: the next
        one may go, once the earlier ones have (an order kept even when this one failed
        before its turn). Idempotent; never raises."""
        previous = self._previous
        if previous is None or previous.done():
            self._go()
        else:
            previous.add_done_callback(lambda _: self._go())

    def _go(self) -> None:
        if not self._mine.done():
            self._mine.set_result(None)
        if self._last.get(self._key) is self._mine:
            del self._last[self._key]
