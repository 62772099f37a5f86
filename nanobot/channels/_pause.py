"""Waiting out a paused intake: what a channel does while a store failure has stopped the gate.

While the state database cannot be written, intake refuses every message with
`IntakePaused`, saying when it tries the store again. A channel neither fails nor drops a
message over that: the message waits where it is (Telegram leaves its update unacknowledged,
Discord keeps it in its chat's lane) and is handed over again. Only the first message that
met the pause tries again, when intake says (it probes the store); the others wait until a
hand-over succeeds, then all go ahead. The channel says the pause as an outage of its own
(`nanobot.outage`): one line when it begins and one when it ends, whatever the number of
messages held meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nanobot.bus.intake import IntakePaused
from nanobot.outage import Outage, Sleep, sleep_or_wake

_T = TypeVar("_T")


class Pause:
    """A channel's view of a paused intake; one per channel, for all of its runs. `now` and
    `sleep` are the clock the probe waits on until the next try (tests pass their own)."""

    def __init__(
        self,
        channel: str,
        *,
        now: Callable[[], float] = time.monotonic,
        sleep: Sleep = sleep_or_wake,
    ) -> None:
        self._outage = Outage(
            failing=f"{channel}: intake paused",
            effect="messages wait, unacknowledged, and are taken once the state database "
            "takes writes again",
            back=f"{channel}: intake resumed",
            now=now,
            sleep=sleep,
        )
        self._probe: asyncio.Event | None = None  # set once the current probe stops probing

    @property
    def paused(self) -> bool:
        return self._probe is not None

    async def opened(self) -> None:
        """Return once no pause is on: at once, or when a hand-over got through again (or
        its probe was cancelled: the next message that meets the pause probes)."""
        while (probe := self._probe) is not None:
            await probe.wait()

    async def hand_over(self, hand: Callable[[], Awaitable[_T]]) -> _T:
        """Return what `hand()` returns, calling it again for as long as it raises
        `IntakePaused` (see the module docstring). What else it raises is raised.
        Cancellation is safe: a probe cancelled while it waits leaves probing to the next
        message that meets the pause."""
        mine: asyncio.Event | None = None  # the probe this call makes, if it does
        try:
            while True:
                probe = self._probe
                if probe is not None and probe is not mine:
                    await probe.wait()
                try:
                    result = await hand()
                except IntakePaused as exc:
                    if self._probe is None:
                        mine = self._probe = asyncio.Event()
                    if self._probe is mine:
                        self._outage.failed(exc.reason, retry_in=exc.retry_in)
                        await self._outage.wait()
                    continue
                self._outage.recovered()
                return result
        finally:
            if mine is not None and self._probe is mine:
                self._probe = None
                mine.set()
