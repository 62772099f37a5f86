"""The gateways as `nanobot status` lists them, read from a real store on both backends:
roles, sessions held, workspaces, and the warnings where the members do not agree."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from nanobot.cluster.roster import ago, member_line, roster
from nanobot.cluster.timings import ALONE
from nanobot.store import Database
from nanobot.store.claims import Claims
from nanobot.store.leases import Leases
from nanobot.store.members import Member, Members

AGREED = {"model": "m1", "telegram": "t1"}
BERLIN = ZoneInfo("Europe/Berlin")
LEASE = timedelta(seconds=10)


async def hold_sessions(db: Database, member: Member, count: int) -> None:
    keys = [f"telegram:{member.pid}{n}" for n in range(count)]
    assert len(await Claims(db, member.id).hold_all(keys, datetime.now(UTC), LEASE)) == count


async def register(
    db: Database, pid: int, *, workspace: str = "", agreement: dict[str, str] | None = None
) -> Member:
    now = datetime.now(UTC)
    member = Member.new(
        now,
        host="box",
        pid=pid,
        version="1.0",
        workspace=workspace,
        agreement=agreement,
        lifetime=ALONE,
    )
    await Members(db).register(member)
    return member


async def test_each_gateway_with_its_roles_sessions_and_workspace(db: Database) -> None:
    one = await register(db, 1, workspace="/srv/ws", agreement=AGREED)
    two = await register(db, 2, workspace="/srv/ws", agreement=AGREED)
    await Leases(db).acquire("schedule", one.id, timedelta(minutes=1))
    await hold_sessions(db, one, 3)
    await hold_sessions(db, two, 1)
    rows = await roster(db, BERLIN, AGREED)
    assert [label for label, _ in rows] == ["gateway", "gateway"]  # no warning
    lines = {line.split()[1]: line for _, line in rows}
    assert ", plays schedule, holds 3 sessions, workspace /srv/ws; last beat " in lines["1"]
    assert ", version 1.0, up since " in lines["2"]
    assert "plays" not in lines["2"] and ", holds 1 session, workspace /srv/ws;" in lines["2"]


async def test_members_on_different_workspaces_are_warned_about(db: Database) -> None:
    await register(db, 1, workspace="/mnt/a", agreement=AGREED)
    await register(db, 2, workspace="/mnt/b", agreement=AGREED)
    await register(db, 3, workspace="/mnt/a", agreement=AGREED)
    [warning] = [row for row in await roster(db, None, AGREED) if row[0] != "gateway"]
    assert warning[0] == "workspace"
    assert warning[1].startswith(
        "WARNING: the running gateways use different workspaces (/mnt/a, /mnt/b): a cluster "
        "needs one, on storage every member mounts"
    )


async def test_a_member_running_another_config_is_named(db: Database) -> None:
    await register(db, 1, agreement=AGREED)
    await register(db, 2, agreement={**AGREED, "model": "m2"})
    await register(db, 3)  # a version before: nothing to compare
    rows = await roster(db, None, AGREED)
    [(label, warning)] = [row for row in rows if row[0] != "gateway"]
    assert label == "config"
    assert warning.startswith(
        "WARNING: this config differs in model from the one pid 2 on host box runs with: "
        "restart it to apply this one; while it runs, a gateway started with this config is "
        "refused"
    )


async def test_gone_members_are_listed_but_not_compared(db: Database) -> None:
    gone = Member.new(
        datetime(2026, 1, 15, 8, 30, 5, tzinfo=UTC), host="box", pid=7, lifetime=ALONE
    )
    gone = replace(gone, workspace="/old", agreement={"model": "m0"})
    await Members(db).register(gone)
    await register(db, 8, workspace="/srv/ws", agreement=AGREED)
    rows = await roster(db, BERLIN, AGREED)
    assert [label for label, _ in rows] == ["gateway", "gateway"]
    assert rows[1][1].endswith(
        "pid 7 on host box, version "
        f"{gone.version}, up since 2026-01-15 09:30:05 CET, workspace /old; "
        "GONE: no beat since 2026-01-15 09:30:05 CET"
    )


async def test_no_gateway_running(db: Database) -> None:
    assert await roster(db, None, AGREED) == [("gateway", "none running")]


def test_a_member_line_without_extras_and_the_elapsed_times() -> None:
    now = datetime(2026, 1, 15, 9, 0, tzinfo=UTC)
    member = Member.new(
        now - timedelta(seconds=5), host="box", pid=4, version="2.0", lifetime=ALONE
    )
    assert member_line(member, now, ZoneInfo("UTC")) == (
        "pid 4 on host box, version 2.0, up since 2026-01-15 08:59:55 UTC; last beat 5 s ago"
    )
    assert member.stale(now + ALONE + timedelta(seconds=1))
    assert [ago(timedelta(seconds=s)) for s in (-1, 119, 120, 7199, 7200)] == [
        "0 s",
        "119 s",
        "2 min",
        "119 min",
        "2 h",
    ]
