"""The cron service and the cron tool with the real store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nanobot.bus.events import SKIPPED_FOR_BUDGET, InboundMessage, TurnOutcome
from nanobot.bus.intake import IntakePaused
from nanobot.cron.jobs import Jobs, ScheduleSpec
from nanobot.cron.models import At, Cron, Every, Job
from nanobot.cron.service import (
    JUMP_TOLERANCE,
    WATCH_INTERVAL,
    CronService,
    job_event,
)
from nanobot.errors import StoreError
from nanobot.outage import DEFAULT_BACKOFF
from nanobot.store import Database
from nanobot.store.cron import CronStore
from nanobot.tools.base import ToolContext, current_context
from nanobot.tools.cron import CronTool
from nanobot.tools.registry import ToolRegistry


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


PAUSE = 5.0  # seconds a paused intake says to wait


class FakeClock:
    """Time that moves only when the test moves it, and says when the service is idle.

    Two clocks: the wall clock (`now`), and a monotonic one that sleeps are measured on.
    `advance` moves both, as time passing does; `jump` moves only the wall clock, as setting
    the time does."""

    def __init__(self) -> None:
        self.time = datetime.now(UTC)
        self.mono = 1000.0
        # (monotonic deadline, wake event, future resolved when the deadline passes): who is
        # asleep.
        self._sleepers: list[tuple[float | None, asyncio.Event | None, asyncio.Future[None]]]
        self._sleepers = []
        self._changed = asyncio.Event()

    def now(self) -> datetime:
        return self.time

    def monotonic(self) -> float:
        return self.mono

    async def sleep(self, seconds: float | None, wake: asyncio.Event | None = None) -> None:
        deadline = None if seconds is None else self.mono + seconds
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
        self.mono += delta.total_seconds()
        for entry in list(self._sleepers):
            deadline, _, done = entry
            if deadline is not None and deadline <= self.mono:
                self._sleepers.remove(entry)
                done.set_result(None)
        self._changed.set()

    def jump(self, delta: timedelta) -> None:
        """Set the wall clock `delta` away; no time passes, so no sleeper wakes."""
        self.time += delta

    async def asleep(self, count: int) -> None:
        """Wait until exactly `count` are asleep."""
        async with asyncio.timeout(10):
            while len(self._sleepers) != count:
                self._changed.clear()
                await self._changed.wait()

    async def settled(self) -> None:
        """Wait until the scheduler and the watcher are both asleep with nothing to wake them."""
        async with asyncio.timeout(10):
            while len(self._sleepers) < 2 or any(
                w is not None and w.is_set() for _, w, _ in self._sleepers
            ):
                self._changed.clear()
                await self._changed.wait()


class Runner:
    """The gate and the dispatcher as the service sees them: takes each run's event and
    reports it finished (at once, or once `hold` is set)."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.events: list[InboundMessage] = []
        self.event = asyncio.Event()
        self.hold: asyncio.Event | None = None
        self.service: CronService | None = None
        self.fail = False
        self.paused = 0  # hand-overs refused with IntakePaused before one is taken
        self._turns: set[asyncio.Task[None]] = set()

    async def submit(self, message: InboundMessage) -> int | None:
        if self.fail:
            raise StoreError("disk full")
        if self.paused:
            self.paused -= 1
            raise IntakePaused("intake is stopped", reason="disk full", retry_in=PAUSE)
        assert message.route.session is not None
        self.ran.append(message.route.session.removeprefix("cron:"))
        self.events.append(message)
        self.event.set()
        turn = asyncio.create_task(self._turn(message))
        self._turns.add(turn)
        turn.add_done_callback(self._turns.discard)
        return len(self.events)

    async def _turn(self, message: InboundMessage) -> None:
        if self.hold is not None:
            await self.hold.wait()
        assert self.service is not None
        await self.service.finished(message, TurnOutcome("completed", "done", delivered=True))

    async def wait(self, count: int, seconds: float = 10) -> None:
        async with asyncio.timeout(seconds):
            while len(self.ran) < count:
                self.event.clear()
                await self.event.wait()


async def start(
    store: CronStore,
    runner: Runner,
    clock: FakeClock,
    window: timedelta = timedelta(hours=1),
    channels: list[str] | None = None,
) -> asyncio.Task[None]:
    service = CronService(store, runner, catch_up_window=window, clock=clock, channels=channels)
    runner.service = service
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
    assert run.delivery is None  # the outbox records it, and nothing was queued here
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

    class Editing(Runner):
        async def _turn(self, message: InboundMessage) -> None:
            assert message.route.session is not None
            await jobs.remove(message.route.session.removeprefix("cron:"))
            new = await jobs.add("follow-up", "next", ScheduleSpec(every="1h"))
            added.append(new.id)
            edited.set()
            await super()._turn(message)

    first = await jobs.add("editor", "m", ScheduleSpec(every="1s"))
    assert first.next_run is not None
    clock.advance(first.next_run - clock.now())
    task = await start(store, Editing(), clock)
    async with asyncio.timeout(10):
        await edited.wait()
    clock.advance(timedelta(seconds=WATCH_INTERVAL))  # the watcher sees the edits
    await clock.settled()
    assert not task.done()  # the scheduler survived its job changing the table under it
    remaining = [job.id for job in await jobs.all()]
    assert first.id not in remaining
    assert added[0] in remaining
    await stop(task)


