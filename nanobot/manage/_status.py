"""`nanobot status`: what this installation is and holds, and whether its gateway is alive."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from nanobot.channels.health import FILE as CHANNELS_FILE
from nanobot.channels.health import ChannelState, read_states
from nanobot.cluster.agreement import agreement
from nanobot.cluster.roster import ago, moment, roster
from nanobot.cluster.timings import BEATS_ALIVE
from nanobot.config import Config
from nanobot.manage._command import config_zone
from nanobot.manage._gateway_lock import GATEWAY_LOCK, Holder, lock_holder_of
from nanobot.manage._mcp import mcp_rows
from nanobot.store import Access, Database, Journal, SessionStore
from nanobot.store.access import MAX_PENDING
from nanobot.store.database import Check
from nanobot.store.journal import FailedReplies
from nanobot.store.members import Members


def status(config: Config, path: Path, *, check_db: bool = False) -> list[tuple[str, str]]:
    """Rows of (label, value) describing this installation, without any secret.

    The state database is checked as it is opened: SQLite's quick check, or with
    `check_db` its full integrity check (about four times as long).

    Raises:
        StoreError: the state database is damaged (the message says what was found and how
            to restore it) or cannot be opened.
    """
    rows = [
        ("config", f"{path}" + ("" if path.exists() else " (not found; using defaults)")),
        ("data dir", str(config.data_dir)),
        (
            "workspace",
            str(config.workspace_path) + ("" if config.workspace_path.exists() else " (missing)"),
        ),
        (
            "model",
            config.agent.model
            + (f" via {config.agent.api_base}" if config.agent.api_base else "")
            + f" ({config.agent.transport})",
        ),
        ("api key", "set" if config.agent.api_key else "not set (provider env vars may apply)"),
    ]
    running = _channel_states(config.data_dir)
    zone = config_zone(config)
    for name in ("telegram", "discord"):
        channel = getattr(config.channels, name)
        state = f"enabled, {len(channel.allow_from)} allowed" if channel.enabled else "disabled"
        if name in running:
            state += "; " + running[name].describe(lambda at: moment(at, zone))
        rows.append((name, state))
    rows += mcp_rows(config)
    target = config.store_target
    if isinstance(target, Path) and not target.exists():
        return [*rows, ("state", f"{target} (not created yet)")]
    return rows + asyncio.run(_store_rows(target, check_db, zone, agreement(config)))


def _channel_states(data_dir: Path) -> dict[str, ChannelState]:
    """The channels of the gateway running on `data_dir`, by name, as it last recorded
    them; none when no gateway runs there (what one left behind is out of date)."""
    if lock_holder_of(data_dir) is None:
        return {}
    return {state.name: state for state in read_states(data_dir / CHANNELS_FILE) or []}


async def _store_rows(
    target: Path | str, check_db: bool, zone: ZoneInfo | None, agreed: Mapping[str, str]
) -> list[tuple[str, str]]:
    async with await Database.open(target, check="full" if check_db else "quick") as db:
        stats = await SessionStore(db).stats()
        waiting = await Access(db).waiting()
        failed = await Journal(db).failed_replies()
        gateways = await roster(db, zone, agreed)
    return [
        ("state", f"{db.name} ({stats.size_bytes / 1024:.0f} KiB)"),
        ("integrity", _checked(db.checked)),
        ("sessions", f"{stats.sessions} ({stats.live_sessions} live), {stats.entries} entries"),
        ("pairing", _waiting(waiting)),
        ("replies", _failed(failed)),
        *gateways,
    ]


def health(config: Config) -> tuple[str, bool]:
    """`status --check`: one line, and whether the gateway of this data dir is alive: it
    holds the data dir's lock (`gateway.lock`: its pid and member id), and its row in the
    members table has not expired (three beats after its last: 45 s alone). About this
    gateway only, never another member of its cluster: each container's health check sees
    its own gateway dead or hung. Reads the state database without checking it (it runs
    every minute under Docker) and creates nothing: on a fresh data dir no gateway has run.

    Raises:
        StoreError: the state database cannot be read.
    """
    target = config.store_target
    if isinstance(target, Path) and not target.exists():
        return f"no gateway has run on this data dir yet ({target} does not exist)", False
    holder = lock_holder_of(config.data_dir)
    if holder is None:
        lock = config.data_dir / GATEWAY_LOCK
        return f"no gateway is running on this data dir (nothing holds {lock})", False
    if not holder.member:
        return f"gateway pid {holder.pid} is starting: not registered as a member yet", False
    zone = config_zone(config)
    line, alive = asyncio.run(_health(target, holder, zone))
    if not alive:
        return line, False
    limit = config.gateway.channel_down_limit
    now = datetime.now(UTC)
    for state in read_states(config.data_dir / CHANNELS_FILE) or []:
        if state.down_for(now) > limit:
            return (
                f"{line}, but {state.name} is "
                f"{state.describe(lambda at: moment(at, zone))} (longer than "
                f"gateway.channel_down_limit, {_span(limit)})",
                False,
            )
    return line, True


def _span(duration: timedelta) -> str:
    """A duration as the config writes it: "5m", "90s"."""
    seconds = round(duration.total_seconds())
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


async def _health(target: Path | str, holder: Holder, zone: ZoneInfo | None) -> tuple[str, bool]:
    async with await Database.open(target, check=None) as db:
        members = Members(db)
        found = [m for m in await members.all() if m.id == holder.member]
        now = members.now()
    if not found:
        return (
            f"gateway pid {holder.pid} holds this data dir, but its member {holder.member} is "
            "not in the state database (removed by hand, or its beats cannot be written)",
            False,
        )
    [member] = found
    allowed = f"{member.lifetime.total_seconds():g} s"
    if member.stale(now):
        return (
            f"no gateway has beaten since {moment(member.beat_at, zone)} "
            f"({member.describe()}, member {member.id}); a running one beats every "
            f"{member.lifetime.total_seconds() / BEATS_ALIVE:g} s and counts as down after "
            f"{allowed}",
            False,
        )
    return (
        f"gateway alive: {member.describe()}, last beat {ago(now - member.beat_at)} ago "
        f"(allowed: {allowed})",
        True,
    )


def _checked(check: Check | None) -> str:
    """What the check as the state was opened found (it refuses a damaged one)."""
    if check == "full":
        return "ok (full check)"
    if check == "quick":
        return "ok (quick check; --check-db for the full one)"
    return "not checked here: the check is SQLite's (PostgreSQL checks its own pages)"


def _failed(failed: FailedReplies) -> str:
    """Replies the platforms refused for good (kept as long as delivered ones), the latest
    reason."""
    if not failed.count:
        return "none failed"
    at = f" at {failed.last_at.astimezone():%Y-%m-%d %H:%M}" if failed.last_at else ""
    return f"{failed.count} failed in the last 7 days; latest{at}: {failed.last_reason}"


def _waiting(waiting: dict[str, int]) -> str:
    """The pending pairing requests, per channel, and which channels are full."""
    if not waiting:
        return "no requests waiting"
    parts = []
    for channel, count in waiting.items():
        full = " (full: a new one replaces the oldest)" if count >= MAX_PENDING else ""
        parts.append(f"{channel} {count}{full}")
    total = sum(waiting.values())
    return f"{total} request(s) waiting: {', '.join(parts)}; see `nanobot pairing list`"
