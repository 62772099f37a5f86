"""Leader roles: what one member of a cluster does at a time, and who takes over.

Several gateways with the same config on one store are a cluster, with no coordinator beside
the database. Some work must run on one of them at a time: polling Telegram (a second poller
is refused with 409 Conflict), Discord's gateway connection (a second one would take every
message twice), and the schedule (cron and the heartbeat). Each is a role, held under a lease
in the store (`nanobot.store.leases`): `LeaderRole.hold(work)` runs the work only while this
member holds the lease, renews it every third of its length, and stops the work at once when
the lease is lost; another member takes the role over once the lease lapses, within
`cluster.lease_seconds` of the holder's death.

A gateway on its own takes every role at once at start: the lease is free, its own, or held
by the process that ran on this data dir before (`succeeds`: known to be gone, since this one
holds the data dir's lock), so nothing waits a lease's length after a crash and a restart.

The moment a lost lease is noticed comes from the monotonic clock: the work stops at the
latest one lease's length after the last renewal was sent, before another member can see
the lease lapse by its wall clock (hosts' clocks must agree to well within a lease).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from loguru import logger

from nanobot.cluster.timings import renewal
from nanobot.errors import StoreError
from nanobot.outage import Outage
from nanobot.store.leases import Lease, Leases

SCHEDULE: Final = "schedule"
"""The role that runs cron and the heartbeat."""


def intake(channel: str) -> str:
    """The role that takes `channel`'s messages in (its polling loop, its gateway
    connection): "intake:telegram"."""
    return f"intake:{channel}"


Work = Callable[[], Awaitable[None]]


class LeaderRole:
    """One role, played by the member `holder` whenever it holds the lease `name`.

    Implements the channels' `Role` port. Every try and renewal goes to the store; a store
    that fails is logged once until it works again, and never ends `hold`.
    """

    def __init__(
        self,
        leases: Leases,
        name: str,
        holder: str,
        *,
        lease: timedelta,
        succeeds: str | None = None,
    ) -> None:
        """`succeeds`: the member this one replaces, known to be gone (its lease is taken
        at once rather than after it lapses)."""
        self.name = name
        self._leases = leases
        self._holder = holder
        self._lease = lease
        self._period = renewal(lease)  # between tries, and between renewals
        self._succeeds = succeeds
        # Tried every period whatever the store's backoff: a role's timings are the lease's.
        self._outage = Outage(
            failing=f"the role {name} cannot be taken or renewed",
            effect=f"its work waits; trying again every {self._period:g} s",
            back=f"the store answers again for the role {name}",
        )

    async def hold(self, work: Work, *, standby: Callable[[], None] | None = None) -> None:
        """Run `work()` while this member holds the role: each time it takes the role, until
        `work` returns or raises (then the role is given up and that is returned or raised),
        or until the role is lost (then `work` is cancelled at once, and `hold` waits to take
        the role again). `standby()` is called each time the role is found held by another.

        Cancelling `hold` cancels `work`, waits for it to end, and gives the role up.
        """
        while True:
            lease, deadline = await self._take(standby)
            try:
                lost = await self._lead(lease, deadline, work)
            except BaseException:
                await self._release(lease)
                raise
            if not lost:
                await self._release(lease)
                return
            # Lost: nothing to give up (another took it, or the store could not be reached).

    async def _take(self, standby: Callable[[], None] | None) -> tuple[Lease, float]:
        """The lease, once taken, and when it lapses on the monotonic clock."""
        loop = asyncio.get_running_loop()
        waited = False
        while True:
            sent = loop.time()
            try:
                lease = await self._leases.acquire(
                    self.name, self._holder, self._lease, succeeds=self._succeeds
                )
            except StoreError as exc:
                self._outage.failed(exc, retry_in=self._period)
                lease = None
            else:
                self._outage.recovered()
            if lease is not None:
                log = logger.info if waited else logger.debug  # a takeover is news
                log("took the role {} (holding {})", self.name, lease.token)
                return lease, sent + self._lease.total_seconds()
            if not waited and not self._outage.active:
                logger.info(
                    "another gateway plays the role {}; this one takes it over if that one stops",
                    self.name,
                )
                if standby is not None:
                    standby()
            waited = True
            await asyncio.sleep(self._period)

    async def _lead(self, lease: Lease, deadline: float, work: Work) -> bool:
        """Run `work` while keeping `lease`; False when the work ended by itself (what it
        raised is raised), True when the lease was lost and the work was cancelled."""
        loop = asyncio.get_running_loop()
        working: asyncio.Task[None] = loop.create_task(_run(work), name=f"role-{self.name}")
        keeping = loop.create_task(self._keep(lease, deadline), name=f"lease-{self.name}")
        try:
            done, _ = await asyncio.wait((working, keeping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            keeping.cancel()
            working.cancel()  # nothing if it ended; else lost, or `hold` was cancelled
            await asyncio.wait((working, keeping))
        if working in done:  # it ended by itself
            working.result()  # raises what the work raised
            return False
        if (error := keeping.exception()) is not None:
            raise error  # a bug, not a loss
        if not working.cancelled() and working.exception() is not None:
            logger.opt(exception=working.exception()).warning(
                "{}: the work failed as it was stopped", self.name
            )
        return True

    async def _keep(self, lease: Lease, deadline: float) -> None:
        """Renew `lease` every period until it is lost; returns then (having said why)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, min(self._period, deadline - loop.time())))
            sent = loop.time()
            if sent >= deadline:
                logger.warning(
                    "lost the role {}: its lease could not be renewed for {:g} s; its work "
                    "stopped, and it is taken again once the store answers",
                    self.name,
                    self._lease.total_seconds(),
                )
                return
            try:
                async with asyncio.timeout_at(deadline):
                    renewed = await self._leases.renew(lease, self._lease)
            except TimeoutError:
                continue  # the deadline passed: said above
            except StoreError as exc:
                self._outage.failed(exc, retry_in=self._period)
                continue
            self._outage.recovered()
            if renewed is None:
                logger.warning(
                    "lost the role {}: another gateway took it; its work stopped", self.name
                )
                return
            lease, deadline = renewed, sent + self._lease.total_seconds()

    async def _release(self, lease: Lease) -> None:
        try:
            await self._leases.release(lease)
        except StoreError as exc:
            logger.warning(
                "could not give up the role {} ({}); another gateway takes it within {:g} s",
                self.name,
                exc,
                self._lease.total_seconds(),
            )
        else:
            logger.debug("gave up the role {}", self.name)


async def _run(work: Work) -> None:
    await work()


@dataclass(frozen=True, slots=True)
class Cluster:
    """This gateway as a member of the cluster on its store: the roles it may play."""

    leases: Leases
    member: str  # this process's member id (`Membership`)
    lease: timedelta
    succeeds: str | None = None  # the member that ran on this data dir before, now gone

    def role(self, name: str) -> LeaderRole:
        return LeaderRole(self.leases, name, self.member, lease=self.lease, succeeds=self.succeeds)