async def test_a_run_outlives_a_restart_and_records_how_its_resumed_turn_ended(
    db: Database,
) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    runner.hold = asyncio.Event()
    job = await Jobs(store, "UTC").add("long", "m", ScheduleSpec(every="1h"))
    assert job.next_run is not None
    clock.advance(job.next_run - clock.now())
    task = await start(store, runner, clock)
    await runner.wait(1)
    await stop(task)  # the scheduler stops; the run's turn is the dispatcher's
    (run, *_) = await store.runs(job.id)
    assert run.status == "running"

    restarted = Runner()
    task = await start(store, restarted, clock)  # a crash: the run is marked at start-up
    (run, *_) = await store.runs(job.id)
    assert run.status == "interrupted"
    assert restarted.service is not None  # the journal resumed the turn; it ends well
    await restarted.service.finished(runner.events[0], TurnOutcome("completed", "done"))
    (run, *_) = await store.runs(job.id)
    assert (run.status, run.error) == ("ok", None)
    await stop(task)


async def test_a_run_that_cannot_be_handed_over_is_an_error_and_the_next_one_runs(
    db: Database,
) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    runner.fail = True
    job = await Jobs(store, "UTC").add("flaky", "m", ScheduleSpec(every="1h"))
    assert job.next_run is not None
    clock.advance(job.next_run - clock.now())
    task = await start(store, runner, clock)
    await clock.settled()
    (run,) = await store.runs(job.id)
    assert (run.status, run.error) == ("error", "StoreError: disk full")
    runner.fail = False
    clock.advance(timedelta(hours=1))
    await runner.wait(1)
    await clock.settled()
    assert [r.status for r in await store.runs(job.id)] == ["ok", "error"]
    await stop(task)


class AwayStore(CronStore):
    """The real store, whose database does not answer while `away` (a server restarting, a
    disk gone read-only): every read and write the scheduler makes raises `StoreError`."""

    away = False
    tries = 0  # reads and writes tried while away

    def _answer(self) -> None:
        if self.away:
            self.tries += 1
            raise StoreError("cannot use the store at ***: the database system is shutting down")

    async def version(self) -> int:
        self._answer()
        return await super().version()

    async def due(self, now: datetime) -> list[Job]:
        self._answer()
        return await super().due(now)

    async def next_due(self) -> datetime | None:
        self._answer()
        return await super().next_due()

    async def mark_interrupted_runs(self) -> int:
        self._answer()
        return await super().mark_interrupted_runs()

    async def list(self, owner: str | None = None, *, include_disabled: bool = False) -> list[Job]:
        self._answer()
        return await super().list(owner, include_disabled=include_disabled)


async def test_the_store_away_at_start_delays_the_schedule_and_ends_nothing(
    db: Database, warnings: list[str]
) -> None:
    store, runner, clock = AwayStore(db), Runner(), FakeClock()
    job = await Jobs(store, "UTC").add("due", "m", ScheduleSpec(every="1h"))
    assert job.next_run is not None
    clock.advance(job.next_run - clock.now())
    store.away = True
    service = CronService(store, runner, catch_up_window=HOUR, clock=clock)
    runner.service = service
    task = asyncio.create_task(service.run())
    await clock.asleep(1)
    for failures in range(1, 4):  # it tries again after each pause of the backoff, not sooner
        tries, pause = store.tries, DEFAULT_BACKOFF.pause(failures)
        clock.advance(timedelta(seconds=pause - 0.5))
        await asyncio.sleep(0.01)
        assert store.tries == tries
        clock.advance(timedelta(seconds=0.5))
        await clock.asleep(1)
        assert store.tries == tries + 1
    assert not task.done() and runner.ran == []
    store.away = False
    clock.advance(timedelta(seconds=DEFAULT_BACKOFF.pause(4)))
    await runner.wait(1)
    assert runner.ran == [job.id]  # due all along: it starts once the store answers
    await clock.settled()
    said = [line for line in warnings if "cron: the state database" in line]
    assert len(said) == 2  # one line when it failed, one when it answered again
    assert "failed" in said[0] and "answers again after 23 s" in said[1]  # 1 + 2 + 5 + 15
    await stop(task)


