"""The cron service and the cron tool with the real store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nanobot.cron.jobs import Jobs, ScheduleSpec
from nanobot.cron.models import Every, Job
from nanobot.cron.service import CronService, Outcome
from nanobot.store import Database
from nanobot.store.cron import CronStore
from nanobot.tools.base import ToolContext, current_context
from nanobot.tools.cron import CronTool
from nanobot.tools.registry import ToolRegistry


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


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
    store: CronStore, runner: Runner, window: timedelta = timedelta(hours=1)
) -> tuple[CronService, asyncio.Task[None]]:
    service = CronService(store, runner, catch_up_window=window)
    return service, asyncio.create_task(service.run())


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_job_added_elsewhere_runs_without_a_restart(db: Database, tmp_path: Path) -> None:
    store, runner = CronStore(db), Runner()
    _, task = await start(store, runner)
    # Another process (the CLI) adds a job: a second connection to the same file.
    async with await Database.open(tmp_path / "state.db") as cli_db:
        job = await Jobs(CronStore(cli_db), "UTC").add("soon", "ping", ScheduleSpec(every="1s"))
    await runner.wait(1, seconds=5)
    assert runner.ran[0] == job.id
    (run, *_) = await store.runs(job.id)
    assert run.status == "ok"
    assert run.delivered
    await stop(task)


async def test_missed_and_caught_up_runs(db: Database) -> None:
    store, runner = CronStore(db), Runner()
    now = datetime.now(UTC)
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
    _, task = await start(store, runner)
    await runner.wait(1)
    await asyncio.sleep(0.2)
    assert runner.ran == [recent.id]  # once, not once per missed hour
    (missed,) = await store.runs(stale.id)
    assert missed.status == "missed"
    for job_id in (recent.id, stale.id):
        job = await store.get(job_id)
        assert job is not None and job.next_run is not None and job.next_run > now
    await stop(task)


async def test_a_job_never_overlaps_itself(db: Database) -> None:
    store, runner = CronStore(db), Runner()
    runner.hold = asyncio.Event()
    job = await Jobs(store, "UTC").add("busy", "m", ScheduleSpec(every="1s"))
    _, task = await start(store, runner)
    await runner.wait(1)
    await asyncio.sleep(2.5)  # two more occurrences fall due while the first still runs
    assert runner.ran == [job.id]
    statuses = [run.status for run in await store.runs(job.id)]
    assert "missed" in statuses
    runner.hold.set()
    await stop(task)


async def test_a_job_may_edit_jobs_while_it_runs(db: Database) -> None:
    store = CronStore(db)
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
    service = CronService(store, editing, catch_up_window=timedelta(hours=1))
    task = asyncio.create_task(service.run())
    await asyncio.wait_for(edited.wait(), 5)
    await asyncio.sleep(0.3)
    assert not task.done()  # the scheduler survived its job changing the table under it
    remaining = [job.id for job in await jobs.all()]
    assert first.id not in remaining
    assert added[0] in remaining
    await stop(task)


async def test_a_crash_mid_run_is_recorded_as_interrupted(db: Database) -> None:
    store, runner = CronStore(db), Runner()
    runner.hold = asyncio.Event()
    job = await Jobs(store, "UTC").add("long", "m", ScheduleSpec(every="1s"))
    _, task = await start(store, runner)
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
