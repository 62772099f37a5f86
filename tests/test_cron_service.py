"""The cron service and the cron tool with the real store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nanobot.cron.jobs import Jobs, ScheduleSpec
from nanobot.cron.models import Every, Job
from nanobot.cron.service import WATCH_INTERVAL, CronService, Outcome, RunJob
from nanobot.store import Database
from nanobot.store.cron import CronStore
from nanobot.tools.base import ToolContext, current_context
from nanobot.tools.cron import CronTool
from nanobot.tools.registry import ToolRegistry


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


class FakeClock:
    """Time that moves only when the test moves it, and says when the service is idle."""

    def __init__(self) -> None:
        self.time = datetime.now(UTC)
        # (deadline, wake event, future resolved when the deadline passes): who is asleep.
        self._sleepers: list[tuple[datetime | None, asyncio.Event | None, asyncio.Future[None]]]
        self._sleepers = []
        self._changed = asyncio.Event()

    def now(self) -> datetime:
        return self.time

    async def sleep(self, seconds: float | None, wake: asyncio.Event | None = None) -> None:
        deadline = None if seconds is None else self.time + timedelta(seconds=seconds)
        entry = (deadline, wake, asyncio.get_running_loop().create_future())
        self._sleepers.append(entry)
        self._changed.set()
        woken = asyncio.ensure_future(wake.wait()) if wake is not None else None
        try:
            await asyncio.wait([entry[2], *filter(None, [woken])], return_when="FIRST_COMPLETED")
        finally:
            if woken is not None:
                woken.cancel()
            if entry in self._sleepers:
                self._sleepers.remove(entry)
            self._changed.set()

    def advance(self, delta: timedelta) -> None:
        """Move time on, waking (at once, as far as `settled` can tell) whoever is due."""
        self.time += delta
        for entry in list(self._sleepers):
            deadline, _, done = entry
            if deadline is not None and deadline <= self.time:
                self._sleepers.remove(entry)
                done.set_result(None)
        self._changed.set()

    async def settled(self) -> None:
        """Wait until the scheduler and the watcher are both asleep with nothing to wake them."""
        async with asyncio.timeout(10):
            while len(self._sleepers) < 2 or any(
                w is not None and w.is_set() for _, w, _ in self._sleepers
            ):
                self._changed.clear()
                await self._changed.wait()


class Runner:
    def __init__(self) -> None:
        self.ran: list[str] = []
        self.event = asyncio.Event()
        self.hold: asyncio.Event | None = None

    async def __call__(self, job: Job) -> Outcome:
        self.ran.append(job.id)
        self.event.set()
        if self.hold is not None:
            await self.hold.wait()
        return Outcome(delivered=True)

    async def wait(self, count: int, seconds: float = 10) -> None:
        async with asyncio.timeout(seconds):
            while len(self.ran) < count:
                self.event.clear()
                await self.event.wait()


async def start(
    store: CronStore, runner: RunJob, clock: FakeClock, window: timedelta = timedelta(hours=1)
) -> asyncio.Task[None]:
    service = CronService(store, runner, catch_up_window=window, clock=clock)
    task = asyncio.create_task(service.run())
    await clock.settled()
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_job_added_elsewhere_runs_without_a_restart(db: Database, tmp_path: Path) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    task = await start(store, runner, clock)
    # Another process (the CLI) adds a job: a second connection to the same file.
    async with await Database.open(tmp_path / "state.db") as cli_db:
        job = await Jobs(CronStore(cli_db), "UTC").add("soon", "ping", ScheduleSpec(every="1h"))
    clock.advance(timedelta(seconds=WATCH_INTERVAL))  # the watcher's next look
    await clock.settled()
    assert runner.ran == []  # the scheduler now sleeps until the job is due
    assert job.next_run is not None
    clock.advance(job.next_run - clock.now())
    await runner.wait(1)
    assert runner.ran == [job.id]
    await clock.settled()
    (run, *_) = await store.runs(job.id)
    assert run.status == "ok"
    assert run.delivered
    await stop(task)


async def test_missed_and_caught_up_runs(db: Database) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    now = clock.now()
    recent = await store.add(
        name="recent",
        message="m",
        schedule=Every(3600, anchor=now - timedelta(hours=5)),
        next_run=now - timedelta(minutes=10),
    )
    stale = await store.add(
        name="stale",
        message="m",
        schedule=Every(86400, anchor=now - timedelta(days=3, hours=5)),
        next_run=now - timedelta(hours=30),
    )
    task = await start(store, runner, clock)
    await runner.wait(1)
    await clock.settled()
    assert runner.ran == [recent.id]  # once, not once per missed hour
    (missed,) = await store.runs(stale.id)
    assert missed.status == "missed"
    for job_id in (recent.id, stale.id):
        job = await store.get(job_id)
        assert job is not None and job.next_run is not None and job.next_run > now
    await stop(task)


async def test_a_job_never_overlaps_itself(db: Database) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    runner.hold = asyncio.Event()
    job = await Jobs(store, "UTC").add("busy", "m", ScheduleSpec(every="1s"))
    assert job.next_run is not None
    clock.advance(job.next_run - clock.now())
    task = await start(store, runner, clock)
    await runner.wait(1)
    for _ in range(2):  # two more occurrences fall due while the first still runs
        clock.advance(timedelta(seconds=1))
        await clock.settled()
    assert runner.ran == [job.id]
    statuses = [run.status for run in await store.runs(job.id)]
    assert statuses == ["missed", "missed", "running"]
    runner.hold.set()
    await stop(task)


async def test_a_job_may_edit_jobs_while_it_runs(db: Database) -> None:
    store, clock = CronStore(db), FakeClock()
    jobs = Jobs(store, "UTC")
    added: list[str] = []
    edited = asyncio.Event()

    async def editing(job: Job) -> Outcome:
        await jobs.remove(job.id)
        new = await jobs.add("follow-up", "next", ScheduleSpec(every="1h"))
        added.append(new.id)
        edited.set()
        return Outcome()

    first = await jobs.add("editor", "m", ScheduleSpec(every="1s"))
    assert first.next_run is not None
    clock.advance(first.next_run - clock.now())
    task = await start(store, editing, clock)
    async with asyncio.timeout(10):
        await edited.wait()
    clock.advance(timedelta(seconds=WATCH_INTERVAL))  # the watcher sees the edits
    await clock.settled()
    assert not task.done()  # the scheduler survived its job changing the table under it
    remaining = [job.id for job in await jobs.all()]
    assert first.id not in remaining
    assert added[0] in remaining
    await stop(task)


async def test_a_crash_mid_run_is_recorded_as_interrupted(db: Database) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    runner.hold = asyncio.Event()
    job = await Jobs(store, "UTC").add("long", "m", ScheduleSpec(every="1s"))
    assert job.next_run is not None
    clock.advance(job.next_run - clock.now())
    task = await start(store, runner, clock)
    await runner.wait(1)
    await stop(task)  # shutdown cancels the run
    (run, *_) = await store.runs(job.id)
    assert run.status == "interrupted"


async def test_the_tool_is_scoped_to_its_chat(db: Database) -> None:
    jobs = Jobs(CronStore(db), "UTC")
    registry = ToolRegistry([CronTool(jobs, deliverable=["telegram"])])

    async def call(chat: str, **arguments: object) -> str:
        context = ToolContext("telegram", chat, f"telegram:{chat}", "run-1")
        token = current_context.set(context)
        try:
            result = await registry.execute("cron", dict(arguments))
        finally:
            current_context.reset(token)
        return result.content

    added = await call("1", action="add", message="water the plants", every="1d", name="plants")
    assert added.startswith("Scheduled job")
    job_id = added.split()[2].rstrip(":")
    (job,) = await jobs.all()
    assert (job.channel, job.to, job.owner) == ("telegram", "1", "telegram:1")
    assert "plants" in await call("1", action="list")
    assert await call("2", action="list") == "This chat has no scheduled jobs."
    refused = await call("2", action="remove", job_id=job_id)
    assert refused.startswith("Error: this chat has no job")
    assert len(await jobs.all()) == 1
    bad = await call("1", action="add", message="x", cron="0 25 * * *")
    assert "bad cron expression" in bad
    both = await call("1", action="add", message="x", cron="0 9 * * *", every="1h")
    assert "exactly one" in both
    assert await call("1", action="remove", job_id=job_id) == f"Removed job {job_id}."