async def test_a_job_due_while_the_store_is_away_starts_once_when_it_answers(
    db: Database, warnings: list[str]
) -> None:
    store, runner, clock = AwayStore(db), Runner(), FakeClock()
    job = await hourly(store, clock)
    task = await start(store, runner, clock)
    store.away = True
    clock.advance(HOUR)  # due now, and the store away
    for _ in range(12):  # the watcher and the scheduler keep failing, and keep going
        clock.advance(timedelta(seconds=WATCH_INTERVAL))
        await clock.settled()
    assert store.tries > 12
    assert not task.done() and runner.ran == []
    store.away = False
    clock.advance(timedelta(seconds=WATCH_INTERVAL))  # the watcher's look gets through
    await runner.wait(1)
    await clock.settled()
    assert runner.ran == [job.id]  # once, though many looks failed meanwhile
    assert [r.status for r in await store.runs(job.id)] == ["ok"]
    assert len([line for line in warnings if "cron: the state database" in line]) == 2
    await stop(task)


async def test_a_run_waits_out_a_paused_intake_and_starts_when_it_reopens(
    db: Database, warnings: list[str]
) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    runner.paused = 2  # intake refuses the first two hand-overs: the store failed it
    job = await hourly(store, clock)
    task = await start(store, runner, clock)
    clock.advance(HOUR)
    for _ in range(2):
        await clock.asleep(3)  # the scheduler, the watcher, and the run as intake says
        assert runner.ran == []
        clock.advance(timedelta(seconds=PAUSE))
    await runner.wait(1)
    await clock.settled()
    assert runner.ran == [job.id]
    assert [r.status for r in await store.runs(job.id)] == ["ok"]  # not an error
    waited = [line for line in warnings if f"cron job {job.id}" in line]
    assert len(waited) == 2  # once when it began to wait (not at each try), once at the end
    assert "intake is paused" in waited[0]
    assert waited[1].strip() == f"cron job {job.id} is handed over after {2 * PAUSE:.0f} s"
    await stop(task)


async def hourly(store: CronStore, clock: FakeClock) -> Job:
    """An `every 1h` job made now: its grid is now + k hours."""
    now = clock.now()
    return await store.add(
        name="hourly", message="m", schedule=Every(3600, anchor=now), next_run=now + HOUR
    )


HOUR = timedelta(hours=1)


async def next_run(store: CronStore, job: Job) -> datetime | None:
    stored = await store.get(job.id)
    assert stored is not None
    return stored.next_run


async def test_after_the_clock_jumps_back_an_every_job_runs_on_its_grid_not_hours_late(
    db: Database, warnings: list[str]
) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    t0 = clock.now()
    job = await hourly(store, clock)
    task = await start(store, runner, clock)
    clock.jump(-timedelta(hours=5, minutes=30))
    clock.advance(timedelta(seconds=WATCH_INTERVAL))  # the watcher's next look notices
    await clock.settled()
    assert await next_run(store, job) == t0 - 5 * HOUR  # its grid's next point, 30 min away
    assert any("wall clock jumped -19800 s" in line for line in warnings)
    # The scheduler was told: it does not sleep out the hour it measured before the jump.
    clock.advance(timedelta(minutes=30) - 2 * timedelta(seconds=WATCH_INTERVAL))
    await clock.settled()
    assert runner.ran == []
    clock.advance(timedelta(seconds=WATCH_INTERVAL))
    await runner.wait(1)
    await clock.settled()
    assert await next_run(store, job) == t0 - 4 * HOUR
    await stop(task)


async def test_a_jump_forward_runs_at_once_what_fell_due_by_the_wall_clock(db: Database) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    t0 = clock.now()
    every = await hourly(store, clock)
    when = t0 + timedelta(hours=2, minutes=30)
    once = await store.add(name="once", message="m", schedule=At(when), next_run=when)
    task = await start(store, runner, clock)
    clock.jump(3 * HOUR)  # the scheduler still has an hour to sleep on the monotonic clock
    clock.advance(timedelta(seconds=WATCH_INTERVAL))
    await runner.wait(2)
    await clock.settled()
    assert sorted(runner.ran) == sorted([every.id, once.id])  # each once, not once per hour
    assert await next_run(store, every) == t0 + 4 * HOUR
    assert await next_run(store, once) is None
    await stop(task)


async def test_forward_then_back_an_every_job_is_not_left_hours_ahead(db: Database) -> None:
    # The case: hourly at 10:00, the clock jumps to 15:00, then back to 10:05.
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    nine = clock.now()
    job = await hourly(store, clock)
    task = await start(store, runner, clock)
    clock.jump(6 * HOUR)  # 15:00: the job is caught up once, next at 16:00
    clock.advance(timedelta(seconds=WATCH_INTERVAL))
    await runner.wait(1)
    await clock.settled()
    assert await next_run(store, job) == nine + 7 * HOUR
    clock.jump(nine + HOUR + timedelta(minutes=5) - clock.now())  # back to 10:05
    clock.advance(timedelta(seconds=WATCH_INTERVAL))
    await clock.settled()
    assert await next_run(store, job) == nine + 2 * HOUR  # 11:00, not 16:00
    clock.advance(nine + 2 * HOUR - clock.now())
    await runner.wait(2)
    await clock.settled()
    assert runner.ran == [job.id, job.id]
    await stop(task)


