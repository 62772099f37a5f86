"""The gateways on a state database as `nanobot status` shows them: where each runs, since
when, the roles it plays (`nanobot.cluster.roles`), how many sessions it holds
(`nanobot.cluster.distribution`), its workspace and whether it beats; and a warning wherever the
running ones do not share what the members of a cluster must share.

Three small reads (the members, the roles held, the session leases counted by holder),
whatever the number of sessions: `status` stays cheap on a busy cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo

from nanobot.store.claims import SESSIONS
from nanobot.store.database import Database
from nanobot.store.leases import Leases
from nanobot.store.members import Member, Members, disagreement

GUIDE: Final = "docs/cluster.md: 'Running several gateways'"

Row = tuple[str, str]


async def roster(db: Database, zone: ZoneInfo | None, agreement: Mapping[str, str]) -> list[Row]:
    """The rows for `status`: one "gateway" per registered member, the latest beat first
    (or one saying none runs), then the warnings. `agreement` is this config's
    (`nanobot.cluster.agreement`): a running member whose config differs is named, since a gateway
    started with this one is refused while it runs.

    Raises:
        StoreError: the database cannot be read.
    """
    members = Members(db)
    found = await members.all()
    leases = Leases(db)
    roles = await leases.holders(besides=SESSIONS)
    sessions = await leases.counts(SESSIONS)
    now = members.now()
    rows = [
        ("gateway", member_line(m, now, zone, roles.pop(m.id, []), sessions.get(m.id, 0)))
        for m in found
    ]
    # Held by a process without a row (removed by hand): it lapses unless renewed.
    rows += [("roles", f"{', '.join(r)} held by {who}, not listed") for who, r in roles.items()]
    live = [m for m in found if not m.gone(now)]
    return (rows or [("gateway", "none running")]) + warnings(live, agreement)


def member_line(
    member: Member,
    now: datetime,
    zone: ZoneInfo | None,
    roles: Sequence[str] = (),
    sessions: int = 0,
) -> str:
    """A member for `status`: where it runs, since when, the roles it plays, the sessions
    it holds a lease on, its workspace, and whether it beats."""
    where = f"{member.describe()}, version {member.version}, up since "
    where += moment(member.started_at, zone)
    if roles:
        where += f", plays {', '.join(roles)}"
    if sessions:
        where += f", holds {sessions} session{'s' if sessions != 1 else ''}"
    if member.workspace:
        where += f", workspace {member.workspace}"
    if member.stale(now):
        return f"{where}; GONE: no beat since {moment(member.beat_at, zone)}"
    if member.ended_here():
        return f"{where}; GONE: its process has ended (last beat {ago(now - member.beat_at)} ago)"
    return f"{where}; last beat {ago(now - member.beat_at)} ago"


def warnings(live: Sequence[Member], agreement: Mapping[str, str]) -> list[Row]:
    """What the `live` members do not share: their workspaces' paths, and their config
    with this one (`agreement`, as `Membership` would record it)."""
    rows = []
    paths = sorted({m.workspace for m in live if m.workspace})
    if len(paths) > 1:
        rows.append(
            (
                "workspace",
                f"WARNING: the running gateways use different workspaces ({', '.join(paths)}): "
                "a cluster needs one, on storage every member mounts (a different path is "
                f"right only where the same storage is mounted there; {GUIDE})",
            )
        )
    for member in live:
        parts = disagreement(agreement, member.agreement)
        if parts:
            rows.append(
                (
                    "config",
                    f"WARNING: this config differs in {', '.join(parts)} from the one "
                    f"{member.describe()} runs with: restart it to apply this one; while it "
                    "runs, a gateway started with this config is refused (the members of a "
                    f"cluster need the same config; {GUIDE})",
                )
            )
    return rows


def moment(at: datetime, zone: ZoneInfo | None) -> str:
    """`at` as a person reads it, in `zone` (None: the machine's)."""
    return at.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")


def ago(elapsed: timedelta) -> str:
    """A time elapsed, rounded to the unit that reads best: "42 s", "5 min", "3 h"."""
    seconds = max(0, round(elapsed.total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"
