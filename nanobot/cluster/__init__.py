"""The cluster: gateways sharing one state database, and how this one takes part.

Every gateway is a member (`membership`: its row in the members table, beating while it
runs, and the check that its config agrees with the living members', `agreement`). Work
that one member at a time must do (a channel's intake, the schedule) is a role held under a
lease (`roles`). With the state on PostgreSQL the members share the chats out through the
journal (`distribution`: session leases and claims, fenced on every answer); on SQLite one
gateway does everything. `roster` shows the members for `nanobot status`; `timings` derives
every interval from `cluster.lease_seconds`. docs/cluster.md tells the whole protocol.

`join` is the one entry the composition root uses: this gateway's part of the cluster, made
from what it needs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Protocol

from nanobot.bus.queue import MessageBus
from nanobot.cluster.distribution import Distributor
from nanobot.cluster.membership import Membership
from nanobot.cluster.roles import SCHEDULE, Cluster, LeaderRole, intake
from nanobot.cluster.timings import beat
from nanobot.outage import DEFAULT_BACKOFF, Backoff
from nanobot.store.claims import Claims
from nanobot.store.database import Database
from nanobot.store.journal import Journal
from nanobot.store.leases import Leases
from nanobot.store.members import Members
from nanobot.store.wakeups import APPROVAL, PostgresWakeups

__all__ = ["SCHEDULE", "Cluster", "Distributor", "LeaderRole", "Membership", "Part", "intake"]


class ApprovalNews(Protocol):
    """The approver as the cluster sees it: a press taken by one member may decide a run
    that waits in another, so presses are announced to all and heard from all."""

    def decided(self, request_id: str) -> None: ...

    def announce_with(self, announce: Callable[[str], Awaitable[None]]) -> None: ...

    async def taken_over(self, session_key: str) -> None:
        """Settle a dead member's pending requests of `session_key`, taken over here."""


@dataclass(frozen=True, slots=True)
class Part:
    """This gateway's part of the cluster: its membership, the roles it may play, and, in a
    cluster on PostgreSQL, its share of the chats (None on SQLite: it answers them all)."""

    membership: Membership
    roles: Cluster
    distributor: Distributor | None


@dataclass(frozen=True, slots=True)
class Setting:
    """What `join` reads of the config: the lease, the store's URL where it is shared
    (PostgreSQL; None on SQLite), the workspace's path and the config's agreement."""

    lease: timedelta
    shared_url: str | None
    workspace: str
    agreement: dict[str, str]
    retry: Backoff = DEFAULT_BACKOFF


def join(
    setting: Setting,
    db: Database,
    journal: Journal,
    bus: MessageBus,
    approvals: ApprovalNews,
    *,
    channels: Collection[str],
    succeeds: str | None = None,
) -> Part:
    """This gateway as a member, not yet started (`Membership` is entered by the gateway,
    the distributor run by it). `channels`: those it runs (it takes only their chats);
    `succeeds`: the member that ran on this data dir before (gone, whatever its row says).

    In a cluster the replies it queues are its own to send (`Journal.send_as`), and the
    approver hears of presses taken by other members."""
    membership = Membership(
        Members(db),
        workspace=setting.workspace,
        agreement=setting.agreement,
        succeeds=succeeds,
        interval=beat(setting.lease, shared=setting.shared_url is not None),
    )
    member = membership.member.id
    roles = Cluster(Leases(db), member, setting.lease, succeeds=succeeds)
    if setting.shared_url is None:
        return Part(membership, roles, None)
    journal.send_as(member)
    wakeups = PostgresWakeups(db, setting.shared_url, retry=setting.retry)
    wakeups.listen(APPROVAL, approvals.decided)
    approvals.announce_with(partial(wakeups.notify, APPROVAL))
    distributor = Distributor(
        Claims(db, member),
        journal,
        Members(db),
        wakeups,
        bus,
        channels=channels,
        lease=setting.lease,
        retry=setting.retry,
        taken_over=approvals.taken_over,
    )
    return Part(membership, roles, distributor)
