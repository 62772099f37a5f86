"""Membership: the running gateway keeps its row in the members table alive.

While the gateway runs, an owned task stamps its row every `BEAT_INTERVAL`; `nanobot status
--check` (Docker's HEALTHCHECK) reads that stamp. A beat that cannot be written (disk full,
an I/O error, the database locked for too long) is logged once, not at every try, and never
stops the gateway: the next beat tries again, writing the row anew if it is gone, and one
line says when beats are recorded again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from types import TracebackType
from typing import Self

from loguru import logger

from nanobot.errors import StoreError
from nanobot.store.members import BEAT_INTERVAL, STALE_AFTER, Member, Members
from nanobot.tasks import TaskSet


class Membership:
    """This process as a member while the `async with` block runs.

    Entering registers a new member (forgetting the rows of members that died without
    leaving) and starts beating; leaving the block stops beating and, when the block ended
    without an exception, removes the row. After a crash the row stays behind, stale, saying
    which process it was and when it was last alive. Neither entering nor leaving raises a
    `StoreError`: each is logged, and the row is left for the next beat or for staleness.
    """

    def __init__(
        self,
        members: Members,
        *,
        interval: float = BEAT_INTERVAL.total_seconds(),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`sleep` waits between beats (tests pass one they control)."""
        self._members = members
        self._interval = interval
        self._sleep = sleep
        self._tasks = TaskSet("membership")
        self._failing = False
        self.member = Member.new(members.now())

    async def __aenter__(self) -> Self:
        now = self._members.now()
        self.member = replace(self.member, started_at=now, beat_at=now)
        try:
            await self._members.forget_stale()
            await self._members.register(self.member)
        except StoreError as exc:
            self._failed(exc)
        else:
            logger.debug(
                "registered as member {} ({}); beating every {:g}s",
                self.member.id,
                self.member.describe(),
                self._interval,
            )
        self._tasks.spawn(self._beating(), name="member-beat")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._tasks.close()
        if exc_type is not None:
            return
        try:
            await self._members.leave(self.member.id)
        except StoreError as error:
            logger.warning(
                "could not remove this gateway's row from the members table ({}); it goes "
                "stale in {:g}s",
                error,
                STALE_AFTER.total_seconds(),
            )

    async def _beating(self) -> None:
        while True:
            await self._sleep(self._interval)
            await self.beat()

    async def beat(self) -> None:
        """Stamp the row now; a failure is logged (once until a beat succeeds again)."""
        try:
            self.member = await self._members.beat(self.member)
        except StoreError as exc:
            self._failed(exc)
            return
        if self._failing:
            self._failing = False
            logger.warning("this gateway's beats are recorded again; it shows as alive")

    def _failed(self, exc: StoreError) -> None:
        if self._failing:
            logger.debug("beat not recorded: {}", exc)
            return
        self._failing = True
        logger.error(
            "could not record this gateway's beat in the state database ({}); `nanobot "
            "status --check` reports it down once no beat is recorded for {:g}s. Trying again "
            "every {:g}s",
            exc,
            STALE_AFTER.total_seconds(),
            self._interval,
        )
