"""The cluster: gateways sharing one state database, and how this one takes part.

Every gateway is a member (`membership`: its row in the members table, beating while it
runs, and the check that its config agrees with the living members', `agreement`). Work
that one member at a time must do (a channel's intake, the schedule) is a role held under a
lease (`roles`). With the state on PostgreSQL the members share the chats out through the
journal (`distribution`: session leases and claims, fenced on every answer); on SQLite one
gateway does everything. `roster` shows the members for `nanobot status`; `timings` derives
every interval from `cluster.lease_seconds`. docs/cluster.md tells the whole protocol.

The composition root builds this gateway's part of the cluster in three steps, each from
what the one before made: `enrol` (its membership and, on PostgreSQL, the wake-ups it speaks
on: the journal and the approver are built with them), `join` (its roles and share of the
chats, built on that journal and approver), then `listening` (what it hears, given to the
parts built by then).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
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
from nanobot.store.wakeups import APPROVAL, INBOUND, Listener, Listening, PostgresWakeups

__all__ = [
    "SCHEDULE",
    "Cluster",
    "Distributor",
    "Enrolment",
    "LeaderRole",
    "Membership",
    "Part",
    "Setting",
    "enrol",
    "intake",
    "join",
    "listening",
]


class ApprovalNews(Protocol):
    """The approver as the cluster sees it: a press taken by one member may decide a run
    that waits in another, so presses are heard from all (and announced to all: the
    approver is built with `Enrolment.wakeups`)."""

    def decided(self, request_id: str) -> None: ...

    async def taken_over(self, session_key: str) -> None:
        """Settle a dead member's pending requests of `session_key`, taken over here."""


@dataclass(frozen=True, slots=True)
class Setting:
    """What the cluster reads of the config: the lease, the store's URL where it is shared
    (PostgreSQL; None on SQLite), the workspace's path and the config's agreement."""

    lease: timedelta
    shared_url: str | None
    workspace: str
    agreement: dict[str, str]
    retry: Backoff = DEFAULT_BACKOFF


@dataclass(frozen=True, slots=True)
class Enrolment:
    """This gateway as a member, before the parts that need it are built: its membership
    (not yet entered) and, in a cluster on PostgreSQL, the wake-ups it speaks on (None on
    SQLite: there is no one to wake), and the member that ran on this data dir before."""

    membership: Membership
    wakeups: PostgresWakeups | None
    succeeds: str | None = None

    @property
    def sender(self) -> str | None:
        """Whose replies the journal queues (`Journal(member=…)`): in a cluster, this
        member's (another member sends them if it dies); None alone, on SQLite."""
        return None if self.wakeups is None else self.membership.member.id


@dataclass(frozen=True, slots=True)
class Part:
    """This gateway's part of the cluster: its membership, the roles it may play, and, in a
    cluster on PostgreSQL, its share of the chats (None on SQLite: it answers them all) and
    the approver that hears of presses taken elsewhere."""

    enrolment: Enrolment
    roles: Cluster
    distributor: Distributor | None
    approvals: ApprovalNews

    @property
    def membership(self) -> Membership:
        return self.enrolment.membership


def enrol(setting: Setting, db: Database, *, succeeds: str | None = None) -> Enrolment:
    """This gateway as a member of the cluster on `db`, not yet started (`Membership` is
    entered by the gateway). `succeeds`: the member that ran on this data dir before (gone,
    whatever its row says)."""
    membership = Membership(
        Members(db),
        workspace=setting.workspace,
        agreement=setting.agreement,
        succeeds=succeeds,
        interval=beat(setting.lease, shared=setting.shared_url is not None),
    )
    if setting.shared_url is None:
        return Enrolment(membership, None, succeeds)
    wakeups = PostgresWakeups(db, setting.shared_url, retry=setting.retry)
    return Enrolment(membership, wakeups, succeeds)


def join(
    setting: Setting,
    enrolment: Enrolment,
    db: Database,
    journal: Journal,
    bus: MessageBus,
    *,
    approvals: ApprovalNews,
    channels: Collection[str],
) -> Part:
    """The roles `enrolment`'s member may play and, in a cluster, its share of the chats
    (the distributor, run by the gateway), taken from `journal` (built with
    `enrolment.sender`). `channels`: those it runs (it takes only their chats)."""
    member = enrolment.membership.member.id
    roles = Cluster(Leases(db), member, setting.lease, succeeds=enrolment.succeeds)
    if enrolment.wakeups is None:
        return Part(enrolment, roles, None, approvals)
    distributor = Distributor(
        Claims(db, member),
        journal,
        Members(db),
        enrolment.wakeups,
        bus,
        channels=channels,
        lease=setting.lease,
        retry=setting.retry,
        taken_over=approvals.taken_over,
    )
    return Part(enrolment, roles, distributor, approvals)


def listening(part: Part, others: Mapping[str, Listener]) -> Listening | None:
    """What this member hears from the others (run by the gateway; None on SQLite): a
    message journaled (its distributor looks), a press decided (its approver wakes the run
    that waits for it), and `others` (topic → listener, such as a cron job changed). Built
    last: its listeners are parts built before it."""
    wakeups = part.enrolment.wakeups
    if wakeups is None or part.distributor is None:
        return None
    listeners = {INBOUND: part.distributor.woken, APPROVAL: part.approvals.decided, **others}
    return Listening(wakeups, listeners)
