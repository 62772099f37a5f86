"""Membership: the running gateway keeps its row in the members table alive.

While the gateway runs, an owned task stamps its row at every beat (`timings.beat`), alive for
three beats from then; `nanobot status --check` (Docker's HEALTHCHECK) reads that stamp. A beat
that cannot be written (disk full, an I/O error, the database locked for too long) is logged
once, not at every try, and never stops the gateway: the next beat tries again, writing the row
anew if it is gone, and one line says when beats are recorded again.

At the start it checks what the members of a cluster must share against the members already
running on the database: a config that differs in a part that must agree refuses the start
(two clusters on one database, or a member started with the wrong config); a workspace at
another path is warned about (the same shared storage may be mounted elsewhere on another
machine, but two local directories split the cluster's files).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import datetime
from types import TracebackType
from typing import Self

from loguru import logger

from nanobot.cluster.timings import BEAT_INTERVAL, lifetime
from nanobot.errors import ConfigError, StoreError
from nanobot.outage import Outage
from nanobot.store.members import Member, Members
from nanobot.tasks import TaskSet


class Membership:
    """This process as a member while the `async with` block runs.

    Entering registers a new member (forgetting the rows of members that died without
    leaving), compares it with the other live members (see `ConfigError` below) and starts
    beating; leaving the block stops beating and, when the block ended without an exception,
    removes the row. After a crash the row stays behind, stale, saying which process it was
    and when it was last alive. Neither entering nor leaving raises a `StoreError`: each is
    logged, and the row is left for the next beat or for staleness.

    Entering raises `ConfigError` (after removing the row it wrote) when a live member's
    agreement differs from this one's (`Member.disagrees`); the message names the parts and
    that member, never a value. The check follows the registration, so of two members that
    start at once with different configs, at least the later one sees the other.
    """

    def __init__(
        self,
        members: Members,
        *,
        workspace: str = "",
        agreement: Mapping[str, str] | None = None,
        succeeds: str | None = None,
        interval: float = BEAT_INTERVAL.total_seconds(),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`workspace` and `agreement` are recorded in the row and compared with the other
        members' (`nanobot.cluster.agreement`; nothing is compared without one); `succeeds` is the
        member id of the process that ran on this data dir before (gone, whatever its row
        says). `sleep` waits between beats (tests pass one they control)."""
        self._members = members
        self._interval = interval
        self._sleep = sleep
        self._succeeds = succeeds
        self._lifetime = lifetime(interval)
        self._tasks = TaskSet("membership")
        # Beats keep their interval whatever the store's backoff: `status --check` reads them.
        self._outage = Outage(
            failing="could not record this gateway's beat in the state database",
            effect=(
                "`nanobot status --check` reports it down once no beat is recorded for "
                f"{self._lifetime.total_seconds():g}s"
            ),
            back="this gateway's beats are recorded again",
        )
        self.member = Member.new(
            members.now(), lifetime=self._lifetime, workspace=workspace, agreement=agreement
        )

    async def __aenter__(self) -> Self:
        now = self._members.now()
        self.member = replace(
            self.member, started_at=now, beat_at=now, expires_at=now + self._lifetime
        )
        try:
            await self._members.forget_stale()
            await self._members.register(self.member)
            others = await self._members.all()
        except StoreError as exc:
            self._outage.failed(exc, retry_in=self._interval)
        else:
            logger.debug(
                "registered as member {} ({}); beating every {:g}s",
                self.member.id,
                self.member.describe(),
                self._interval,
            )
            await self._compare([m for m in others if self._alive_other(m, now)])
        self._tasks.spawn(self._beating(), name="member-beat")
        return self

    def _alive_other(self, member: Member, now: datetime) -> bool:
        # The one this data dir's lock names is gone, and so is one whose process on this
        # host has ended (a kill -9 a moment ago, or before the last restart): only the
        # living have a config to agree with.
        earlier = member.id == self._succeeds
        return member.id != self.member.id and not earlier and not member.gone(now)

    async def _compare(self, others: list[Member]) -> None:
        """Refuse to join members whose config disagrees; warn of another workspace."""
        me = self.member
        for other in others:
            parts = me.disagrees(other)
            if parts:
                await self._withdraw()
                raise ConfigError(
                    f"this gateway's config differs in {', '.join(parts)} from that of the "
                    f"gateway running on the same database ({other.describe()}, member "
                    f"{other.id}): the gateways on one database are one cluster and need the "
                    "same config (docs/cluster.md: 'Running several gateways'). For a separate "
                    "installation give this one its own database (store.url); to change a "
                    "cluster's config, stop every gateway, then start them with the new one"
                )
        recorded = [m for m in others if m.workspace and me.workspace]
        for other in (m for m in recorded if m.workspace != me.workspace):
            logger.warning(
                "this gateway's workspace is {} but {} (member {}) uses {}: the members of a "
                "cluster must share one workspace, on storage every machine mounts (a "
                "different path is right only where the same storage is mounted there)",
                me.workspace,
                other.describe(),
                other.id,
                other.workspace,
            )

    async def _withdraw(self) -> None:
        try:
            await self._members.leave(self.member.id)
        except StoreError as exc:
            logger.debug("could not remove the refused member's row ({}); it goes stale", exc)

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
                self._lifetime.total_seconds(),
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
            self._outage.failed(exc, retry_in=self._interval)
            return
        self._outage.recovered()
