"""`nanobot cron`: the job store's actions, `cron run` against a running gateway, and the
tables of jobs and of their runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from nanobot import log
from nanobot.config import Config
from nanobot.cron.jobs import Jobs
from nanobot.cron.models import DELIVERY_WORDS, Job, JobRun
from nanobot.cron.schedule import describe, format_time, zone_of
from nanobot.errors import NanobotError
from nanobot.manage._command import table
from nanobot.store import Database
from nanobot.store.cron import CronStore


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
    return table(rows)


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
    return table(rows)
