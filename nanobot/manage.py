"""Managing an installation from the command line: onboarding, status, pairing, cron jobs,
approvals.

Each function sets up logging, opens what it needs, does one thing and returns lines for the
CLI to print. None of them imports litellm or the chat libraries.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from nanobot import log
from nanobot.cluster.agreement import agreement
from nanobot.cluster.roster import ago, moment, roster
from nanobot.config import Config, load
from nanobot.cron.jobs import Jobs
from nanobot.cron.models import DELIVERY_WORDS, Job, JobRun
from nanobot.cron.schedule import describe, format_time, zone_of
from nanobot.errors import NanobotError
from nanobot.store import Access, ApprovalStore, Database, Journal, SavedRule, SessionStore
from nanobot.store.access import MAX_PENDING
from nanobot.store.cron import CronStore
from nanobot.store.database import Check
from nanobot.store.journal import FailedReplies
from nanobot.store.members import BEAT_INTERVAL, STALE_AFTER, Members
from nanobot.store.taint import TaintStore
from nanobot.workspace import bundled, copy_template


def pairing(config: Config, action: str, *args: str) -> tuple[list[str], bool]:
    """Run a `nanobot pairing` action; returns the lines to print and whether it succeeded."""
    log.configure(config, quiet=True)
    actions: dict[str, Callable[..., Awaitable[tuple[list[str], bool]]]] = {
        "approve": _approve,
        "deny": _deny,
        "revoke": _revoke,
        "list": _pairing_list,
    }

    return _on_store(config, lambda db: actions[action](Access(db), *args))


def _on_store(
    config: Config, work: Callable[[Database], Awaitable[tuple[list[str], bool]]]
) -> tuple[list[str], bool]:
    """Run `work` on the state database (created if missing); its lines and success."""

    async def run() -> tuple[list[str], bool]:
        config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        async with await Database.open(config.store_target) as db:
            return await work(db)

    return asyncio.run(run())


async def _approve(access: Access, code: str) -> tuple[list[str], bool]:
    request = await access.approve(code)
    if request is None:
        return [f"No pending request has the code {code} (or it expired)."], False
    who = f"{_name(request.name, 'user')} ({request.channel} id {request.user_id})"
    return [f"Approved {who}. They can talk to nanobot now."], True


async def _deny(access: Access, code: str) -> tuple[list[str], bool]:
    if await access.deny(code):
        return [f"Denied request {code.upper()}."], True
    return [f"No pending request has the code {code}."], False


async def _revoke(access: Access, user: str, channel: str | None = None) -> tuple[list[str], bool]:
    if await access.revoke(user, channel):
        return [f"Revoked user {user}."], True
    return [f"User {user} was not approved by pairing."], False


async def _pairing_list(access: Access) -> tuple[list[str], bool]:
    lines = ["Pending requests:"]
    pending = await access.pending()
    for r in pending:
        expires = r.expires_at.astimezone().strftime("%H:%M")
        who = f"{r.channel} user {r.user_id} ({_name(r.name)})"
        lines.append(f"  {r.code}  {who}, until {expires}")
    if not pending:
        lines.append("  none")
    lines.append("Approved users:")
    allowed = await access.allowed()
    for u in allowed:
        lines.append(
            f"  {u.channel} user {u.user_id} ({_name(u.name)}), since {u.approved_at:%Y-%m-%d}"
        )
    if not allowed:
        lines.append("  none")
    return lines, True


def approvals(config: Config, action: str, *args: str) -> tuple[list[str], bool]:
    """Run a `nanobot approvals` action (rules, revoke ID, log [LIMIT], pending); returns the
    lines to print and whether it succeeded."""
    log.configure(config, quiet=True)
    zone = ZoneInfo(config.timezone) if config.timezone else None
    actions: dict[str, Callable[..., Awaitable[tuple[list[str], bool]]]] = {
        "rules": _rules,
        "revoke": _revoke_rule,
        "log": _decision_log,
        "pending": _pending_approvals,
    }

    return _on_store(config, lambda db: actions[action](ApprovalStore(db), zone, *args))


async def _rules(store: ApprovalStore, zone: ZoneInfo | None) -> tuple[list[str], bool]:
    rules = await store.rules()
    if not rules:
        return ['No saved rules. "Always allow" on an approval card saves one.'], True
    rows = [("ID", "TOOL", "SAVED", "BY", "FOR", "CALL")]
    for rule in rules:
        saved = _when(rule.created_at, zone)
        by = rule.created_by or "-"
        rows.append((rule.id, rule.tool, saved, by, _bound(rule), _call(rule.tool, rule.arguments)))
    return _table(rows), True


def _bound(rule: SavedRule) -> str:
    """Whose turns and where a saved rule applies, for `nanobot approvals rules`."""
    if rule.tool == "web_fetch" and rule.rule_key.startswith("host:"):
        what = f"fetches from {rule.rule_key[5:]}, "
    else:
        what = ""
    if rule.user_id is not None:
        return f"{what}{rule.channel} user {rule.user_id}'s own turns"
    if rule.session_key is not None:
        return f"{what}chat {rule.session_key} only"
    return "nowhere (saved before rules were bound to a chat: revoke it)"


async def _revoke_rule(
    store: ApprovalStore, zone: ZoneInfo | None, rule_id: str
) -> tuple[list[str], bool]:
    rule = await store.revoke(rule_id, by="cli")
    if rule is None:
        return [f"No saved rule has the id {_name(rule_id)} (see nanobot approvals rules)."], False
    return [f"Revoked rule {rule.id}: {rule.tool} {_call(rule.tool, rule.arguments)}"], True


async def _decision_log(
    store: ApprovalStore, zone: ZoneInfo | None, limit: str = "50"
) -> tuple[list[str], bool]:
    entries = await store.log(int(limit))
    if not entries:
        return ["No decisions yet."], True
    rows = [("WHEN", "OUTCOME", "TOOL", "BY", "CALL", "WHY")]
    for entry in entries:
        outcome = entry.outcome + (f" ({entry.scope})" if entry.scope else "")
        rows.append(
            (
                _when(entry.at, zone),
                outcome,
                entry.tool,
                entry.decided_by or "-",
                _call(entry.tool, entry.arguments),
                _name(entry.reason, "-"),
            )
        )
    return _table(rows), True


async def _pending_approvals(store: ApprovalStore, zone: ZoneInfo | None) -> tuple[list[str], bool]:
    pending = await store.pending()
    if not pending:
        return ["No requests are waiting for a decision."], True
    rows = [("ID", "TOOL", "ASKED IN", "UNTIL", "CALL")]
    for request in pending:
        asked = request.asked
        places = ", ".join(f"{p.channel}:{p.chat_id}" for p in asked.places)
        until = _when(request.expires_at, zone)
        rows.append((request.id, asked.tool, places, until, _call(asked.tool, asked.arguments)))
    hint = "Decide in the chat: tap a button, or send /approve ID [once|chat|always] or /deny ID."
    return [*_table(rows), hint], True


_CALL_WIDTH = 100


def _call(tool: str, arguments: str) -> str:
    """A call as one printable line: exec's command itself, other tools' arguments as JSON;
    cut when long."""
    text = arguments
    if tool == "exec":
        try:
            command = json.loads(arguments).get("command")
        except (ValueError, AttributeError):
            command = None
        text = command if isinstance(command, str) else arguments
    text = log.printable(text)
    return text if len(text) <= _CALL_WIDTH else text[: _CALL_WIDTH - 1] + "…"


def _when(moment: datetime, zone: ZoneInfo | None) -> str:
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z")


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _name(name: str | None, missing: str = "?") -> str:
    """A chat user's display name, chosen by them: escaped so it cannot move the cursor or
    pose as another line of the listing."""
    return log.printable(name) if name else missing


def onboard(path: Path, answers: dict[str, str]) -> list[str]:
    """Write the config (from the example, with `answers` filled in) and the workspace.

    Never overwrites: an existing config is kept and only missing workspace files are added.
    Returns what it did, one line each.

    Raises:
        ConfigError: the existing (or written) config is not valid.
    """
    lines: list[str] = []
    if path.exists():
        lines.append(f"config: {path} exists; left as it is")
    else:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        text = _fill_example(bundled("config.example.yaml").read_text(encoding="utf-8"), answers)
        # Exclusive create: a file that appeared meanwhile is not clobbered; 0600 as it may
        # hold an API key.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        lines.append(f"config: wrote {path}")
    config = load(path)
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    created = copy_template(config.workspace_path)
    state = f"added {len(created)} files" if created else "already complete"
    lines.append(f"workspace: {config.workspace_path} ({state})")
    if not path.exists() or not answers.get("api_key"):
        lines.append(
            "next: set agent.api_key (or your provider's key variable), then `nanobot agent -m hi`"
        )
    return lines


def _fill_example(text: str, answers: dict[str, str]) -> str:
    for key in ("model", "api_key", "api_base"):
        value = answers.get(key)
        if value:
            # A JSON string is a valid YAML scalar; escaped so re.sub takes it literally.
            line = f"  {key}: {json.dumps(value)}".replace("\\", "\\\\")
            text = re.sub(rf"(?m)^  {key}: .*$", line, text, count=1)
    return text


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
    for name in ("telegram", "discord"):
        channel = getattr(config.channels, name)
        state = f"enabled, {len(channel.allow_from)} allowed" if channel.enabled else "disabled"
        rows.append((name, state))
    target = config.store_target
    if isinstance(target, Path) and not target.exists():
        return [*rows, ("state", f"{target} (not created yet)")]
    return rows + asyncio.run(_store_rows(target, check_db, _zone(config), agreement(config)))


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
    """`status --check`: one line, and whether a gateway on this data dir beat in the last
    `STALE_AFTER`. Reads the state database without checking it (it runs every minute
    under Docker) and creates nothing: on a fresh data dir no gateway has run.

    Raises:
        StoreError: the state database cannot be read.
    """
    target = config.store_target
    if isinstance(target, Path) and not target.exists():
        return f"no gateway has run on this data dir yet ({target} does not exist)", False
    return asyncio.run(_health(target, _zone(config)))


async def _health(target: Path | str, zone: ZoneInfo | None) -> tuple[str, bool]:
    async with await Database.open(target, check=None) as db:
        members = Members(db)
        found = await members.all()
        now = members.now()
    allowed = f"{STALE_AFTER.total_seconds():g} s"
    if not found:
        return "no gateway is running (none is registered in the state database)", False
    latest = found[0]  # the latest beat first
    if latest.stale(now):
        return (
            f"no gateway has beaten since {moment(latest.beat_at, zone)} "
            f"({latest.describe()}); a running one beats every "
            f"{BEAT_INTERVAL.total_seconds():g} s and counts as down after {allowed}",
            False,
        )
    return (
        f"gateway alive: {latest.describe()}, last beat {ago(now - latest.beat_at)} ago "
        f"(allowed: {allowed})",
        True,
    )


def _zone(config: Config) -> ZoneInfo | None:
    """The zone times are shown in: the config's `timezone`, else the machine's."""
    return ZoneInfo(config.timezone) if config.timezone else None


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


async def _jobs_call(config: Config, work: Callable[[Jobs], Awaitable[list[str]]]) -> list[str]:
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    async with await Database.open(config.store_target) as db:
        return await work(Jobs(CronStore(db), config.timezone, channels=_channels(config)))


def _channels(config: Config) -> dict[str, bool]:
    """Each channel a job can deliver to, and whether it is enabled."""
    return {
        name: getattr(config.channels, name).enabled for name in type(config.channels).model_fields
    }


def cron(config: Config, work: Callable[[Jobs], Awaitable[list[str]]]) -> list[str]:
    """Run one `nanobot cron` action against the job store; its lines to print.

    Raises:
        ScheduleError: a schedule or a channel was refused (nothing was stored).
        NanobotError: the job does not exist, or the store failed.
    """
    log.configure(config, quiet=True)
    return asyncio.run(_jobs_call(config, work))


def added_line(job: Job, zone: str) -> str:
    """What `cron add` says: the new job's id and its first run, in the job's zone."""
    assert job.next_run is not None, "a new job is enabled"
    return f"Added job {job.id}; next run {format_time(job.next_run, zone_of(job.schedule, zone))}."


GATEWAY_LOCK = "gateway.lock"
"""The file in the data dir that a running gateway holds locked (`nanobot.launch` takes it;
this module must not import the app). It holds the gateway's pid, then its member id."""


