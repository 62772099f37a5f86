"""The cron service: starts jobs when they fall due, while the gateway runs.

One scheduler task sleeps until the earliest due job and is woken within a second when jobs
change, in this process or through `nanobot cron` in another (SQLite cannot notify across
processes, so a watcher compares the store's change counter once a second). A due job's run
is recorded, then handed to the gate as an inbound event (`job_event`): it is journaled and
answered like a chat message, so a crash mid-run resumes the turn after the restart. The
dispatcher tells the service how each run's turn ended (`finished`); whether its answer
reached the chat is recorded on the run by the outbox, which alone knows (the reply names
its run). A job never overlaps itself,
and a job that edits jobs while it runs only wakes the scheduler. Time comes from a `Clock`,
so tests move it instead of sleeping.

Between runs the scheduler sleeps on the monotonic clock, which the wall clock's jumps (a
wrong time set by hand, NTP stepping, a suspended machine) do not move. The watcher's tick
and each wake-up compare how far both clocks went; when they part by more than
`JUMP_TOLERANCE`, the wall clock jumped: `every` jobs it had pushed ahead are moved back to
their grid (`realign`), and the scheduler wakes to look at the new time. Cron expressions and
`at` times name wall-clock times, so they follow the wall clock by definition: after a jump
forward what it passed over is due (and caught up or missed as after a restart); after a
jump back their next run stays put, and what already ran does not run again.

A store that fails (a database restarting, a disk full) never ends the service: the
scheduler says so once (`nanobot.outage`), looks again after each pause of
`store.retry_seconds` (or as soon as the watcher, still looking every second, gets through),
and starts what fell due meanwhile as after a restart. A run whose hand-over
finds intake paused by such a failure waits as intake says, and starts once it is taken.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Coroutine
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Final, Protocol, TypeVar

from loguru import logger

from nanobot.bus.events import SKIPPED_FOR_BUDGET, ChatRef, InboundMessage, TurnOutcome
from nanobot.bus.intake import EventIntake, once_taken
from nanobot.cron.job_store import JobStore
from nanobot.cron.models import Job, RunStatus
from nanobot.cron.schedule import catch_up, format_time, realign, zone_of
from nanobot.errors import StoreError
from nanobot.outage import DEFAULT_BACKOFF, Backoff, Outage
from nanobot.tasks import TaskSet

_T = TypeVar("_T")


class _Failed:
    """What a step the store failed returns (`CronService._stored`)."""


_FAILED: Final = _Failed()

WATCH_INTERVAL = 1.0
JUMP_TOLERANCE: Final = 2.0
"""Seconds the wall clock may part from the monotonic one between two looks before it counts
as a jump (NTP slews by at most half a millisecond a second)."""


def job_event(job: Job, run_id: int) -> InboundMessage:
    """The inbound event of one run of `job`: a turn in the job's own session, its answer
    delivered to the job's chat (nowhere when it has none)."""
    deliver = bool(job.channel and job.to)
    chat = ChatRef(job.channel or "cron", job.to or job.id)
    return InboundMessage.from_cron(
        chat, job.id, job.message, run_id, deliver=deliver, maker=job.created_by
    )


class Clock(Protocol):
    """What the service knows of time: the wall clock, which may jump, and a monotonic one,
    which never does."""

    def now(self) -> datetime:
        """The wall-clock time, timezone-aware."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that only moves forward, at the rate of real time."""
        ...

    async def sleep(self, seconds: float | None, wake: asyncio.Event | None = None) -> None:
        """Return once `seconds` have passed on the monotonic clock (never, for None) or `wake`
        is set, if sooner. Cancellation-safe: it only waits."""
        ...


