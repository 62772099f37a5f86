"""Waiting out a paused intake: what a channel does while a store failure has stopped the gate.

While the state database cannot be written, intake refuses every message with
`IntakePaused`, saying when it tries the store again. A channel neither fails nor drops a
message over that: the message waits where it is (Telegram leaves its update unacknowledged,
Discord keeps it in its chat's lane) and is handed over again. Only the first message that
met the pause tries again, when intake says (it probes the store); the others wait until a
hand-over succeeds, then all go ahead. The channel logs one line when the pause begins and
one when it ends, whatever the number of messages held meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from loguru import logger

from nanobot.bus.intake import IntakePaused

_T = TypeVar("_T")

Sleep = Callable[[float], Awaitable[None]]


class _Held:
    """One pause: since when, and an event set when it is over."""

    def __init__(self) -> None:
        self.since = time.monotonic()
        self.over = asyncio.Event()


class Pause:
    """A channel's view of a paused intake; one per channel, for all of its runs. `sleep`
    waits until the next try (tests pass one that does not)."""

    def __init__(self, channel: str, *, sleep: Sleep = asyncio.sleep) -> None:
        self._channel = channel
        self._sleep = sleep
        self._held: _Held | None = None

    @property
    def paused(self) -> bool:
        return self._held is not None

    async def opened(self) -> None:
        """Return once no pause is on: at once, or when a hand-over got through again."""
        while (held := self._held) is not None:
            await held.over.wait()

    async def hand_over(self, hand: Callable[[], Awaitable[_T]]) -> _T:
        """Return what `hand()` returns, calling it again for as long as it raises
        `IntakePaused` (see the module docstring). What else it raises is raised.
        Cancellation is safe: a probe cancelled while it waits leaves probing to the next
        message that meets the pause."""
        mine: _Held | None = None  # the pause this call probes for, if it does
        try:
            while True:
                held = self._held
                if held is not None and held is not mine:
                    await held.over.wait()
                try:
                    result = await hand()
                except IntakePaused as exc:
                    if self._held is None:
                        mine = self._held = _Held()
                        logger.warning(
                            "{}: intake paused, the state database cannot be written ({}); "
                            "messages wait and are taken once it can "
                            "(next try in {:.0f}s)",
                            self._channel,
                            exc.reason,
                            exc.retry_in,
                        )
                    if self._held is mine:
                        await self._sleep(exc.retry_in)
                    continue
                if mine is not None:
                    logger.info(
                        "{}: intake resumed after {:.0f}s",
                        self._channel,
                        time.monotonic() - mine.since,
                    )
                return result
        finally:
            if mine is not None and self._held is mine:
                self._held = None
                mine.over.set()
