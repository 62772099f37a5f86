"""`nanobot cron` as a user runs it: channels checked when a job is added, times in the job's
zone, and what `cron run` says with and without a gateway running."""

from __future__ import annotations

import asyncio
import fcntl
import os
from datetime import timedelta
from pathlib import Path

import pytest

from nanobot.bus.events import InboundMessage, TurnOutcome
from nanobot.cron.jobs import Jobs, ScheduleSpec
from nanobot.cron.service import CronService
from nanobot.manage import GATEWAY_LOCK, gateway_pid, run_job
from nanobot.store import Database
from nanobot.store.cron import CronStore
from tests.conftest import Home
from tests.test_cli import nanobot

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

TELEGRAM_ON = "channels:\n  telegram: {enabled: true, token: '123:tg-secret', allow_from: [1]}\n"


def add_args(*extra: str) -> tuple[str, ...]:
    return ("cron", "add", "--name", "n", "--message", "m", "--every", "1h", *extra)


async def test_a_job_for_a_disabled_or_unknown_channel_is_refused(home: Home) -> None:
    home.write_config(home.config.read_text(encoding="utf-8") + TELEGRAM_ON)
    disabled = await nanobot(home, *add_args("--channel", "discord", "--to", "5"))
    assert disabled.code == 1
    assert "channel 'discord' is not enabled" in disabled.stderr
    assert "channels.discord.enabled" in disabled.stderr
    unknown = await nanobot(home, *add_args("--channel", "slack", "--to", "5"))
    assert unknown.code == 1
    assert "unknown channel 'slack': a job can deliver to discord or telegram" in unknown.stderr
    assert "No jobs" in (await nanobot(home, "cron", "list")).stdout  # nothing was stored
    enabled = await nanobot(home, *add_args("--channel", "telegram", "--to", "1"))
    assert enabled.code == 0, enabled.stderr
    assert "-> telegram:1" in (await nanobot(home, "cron", "list")).stdout


async def test_times_are_listed_in_the_jobs_zone(home: Home) -> None:
    home.write_config(home.config.read_text(encoding="utf-8") + "timezone: Europe/Berlin\n")
    at = await nanobot(
        home, *add_args()[:6], "--at", "2030-12-01T09:00", "--tz", "America/New_York"
    )
    assert at.code == 0, at.stderr
    daily = await nanobot(home, *add_args()[:6], "--cron", "0 9 * * *")
    assert daily.code == 0, daily.stderr
    listing = (await nanobot(home, "cron", "list")).stdout
    (at_row,) = [line for line in listing.splitlines() if "at 2030-12-01" in line]
    assert "America/New_York" in at_row and "2030-12-01 09:00 EST" in at_row
    (daily_row,) = [line for line in listing.splitlines() if "cron '0 9 * * *'" in line]
    assert "Europe/Berlin" in daily_row and " 09:00 CE" in daily_row  # CET or CEST


async def test_add_and_run_say_when_in_the_jobs_zone_and_what_will_happen(home: Home) -> None:
    added = await nanobot(
        home, *add_args()[:6], "--at", "2030-12-01T09:00", "--tz", "America/New_York"
    )
    assert added.code == 0, added.stderr
    assert added.stdout.startswith("Added job ")
    assert added.stdout.endswith("; next run 2030-12-01 09:00 EST.\n")
    job_id = added.stdout.split()[2].rstrip(";")
    run = await nanobot(home, "cron", "run", job_id)
    assert run.code == 0, run.stderr
    assert run.stdout.startswith(
        f"Job {job_id} will run when a gateway starts (none is running now)."
    )
    listing = (await nanobot(home, "cron", "list")).stdout
    assert "2030-12-01 09:00" not in listing.splitlines()[1]  # next run: now, not 2030
    missing = await nanobot(home, "cron", "run", "deadbeef")
    assert missing.code == 1
    assert "no job deadbeef" in missing.stderr


class Gateway:
    """The gateway as `cron run` sees it: a cron service on the same state file, whose runs
    end at once."""

    def __init__(self) -> None:
        self.service: CronService | None = None
        self.started: list[str] = []
        self.first = asyncio.Event()

    async def submit(self, message: InboundMessage) -> int | None:
        assert self.service is not None and message.route.session is not None
        self.started.append(message.route.session)
        self.first.set()
        await self.service.finished(message, TurnOutcome("completed", "done"))
        return len(self.started)


async def test_run_says_whether_a_gateway_started_the_job(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with await Database.open(path) as cli_db, await Database.open(path) as gateway_db:
        jobs = Jobs(CronStore(cli_db), "UTC")
        job = await jobs.add("n", "m", ScheduleSpec(every="1h"))

        # No gateway: the job is due now, and the user is told it waits for one.
        (line,) = await run_job(jobs, job.id, None)
        assert line.startswith(f"Job {job.id} will run when a gateway starts (none is running")
        due = await jobs.get(job.id)
        assert due is not None and due.next_run is not None
        assert due.next_run <= due.created_at + timedelta(seconds=5)

        # A gateway: it starts the job (the one already due, not a second run).
        gateway = Gateway()
        service = CronService(CronStore(gateway_db), gateway, catch_up_window=timedelta(hours=1))
        gateway.service = service
        task = asyncio.create_task(service.run())
        try:
            async with asyncio.timeout(10):
                await gateway.first.wait()
            (line,) = await run_job(jobs, job.id, "4242")
            assert line == f"Job {job.id} started in the running gateway (pid 4242)."
            assert gateway.started == [f"cron:{job.id}", f"cron:{job.id}"]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        runs = await jobs.runs(job.id)
        assert [run.status for run in runs] == ["ok", "ok"]


def test_a_running_gateway_is_known_by_its_lock(tmp_path: Path) -> None:
    assert gateway_pid(tmp_path) is None  # never started here
    fd = os.open(tmp_path / GATEWAY_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"4242\n")
        assert gateway_pid(tmp_path) is None  # left behind, nobody holds it
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the gateway does while it runs
        assert gateway_pid(tmp_path) == "4242"
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert gateway_pid(tmp_path) is None
    finally:
        os.close(fd)


async def test_runs_lists_a_jobs_runs_or_says_there_are_none(home: Home) -> None:
    added = await nanobot(home, *add_args())
    job_id = added.stdout.split()[2].rstrip(";")
    fresh = await nanobot(home, "cron", "runs", job_id)
    assert (fresh.code, fresh.stdout) == (0, f"Job {job_id} (n) has not run yet.\n")
    missing = await nanobot(home, "cron", "runs", "deadbeef")
    assert missing.code == 1
    assert "no job deadbeef" in missing.stderr