class SystemClock:
    """The wall clock, and asyncio's timers (which run on the monotonic clock)."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

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
        intake: EventIntake,
        *,
        catch_up_window: timedelta,
        clock: Clock | None = None,
        channels: Collection[str] | None = None,
        retry: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        """`channels`: those the gateway delivers to; a job for another is warned about at
        start (None: not checked). `retry`: the pauses before the scheduler looks again
        after the store failed it."""
        self._store = store
        self._intake = intake
        self._window = catch_up_window
        self._clock = clock or SystemClock()
        self._channels = None if channels is None else frozenset(channels)
        self._wake = asyncio.Event()
        self._runs = TaskSet("cron")
        self._running: dict[int, str] = {}  # run id -> job id, of the runs in progress
        self._seen = (self._clock.now(), self._clock.monotonic())  # the clocks at the last look
        self._outage = Outage(
            failing="cron: the state database failed",
            effect="no job starts until it answers again; jobs due meanwhile start then",
            back="cron: the state database answers again",
            backoff=retry,
            now=self._clock.monotonic,
            sleep=self._clock.sleep,
        )

    async def run(self) -> None:
        """Schedule until cancelled. Cancelling stops the scheduling; the turns of runs
        handed over go on (they belong to the dispatcher, and resume after a restart).

        A store that fails (a database restarting, a disk full) pauses the scheduling, with
        one log line, until it answers again: the jobs due meanwhile stay due and start
        then, as after a restart (`catch_up`). Never raises over it."""
        while isinstance(await self._stored(self._prepare()), _Failed):
            await self._outage.wait()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._watch(), name="cron-watch")
                await self._schedule()
        finally:
            await self._runs.close()

    async def _prepare(self) -> None:
        """What a start looks at once: runs a crash cut short, jobs for channels not enabled,
        next runs a wrong clock left ahead."""
        interrupted = await self._store.mark_interrupted_runs()
        if interrupted:
            logger.warning(
                "{} cron run(s) were cut short by a restart; those whose turn was under way "
                "resume and record how they ended",
                interrupted,
            )
        await self._check_channels()
        # A next run computed while the clock was ahead, before this start, is caught too.
        self._seen = (self._clock.now(), self._clock.monotonic())
        await self._realign(self._seen[0])

    async def _schedule(self) -> None:
        while True:
            self._wake.clear()  # before looking: a wake-up from then on is not lost
            delay = await self._stored(self._look())
            if isinstance(delay, _Failed):
                await self._outage.wait()  # or less: the watcher may get through first
                continue
            if delay is not None and delay <= 0:
                continue
            # On the monotonic clock: a jump of the wall clock meanwhile wakes it (`_check_clock`).
            await self._clock.sleep(delay, self._wake)

    async def _look(self) -> float | None:
        """Start what is due; seconds until the next job is (None: no job is waiting)."""
        await self._check_clock()
        await self._start_due(self._clock.now())
        upcoming = await self._store.next_due()
        return None if upcoming is None else (upcoming - self._clock.now()).total_seconds()

    async def _stored(self, step: Coroutine[Any, Any, _T]) -> _T | _Failed:
        """What `step` returns, or `_FAILED` when the store failed it (told to the outage,
        which says it once); once a step gets through again, the scheduler looks at once."""
        try:
            result = await step
        except StoreError as exc:
            self._outage.failed(exc)
            return _FAILED
        if self._outage.active:
            self._outage.recovered()
            self._wake.set()
        return result

    async def _start_due(self, now: datetime) -> None:
        for job in await self._store.due(now):
            assert job.next_run is not None
            decision = catch_up(job.schedule, job.next_run, now, self._window)
            running = job.id in self._running.values()
            if decision.action == "missed" or running:
                why = "still running" if running else "too late to catch up"
                await self._store.record_missed(job.id, job.next_run, next_run=decision.next_run)
                logger.warning(
                    "cron job {} ({}) missed its {} run: {}",
                    job.id,
                    job.name,
                    format_time(job.next_run, zone_of(job.schedule, "UTC")),
                    why,
                )
                continue
            run_id = await self._store.start_run(
                job.id, due_at=job.next_run, next_run=decision.next_run
            )
            if run_id is None:
                continue  # changed or taken meanwhile
            self._running[run_id] = job.id
            self._runs.spawn(self._hand_over(job, run_id), name=f"cron-{job.id}")

    async def _hand_over(self, job: Job, run_id: int) -> None:
        logger.info("cron job {} ({}) starts", job.id, job.name)
        try:
            submit = partial(self._intake.submit, job_event(job, run_id))
            taken = await once_taken(
                submit, f"cron job {job.id}", now=self._clock.monotonic, sleep=self._clock.sleep
            )
        except Exception as exc:  # noqa: BLE001 - a task boundary: record it, keep scheduling
            logger.exception("cron job {} could not start", job.id)
            await self._finish(run_id, "error", f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            await asyncio.shield(self._finish(run_id, "interrupted"))
            raise
        else:
            if taken is None:  # cannot happen for a fresh run id; never leave it running
                await self._finish(run_id, "error", "the run was handed over twice")

    async def finished(self, message: InboundMessage, outcome: TurnOutcome) -> None:
        """Record how the run behind `message` ended (`OutcomeSink`)."""
        if message.ref is None:
            return
        error = None
        if not outcome.ok:
            error = outcome.text or (str(outcome.error) if outcome.error else outcome.status)
        status: RunStatus = "error" if error else "ok"
        if outcome.status == SKIPPED_FOR_BUDGET:
            status = "skipped"
        try:
            await self._finish(int(message.ref), status, error)
        except Exception:  # noqa: BLE001 - told by the dispatcher, which must go on
            logger.exception("could not record the end of cron run {}", message.ref)

    async def _finish(self, run_id: int, status: RunStatus, error: str | None = None) -> None:
        job_id = self._running.pop(run_id, None)
        await self._store.finish_run(run_id, status, error)
        logger.info("cron job {} finished: {}", job_id or f"(run {run_id})", status)

    def changed(self) -> None:
        """A job was changed elsewhere (another member of a cluster said so): look now,
        rather than at the next look at the store's version."""
        self._wake.set()

    async def _watch(self) -> None:
        seen = await self._stored(self._store.version())
        while True:
            await self._clock.sleep(WATCH_INTERVAL)
            version = await self._stored(self._check_version())
            if not isinstance(version, _Failed) and version != seen:
                seen = version
                self._wake.set()

    async def _check_version(self) -> int:
        await self._check_clock()
        return await self._store.version()

    async def _check_clock(self) -> None:
        """Notice a jump of the wall clock since the last look; then realign and wake."""
        wall, mono = self._clock.now(), self._clock.monotonic()
        last_wall, last_mono = self._seen
        self._seen = (wall, mono)
        jump = (wall - last_wall).total_seconds() - (mono - last_mono)
        if abs(jump) <= JUMP_TOLERANCE:
            return
        moved = await self._realign(wall)
        logger.warning(
            "the wall clock jumped {:+.0f} s; due times looked at again, {} interval job(s)"
            " moved back to their schedule",
            jump,
            moved,
        )
        self._wake.set()

    async def _realign(self, now: datetime) -> int:
        """Move `every` jobs that a clock running ahead pushed too far ahead; how many."""
        moved = 0
        for job in await self._store.list():
            assert job.next_run is not None
            new = realign(job.schedule, job.next_run, now)
            if new is not None and await self._store.update_next_run(
                job.id, new, expected=job.next_run
            ):
                logger.info(
                    "cron job {} ({}) moves from {} to {}",
                    job.id,
                    job.name,
                    job.next_run.isoformat(timespec="seconds"),
                    new.isoformat(timespec="seconds"),
                )
                moved += 1
        return moved

    async def _check_channels(self) -> None:
        if self._channels is None:
            return
        for job in await self._store.list():
            if job.channel is not None and job.channel not in self._channels:
                logger.warning(
                    "cron job {} ({}) delivers to {}, which is not enabled: its answers cannot"
                    " be delivered until channels.{}.enabled is set (or the job is replaced)",
                    job.id,
                    job.name,
                    job.channel,
                    job.channel,
                )