async def test_drift_within_the_tolerance_is_no_jump(db: Database, warnings: list[str]) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    task = await start(store, runner, clock)
    clock.jump(timedelta(seconds=JUMP_TOLERANCE))
    clock.advance(timedelta(seconds=WATCH_INTERVAL))
    await clock.settled()
    assert not any("jumped" in line for line in warnings)
    await stop(task)


async def test_a_next_run_left_ahead_by_a_wrong_clock_before_a_restart_moves_at_start(
    db: Database,
) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    now = clock.now()
    job = await store.add(
        name="ahead",
        message="m",
        schedule=Every(3600, anchor=now - timedelta(minutes=20)),
        next_run=now + 6 * HOUR,  # computed by a process whose clock was 6 h ahead
    )
    cron_job = await store.add(
        name="daily",
        message="m",
        schedule=Cron("0 9 * * *", "UTC"),
        next_run=now + 20 * HOUR,  # a wall-clock time: it stays
    )
    task = await start(store, runner, clock)
    assert await next_run(store, job) == now + timedelta(minutes=40)
    assert await next_run(store, cron_job) == now + 20 * HOUR
    await stop(task)


async def test_a_job_for_a_channel_no_longer_enabled_is_warned_about_at_start(
    db: Database, warnings: list[str]
) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    jobs = Jobs(store, "UTC")
    spec = ScheduleSpec(every="1h")
    kept = await jobs.add("tg", "m", spec, channel="telegram", to="1")
    gone = await jobs.add("dc", "m", spec, channel="discord", to="2")
    task = await start(store, runner, clock, channels=["telegram"])
    (warning,) = [line for line in warnings if "not enabled" in line]
    assert gone.id in warning and "channels.discord.enabled" in warning
    assert kept.id not in warning
    await stop(task)


def test_a_runs_event_is_a_turn_in_the_jobs_session_told_to_its_chat() -> None:
    now = datetime.now(UTC)
    job = Job(
        "j1", "plants", "water them", Every(3600), True, "telegram", "42", "x", now, now, None, None
    )
    event = job_event(job, 9)
    assert (event.session_key, event.chat.session_key, event.text) == (
        "cron:j1",
        "telegram:42",
        "water them",
    )
    assert (event.message_id, event.ref, event.route.deliver, event.source) == (
        "cron:j1:9",
        "9",
        True,
        "cron",
    )
    alone = job_event(replace(job, id="j2", channel=None, to=None), 1)
    assert not alone.route.deliver and alone.session_key == "cron:j2"


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


async def test_the_tool_shows_times_in_the_jobs_zone_and_says_where_answers_cannot_go(
    db: Database,
) -> None:
    registry = ToolRegistry([CronTool(Jobs(CronStore(db), "UTC"), deliverable=["telegram"])])

    async def call(channel: str, **arguments: object) -> str:
        token = current_context.set(ToolContext(channel, "1", f"{channel}:1", "run-1"))
        try:
            return (await registry.execute("cron", dict(arguments))).content
        finally:
            current_context.reset(token)

    added = await call("telegram", action="add", message="m", at="2030-12-01T09:00", tz=BERLIN)
    assert "next 2030-12-01 09:00 CET" in added
    assert "not sent anywhere" not in added
    alone = await call("terminal", action="add", message="m", cron="0 9 * * *")
    assert "next " in alone and " UTC" in alone
    assert alone.endswith("Its answers are not sent anywhere: jobs cannot deliver to terminal")


BERLIN = "Europe/Berlin"


async def test_a_run_over_its_budget_is_recorded_as_skipped(db: Database) -> None:
    store, runner, clock = CronStore(db), Runner(), FakeClock()
    runner.hold = asyncio.Event()
    job = await Jobs(store, "UTC").add("costly", "m", ScheduleSpec(every="1h"))
    assert job.next_run is not None
    clock.advance(job.next_run - clock.now())
    task = await start(store, runner, clock)
    await runner.wait(1)
    assert runner.service is not None
    over = "Over budget: the daily budget of cron jobs is $1.00, and $1.00 is spent."
    await runner.service.finished(runner.events[0], TurnOutcome(SKIPPED_FOR_BUDGET, over))
    (run, *_) = await store.runs(job.id)
    assert (run.status, run.error) == ("skipped", over)
    await stop(task)
