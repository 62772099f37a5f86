"""The cron service: runs jobs when they fall due, while the gateway runs.

One scheduler task sleeps until the earliest due job and is woken when jobs change: at once
for changes made in this process, and within a second for changes made by `nanobot cron`
in another process (SQLite cannot notify across processes, so a watcher compares the store's
change counter once a second). Each run is its own task, owned here; a job never overlaps
itself, and a job that edits jobs while it runs only wakes the scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from loguru import logger

from nanobot.cron.models import Job, RunStatus
from nanobot.cron.schedule import catch_up
from nanobot.store.cron import CronStore
from nanobot.tasks import TaskSet

WATCH_INTERVAL = 1.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job's run went: `error` set on failure; `delivered` when its result reached
    the job's chat."""

    error: str | None = None
    delivered: bool = False


RunJob = Callable[[Job], Awaitable[Outcome]]


class CronService:
    def __init__(self, store: CronStore, run_job: RunJob, *, catch_up_window: timedelta) -> None:
        self._store = store
        self._run_job = run_job
        self._window = catch_up_window
        self._wake = asyncio.Event()
        self._runs = TaskSet("cron")
        self._running: set[str] = set()  # the jobs whose run is in progress

    def changed(self) -> None:
        """Jobs changed in this process: look at the schedule again now."""
        self._wake.set()

    async def run(self) -> None:
        """Schedule until cancelled; cancelling stops the job runs in progress too."""
        interrupted = await self._store.mark_interrupted_runs()
        if interrupted:
            logger.warning("{} cron run(s) were interrupted by a restart", interrupted)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._watch(), name="cron-watch")
                await self._schedule()
        finally:
            await self._runs.close()

    async def _schedule(self) -> None:
        while True:
            await self._start_due(datetime.now(UTC))
            upcoming = await self._store.next_due()
            delay = None if upcoming is None else (upcoming - datetime.now(UTC)).total_seconds()
            self._wake.clear()
            if delay is not None and delay <= 0:
                continue
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass  # the earliest job is due

    async def _start_due(self, now: datetime) -> None:
        for job in await self._store.due(now):
            assert job.next_run is not None
            decision = catch_up(job.schedule, job.next_run, now, self._window)
            if decision.action == "missed" or job.id in self._running:
                why = "still running" if job.id in self._running else "too late to catch up"
                await self._store.record_missed(job.id, job.next_run, next_run=decision.next_run)
                logger.warning(
                    "cron job {} ({}) missed its {} run: {}", job.id, job.name, job.next_run, why
                )
                continue
            run_id = await self._store.start_run(
                job.id, due_at=job.next_run, next_run=decision.next_run
            )
            if run_id is None:
                continue  # changed or taken meanwhile
            self._spawn(job, self._execute(job, run_id))

    def _spawn(self, job: Job, work: Coroutine[Any, Any, None]) -> None:
        self._running.add(job.id)
        task = self._runs.spawn(work, name=f"cron-{job.id}")
        task.add_done_callback(lambda _: self._running.discard(job.id))

    async def _execute(self, job: Job, run_id: int) -> None:
        logger.info("cron job {} ({}) starts", job.id, job.name)
        try:
            outcome = await self._run_job(job)
        except Exception as exc:  # noqa: BLE001 - a task boundary: record it, keep scheduling
            logger.exception("cron job {} failed", job.id)
            outcome = Outcome(error=f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            await asyncio.shield(self._store.finish_run(run_id, "interrupted"))
            raise
        status: RunStatus = "error" if outcome.error else "ok"
        await self._store.finish_run(run_id, status, outcome.error, outcome.delivered)
        logger.info("cron job {} finished: {}", job.id, status)

    async def _watch(self) -> None:
        seen = await self._store.version()
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            version = await self._store.version()
            if version != seen:
                seen = version
                self._wake.set()