def lock_holder(fd: int) -> str:
    """The pid written in the open gateway lock file `fd` ("unknown" if none is)."""
    words = os.pread(fd, 100, 0).decode("ascii", "replace").split()
    return words[0] if words else "unknown"


def gateway_pid(data_dir: Path) -> str | None:
    """The pid of the gateway running on `data_dir`, or None when none is.

    The gateway holds an exclusive `flock` on its lock file while it runs (the kernel drops
    it however the process ends). This takes a shared one for an instant to see whether it
    can: a gateway starting in that very instant would be refused and say so.
    """
    try:
        fd = os.open(data_dir / GATEWAY_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return lock_holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


PICKUP_WAIT = 5.0
"""Seconds `cron run` waits for the running gateway to start the job: it looks once a second."""


async def run_job(
    jobs: Jobs, job_id: str, gateway: str | None, wait: float = PICKUP_WAIT
) -> list[str]:
    """`cron run`: make the job due now and say what happens. `gateway` is the pid of the
    gateway running on this data dir (`gateway_pid`), None when none runs.

    With a gateway, this watches the job until its scheduler starts it, a few times a second
    for `wait` seconds at most (SQLite cannot tell another process of a change).

    Raises:
        NanobotError: there is no such job.
    """
    due = await jobs.run_now(job_id)
    if due is None:
        raise NanobotError(f"no job {job_id} (see nanobot cron list)")
    if gateway is None:
        return [
            f"Job {job_id} will run when a gateway starts (none is running now). If that is"
            " more than cron.catch_up_window from now, this run lapses."
        ]
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        job = await jobs.get(job_id)
        if job is None:
            return [f"Job {job_id} was removed meanwhile."]
        if job.last_run is not None and job.last_run >= due:
            if job.last_status == "missed":
                return [f"Job {job_id} did not start: its previous run is still going."]
            return [f"Job {job_id} started in the running gateway (pid {gateway})."]
        if job.next_run != due:
            return [f"Job {job_id} was changed meanwhile; see nanobot cron list."]
    return [
        f"Job {job_id} is due now, but the running gateway (pid {gateway}) has not started it"
        f" within {wait:g} s: its cron may be off (cron.enabled), or it is busy."
    ]


def job_lines(jobs: list[Job], zone: str, last: Mapping[str, JobRun] | None = None) -> list[str]:
    """The `cron list` table: id, name, schedule, zone, next run in its zone, and how the
    last run went (from `last`, each job's latest run, with its answer's delivery)."""
    last = last or {}
    if not jobs:
        return ["No jobs. Add one with: nanobot cron add --name NAME --message TEXT --every 1h"]
    rows = [("ID", "NAME", "SCHEDULE", "TZ", "NEXT RUN", "LAST")]
    for job in jobs:
        tz = zone_of(job.schedule, zone)
        upcoming = format_time(job.next_run, tz) if job.next_run else "disabled"
        target = f" -> {job.channel}:{job.to}" if job.channel else ""
        rows.append(
            (
                job.id,
                job.name + target,
                describe(job.schedule),
                tz,
                upcoming,
                last[job.id].summary if job.id in last else job.last_status or "-",
            )
        )
    return _table(rows)


def run_lines(job: Job, runs: list[JobRun], zone: str) -> list[str]:
    """The `cron runs` table, newest first: when each run was due and started (in the
    job's zone), how its turn ended, and whether its answer reached the chat (and why not)."""
    if not runs:
        return [f"Job {job.id} ({job.name}) has not run yet."]
    tz = zone_of(job.schedule, zone)
    rows = [("RUN", "DUE", "STARTED", "STATUS", "ANSWER", "DETAIL")]
    for run in runs:
        due = format_time(run.due_at, tz) if run.due_at else "by hand"
        answer = "-" if run.delivery is None else DELIVERY_WORDS[run.delivery]
        failure = run.delivery_error if run.delivery == "failed" else None
        detail = "; ".join(text for text in (run.error, failure) if text)
        rows.append(
            (
                str(run.id),
                due,
                format_time(run.started_at, tz),
                run.status,
                answer,
                log.printable(detail) if detail else "",
            )
        )
    return _table(rows)


def taint(config: Config, action: str, *paths: str) -> tuple[list[str], bool]:
    """Run a `nanobot taint` action: `list` the files the taint ledger marks, or `clear`
    PATH… (workspace-relative, as listed: you vouch for what they hold now). Returns the
    lines to print and whether it succeeded."""
    log.configure(config, quiet=True)
    zone = ZoneInfo(config.timezone) if config.timezone else None

    async def work(db: Database) -> tuple[list[str], bool]:
        store = TaintStore(db)
        if action == "clear":
            await store.clear(paths)
            return [f"Cleared {len(paths)} path(s): their content counts as yours now."], True
        marks = await store.all()
        if not marks:
            return ["No file is marked as holding content from outside."], True
        rows = [("PATH", "MARKED", "SESSION", "WHERE FROM")]
        for mark in marks:
            when = _when(mark.marked_at, zone)
            source = log.printable(mark.source)
            rows.append((log.printable(mark.path), when, mark.session_key or "-", source))
        return _table(rows), True

    return _on_store(config, work)
