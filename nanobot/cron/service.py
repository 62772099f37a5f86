"""The cron service: runs jobs when they fall due, while the gateway runs.

One scheduler task sleeps until the earliest due job and is woken within a second when jobs
change, in this process or through `nanobot cron` in another (SQLite cannot notify across
processes, so a watcher compares the store's change counter once a second). Each run is its
own task, owned here; a job never overlaps itself, and a job that edits jobs while it runs
only wakes the scheduler. Time comes from a `Clock`, so tests move it instead of sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from loguru import logger

from nanobot.cron.job_store import JobStore
from nanobot.cron.models import Job, RunStatus
from nanobot.cron.schedule import catch_up
from nanobot.tasks import TaskSet

WATCH_INTERVAL = 1.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job's run went: `error` set on failure; `delivered` when its result reached
    the job's chat."""

    error: str | None = None
    delivered: bool = False


RunJob = Callable[[Job], Awaitable[Outcome]]


class Clock(Protocol):
    """What the service knows of time."""

    def now(self) -> datetime:
        """The current time, timezone-aware."""
        ...

    async def sleep(self, seconds: float | None, wake: asyncio.Event | None = None) -> None:
        """Return once `seconds` have passed (never, for None) or `wake` is set, if sooner.
        Cancellation-safe: it only waits."""
        ...


class SystemClock:
    """The wall clock, and asyncio's timers."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float | None, wake: asyncio.Event | None = None) -> None:
        if wake is None:
            await asyncio.sleep(float("inf") if seconds is None else seconds)
            return
        try:
            async with asyncio.timeout(seconds):
                await wake.wait()
        except TimeoutError:
            pass


class CronService:
    def __init__(
        self,
        store: JobStore,
        run_job: RunJob,
        *,
        catch_up_window: timedelta,
        clock: Clock | None = None,
    ) -> None:
        self._store = store
        self._run_job = run_job
        self._window = catch_up_window
        self._clock = clock or SystemClock()
        self._wake = asyncio.Event()
        self._runs = TaskSet("cron")
        self._running: set[str] = set()  # the jobs whose run is in progress

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
            await self._start_due(self._clock.now())
            upcoming = await self._store.next_due()
            delay = None if upcoming is None else (upcoming - self._clock.now()).total_seconds()
            self._wake.clear()
            if delay is not None and delay <= 0:
                continue
            await self._clock.sleep(delay, self._wake)  # until the earliest job is due

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
            await self._clock.sleep(WATCH_INTERVAL)
            version = await self._store.version()
            if version != seen:
                seen = version
                self._wake.set()
