"""The cron store against real SQLite files, including a second connection as the CLI."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import asyncpg
import pytest

from nanobot.cron import At, Cron, Every, Job, Schedule
from nanobot.errors import StoreError
from nanobot.store import CronStore, Database, Journal, migrations
from nanobot.store.cron import HISTORY_LIMIT, INTERRUPTED_ERROR
from nanobot.store.wakeups import CRON_CHANGED
from tests._clock import Clock

T0 = datetime(2026, 6, 15, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAILY = Cron("0 9 * * *", "Europe/Berlin")


@pytest.fixture
def clock() -> Clock:
    return Clock(T0 - HOUR)


@pytest.fixture
def store(db: Database, clock: Clock) -> CronStore:
    return CronStore(db, clock)


async def add(
    store: CronStore,
    name: str = "job",
    *,
    next_run: datetime = T0,
    owner: str | None = None,
    schedule: Schedule = DAILY,
) -> Job:
    return await store.add(
        name=name, message=f"do {name}", schedule=schedule, next_run=next_run, owner=owner
    )


# --- jobs ----------------------------------------------------------------------------------


async def test_add_stores_an_enabled_job(store: CronStore, clock: Clock) -> None:
    job = await store.add(
        name="standup",
        message="Summarise my calendar",
        schedule=DAILY,
        next_run=T0,
        channel="telegram",
        to="12345",
        owner="telegram:12345",
    )
    assert len(job.id) == 8
    int(job.id, 16)
    assert job.name == "standup"
    assert job.message == "Summarise my calendar"
    assert job.schedule == DAILY
    assert job.enabled
    assert (job.channel, job.to, job.owner) == ("telegram", "12345", "telegram:12345")
    assert job.next_run == T0
    assert (job.last_run, job.last_status) == (None, None)
    assert job.created_at == clock.time
    assert await store.get(job.id) == job


@pytest.mark.parametrize(
    "schedule",
    [
        Cron("0 9 * * 1-5", "America/New_York"),
        Every(600),
        Every(5400, datetime(2026, 6, 15, 9, 17, tzinfo=UTC)),
        Every(1.5),
        At(datetime(2026, 12, 1, 9, 0, tzinfo=timezone(timedelta(hours=1)))),
        At(datetime(2026, 12, 1, 9, 0, tzinfo=timezone(timedelta(hours=1))), "Europe/Paris"),
    ],
)
async def test_schedules_round_trip(store: CronStore, schedule: Schedule) -> None:
    job = await add(store, schedule=schedule)
    stored = await store.get(job.id)
    assert stored is not None
    assert stored.schedule == schedule
    if isinstance(schedule, At):
        assert isinstance(stored.schedule, At)
        assert stored.schedule.when.utcoffset() == timedelta(hours=1)  # shown as the user gave it


async def test_times_are_stored_as_utc_instants(store: CronStore) -> None:
    berlin = ZoneInfo("Europe/Berlin")
    job = await add(store, next_run=datetime(2026, 6, 15, 11, 0, tzinfo=berlin))
    assert job.next_run == T0
    assert job.next_run is not None and job.next_run.utcoffset() == timedelta(0)
    assert [j.id for j in await store.due(datetime(2026, 6, 15, 11, 0, tzinfo=berlin))] == [job.id]
    assert await store.due(datetime(2026, 6, 15, 10, 59, tzinfo=berlin)) == []


async def test_naive_times_are_refused(store: CronStore) -> None:
    with pytest.raises(ValueError, match="naive"):
        await add(store, next_run=datetime(2026, 6, 15, 9, 0))  # noqa: DTZ001


async def test_get_unknown_job_is_none(store: CronStore) -> None:
    assert await store.get("deadbeef") is None


async def test_list_orders_by_next_run_and_hides_disabled(store: CronStore) -> None:
    late = await add(store, "late", next_run=T0 + 2 * HOUR)
    early = await add(store, "early", next_run=T0)
    off = await add(store, "off", next_run=T0 + HOUR)
    assert await store.set_enabled(off.id, False)
    assert [j.name for j in await store.list()] == ["early", "late"]
    assert [j.name for j in await store.list(include_disabled=True)] == ["early", "late", "off"]
    assert {j.id for j in await store.list(include_disabled=True)} == {late.id, early.id, off.id}


async def test_set_enabled(store: CronStore) -> None:
    job = await add(store)
    assert await store.set_enabled(job.id, False)
    disabled = await store.get(job.id)
    assert disabled is not None
    assert (disabled.enabled, disabled.next_run) == (False, None)
    with pytest.raises(ValueError, match="needs its next run"):
        await store.set_enabled(job.id, True)
    assert await store.set_enabled(job.id, True, next_run=T0 + HOUR)
    enabled = await store.get(job.id)
    assert enabled is not None
    assert (enabled.enabled, enabled.next_run) == (True, T0 + HOUR)
    assert not await store.set_enabled("deadbeef", False)


async def test_update_next_run(store: CronStore) -> None:
    job = await add(store)
    assert await store.update_next_run(job.id, T0 + HOUR)
    moved = await store.get(job.id)
    assert moved is not None and moved.next_run == T0 + HOUR and moved.enabled
    assert await store.update_next_run(job.id, None)  # nothing left: disabled
    done = await store.get(job.id)
    assert done is not None and (done.enabled, done.next_run) == (False, None)
    assert not await store.update_next_run("deadbeef", T0)


async def test_update_next_run_only_from_the_expected_time(store: CronStore) -> None:
    job = await add(store)
    assert not await store.update_next_run(job.id, T0 + HOUR, expected=T0 - HOUR)
    assert await store.update_next_run(job.id, T0 + HOUR, expected=T0)
    moved = await store.get(job.id)
    assert moved is not None and moved.next_run == T0 + HOUR
    assert await store.set_enabled(job.id, False)
    assert not await store.update_next_run(job.id, T0, expected=T0 + HOUR)  # disabled meanwhile
    off = await store.get(job.id)
    assert off is not None and off.next_run is None


async def test_remove_deletes_the_job_and_its_history(store: CronStore, db: Database) -> None:
    job = await add(store)
    run = await store.start_run(job.id, due_at=T0, next_run=T0 + HOUR)
    assert run is not None
    assert await store.remove(job.id)
    assert await store.get(job.id) is None
    assert await store.runs(job.id) == []
    assert await db.fetchall("SELECT * FROM cron_runs") == []
    assert not await store.remove(job.id)


# --- owners --------------------------------------------------------------------------------


async def test_a_chat_neither_sees_nor_changes_another_chats_jobs(store: CronStore) -> None:
    mine = await add(store, "mine", owner="telegram:1")
    theirs = await add(store, "theirs", owner="discord:2")
    cli = await add(store, "cli")

    assert [j.name for j in await store.list("telegram:1")] == ["mine"]
    assert await store.get(theirs.id, owner="telegram:1") is None
    assert await store.get(cli.id, owner="telegram:1") is None
    assert await store.get(mine.id, owner="telegram:1") == mine
    assert not await store.remove(theirs.id, owner="telegram:1")
    assert not await store.remove(cli.id, owner="telegram:1")
    assert not await store.set_enabled(theirs.id, False, owner="telegram:1")
    assert await store.get(theirs.id) == theirs

    # The CLI (no owner) sees and may change everything.
    assert {j.name for j in await store.list()} == {"mine", "theirs", "cli"}
    assert await store.set_enabled(mine.id, False)
    assert await store.remove(theirs.id)
    assert await store.remove(mine.id, owner="telegram:1")
    assert [j.name for j in await store.list(include_disabled=True)] == ["cli"]


# --- due -----------------------------------------------------------------------------------


async def test_due_and_next_due(store: CronStore) -> None:
    assert await store.next_due() is None
    assert await store.due(T0) == []
    second = await add(store, "second", next_run=T0 + timedelta(minutes=1))
    first = await add(store, "first", next_run=T0)
    later = await add(store, "later", next_run=T0 + HOUR)
    off = await add(store, "off", next_run=T0 - HOUR)
    await store.set_enabled(off.id, False)

    assert await store.next_due() == T0
    assert await store.due(T0 - timedelta(microseconds=1)) == []
    assert [j.id for j in await store.due(T0)] == [first.id]
    assert [j.id for j in await store.due(T0 + 10 * timedelta(minutes=1))] == [first.id, second.id]
    assert len(await store.due(T0 + 2 * HOUR)) == 3

    await store.remove(first.id)
    await store.remove(second.id)
    assert await store.next_due() == later.next_run
    await store.set_enabled(later.id, False)
    assert await store.next_due() is None


# --- version -------------------------------------------------------------------------------


async def test_every_change_bumps_the_version(store: CronStore) -> None:
    versions = [await store.version()]

    async def changed() -> bool:
        versions.append(await store.version())
        return versions[-1] > versions[-2]

    assert versions == [0]
    job = await add(store, owner="telegram:1")
    assert await changed()
    await store.set_enabled(job.id, False)
    assert await changed()
    await store.set_enabled(job.id, True, next_run=T0)
    assert await changed()
    await store.update_next_run(job.id, T0 + HOUR)
    assert await changed()
    run = await store.start_run(job.id, due_at=T0 + HOUR, next_run=T0 + 2 * HOUR)
    assert run is not None
    assert await changed()
    await store.finish_run(run, "ok")
    assert await changed()
    await store.record_missed(job.id, T0 + 2 * HOUR, next_run=T0 + 3 * HOUR)
    assert await changed()
    await store.start_run(job.id, due_at=None, next_run=T0 + 3 * HOUR)
    assert await changed()
    assert await store.mark_interrupted_runs() == 1
    assert await changed()
    await store.remove(job.id)
    assert await changed()


async def test_refused_changes_leave_the_version(store: CronStore) -> None:
    job = await add(store, owner="telegram:1")
    before = await store.version()
    assert not await store.remove("deadbeef")
    assert not await store.remove(job.id, owner="discord:2")
    assert not await store.set_enabled(job.id, False, owner="discord:2")
    assert not await store.update_next_run("deadbeef", T0)
    assert await store.start_run(job.id, due_at=T0 - HOUR, next_run=T0 + HOUR) is None
    assert await store.record_missed("deadbeef", T0, next_run=None) is None
    assert not await store.finish_run(12345, "ok")
    assert await store.mark_interrupted_runs() == 0
    await store.runs(job.id)
    await store.list()
    await store.due(T0)
    assert await store.version() == before


async def test_changes_from_another_connection_are_seen(store_target: Path | str) -> None:
    """The CLI and the gateway: two processes, two connections, one file."""
    path = store_target
    async with await Database.open(path) as gateway_db, await Database.open(path) as cli_db:
        gateway, cli = CronStore(gateway_db), CronStore(cli_db)
        seen = await gateway.version()

        job = await add(cli, "from the shell", next_run=T0)
        assert await gateway.version() > seen
        assert [j.id for j in await gateway.due(T0)] == [job.id]
        assert await gateway.next_due() == T0

        seen = await gateway.version()
        await cli.set_enabled(job.id, False)
        assert await gateway.version() > seen
        assert await gateway.due(T0) == []

        # And the other way: what the gateway records, the CLI shows.
        await cli.set_enabled(job.id, True, next_run=T0)
        run = await gateway.start_run(job.id, due_at=T0, next_run=T0 + HOUR)
        assert run is not None
        await gateway.finish_run(run, "ok")
        shown = await cli.get(job.id)
        assert shown is not None and shown.last_status == "ok" and shown.next_run == T0 + HOUR


# --- runs ----------------------------------------------------------------------------------


async def test_a_run_moves_the_job_on_and_is_recorded(store: CronStore, clock: Clock) -> None:
    job = await add(store, next_run=T0)
    clock.time = T0 + timedelta(seconds=1)
    run_id = await store.start_run(job.id, due_at=T0, next_run=T0 + timedelta(days=1))
    assert run_id is not None

    running = await store.get(job.id)
    assert running is not None
    assert running.next_run == T0 + timedelta(days=1)
    assert running.last_status == "running"
    assert running.last_run == T0 + timedelta(seconds=1)
    (run,) = await store.runs(job.id)
    assert (run.id, run.job_id, run.due_at, run.status) == (run_id, job.id, T0, "running")
    assert run.started_at == running.last_run
    assert (run.ended_at, run.error, run.delivery) == (None, None, None)

    clock.time = T0 + timedelta(minutes=2)
    assert await store.finish_run(run_id, "error", "the model is down")
    (run,) = await store.runs(job.id)
    assert (run.status, run.error, run.delivery) == ("error", "the model is down", None)
    assert run.ended_at == T0 + timedelta(minutes=2)
    finished = await store.get(job.id)
    assert finished is not None and finished.last_status == "error"

    assert not await store.finish_run(run_id, "ok")  # already finished
    with pytest.raises(ValueError, match="cannot finish as 'running'"):
        await store.finish_run(run_id, "running")


async def test_a_one_shot_is_disabled_when_it_runs(store: CronStore) -> None:
    job = await add(store, schedule=At(T0), next_run=T0)
    run_id = await store.start_run(job.id, due_at=T0, next_run=None)
    assert run_id is not None
    done = await store.get(job.id)
    assert done is not None and (done.enabled, done.next_run) == (False, None)
    assert await store.due(T0 + HOUR) == []
    assert await store.finish_run(run_id, "ok")
    (run,) = await store.runs(job.id)
    assert (run.status, run.delivery) == ("ok", None)


async def test_an_occurrence_is_claimed_once(store: CronStore) -> None:
    job = await add(store, next_run=T0)
    assert await store.start_run(job.id, due_at=T0, next_run=T0 + HOUR) is not None
    # The same occurrence again (a second tick, another process): refused, nothing written.
    assert await store.start_run(job.id, due_at=T0, next_run=T0 + HOUR) is None
    assert await store.record_missed(job.id, T0, next_run=T0 + HOUR) is None
    assert len(await store.runs(job.id)) == 1


async def test_a_claim_fails_when_the_job_changed_meanwhile(store: CronStore) -> None:
    moved = await add(store, "moved", next_run=T0)
    disabled = await add(store, "disabled", next_run=T0)
    removed = await add(store, "removed", next_run=T0)
    await store.update_next_run(moved.id, T0 + HOUR)
    await store.set_enabled(disabled.id, False)
    await store.remove(removed.id)
    for job in (moved, disabled, removed):
        assert await store.start_run(job.id, due_at=T0, next_run=T0 + HOUR) is None
        assert await store.runs(job.id) == []
    stayed = await store.get(disabled.id)
    assert stayed is not None and not stayed.enabled


async def test_a_run_by_hand_claims_nothing(store: CronStore) -> None:
    job = await add(store, next_run=T0)
    await store.set_enabled(job.id, False)
    run_id = await store.start_run(job.id, due_at=None, next_run=None)
    assert run_id is not None
    (run,) = await store.runs(job.id)
    assert run.due_at is None
    assert await store.start_run("deadbeef", due_at=None, next_run=None) is None


async def test_two_processes_claim_one_occurrence_once(store_target: Path | str) -> None:
    path = store_target
    async with await Database.open(path) as first_db, await Database.open(path) as second_db:
        first, second = CronStore(first_db), CronStore(second_db)
        job = await add(first, next_run=T0)
        results = await asyncio.gather(
            first.start_run(job.id, due_at=T0, next_run=T0 + HOUR),
            second.start_run(job.id, due_at=T0, next_run=T0 + HOUR),
        )
        assert sorted(result is None for result in results) == [False, True]
        assert len(await first.runs(job.id)) == 1


async def test_record_missed(store: CronStore, clock: Clock) -> None:
    job = await add(store, next_run=T0)
    clock.time = T0 + 2 * HOUR
    run_id = await store.record_missed(job.id, T0, next_run=T0 + timedelta(days=1))
    assert run_id is not None
    (run,) = await store.runs(job.id)
    assert (run.id, run.status, run.due_at) == (run_id, "missed", T0)
    assert run.started_at == run.ended_at == T0 + 2 * HOUR
    missed = await store.get(job.id)
    assert missed is not None
    assert (missed.last_status, missed.last_run) == ("missed", run.started_at)
    assert missed.next_run == T0 + timedelta(days=1)

    one_shot = await add(store, schedule=At(T0), next_run=T0)
    assert await store.record_missed(one_shot.id, T0, next_run=None) is not None
    gone = await store.get(one_shot.id)
    assert gone is not None and not gone.enabled


async def test_history_is_bounded_per_job(store: CronStore) -> None:
    busy = await add(store, "busy")
    quiet = await add(store, "quiet")
    quiet_run = await store.start_run(quiet.id, due_at=None, next_run=T0)
    ids = []
    for _ in range(HISTORY_LIMIT + 10):
        run_id = await store.start_run(busy.id, due_at=None, next_run=T0)
        assert run_id is not None
        await store.finish_run(run_id, "ok")
        ids.append(run_id)
    kept = await store.runs(busy.id, limit=1000)
    assert [run.id for run in kept] == ids[::-1][:HISTORY_LIMIT]
    assert [run.id for run in await store.runs(busy.id, limit=3)] == ids[::-1][:3]
    assert [run.id for run in await store.runs(quiet.id)] == [quiet_run]


async def test_interrupted_runs_are_marked_at_start_up(store_target: Path | str) -> None:
    path = store_target
    async with await Database.open(path) as db:
        store = CronStore(db)
        crashed = await add(store, "crashed")
        finished = await add(store, "finished")
        left = await store.start_run(crashed.id, due_at=T0, next_run=T0 + HOUR)
        done = await store.start_run(finished.id, due_at=T0, next_run=T0 + HOUR)
        assert left is not None and done is not None
        await store.finish_run(done, "ok")
    # The process died mid-run; the next one starts.
    async with await Database.open(path) as db:
        store = CronStore(db)
        assert await store.mark_interrupted_runs() == 1
        assert await store.mark_interrupted_runs() == 0
        (run,) = await store.runs(crashed.id)
        assert (run.id, run.status, run.error) == (left, "interrupted", INTERRUPTED_ERROR)
        assert run.ended_at is not None
        job = await store.get(crashed.id)
        assert job is not None
        assert job.last_status == "interrupted"
        assert job.next_run == T0 + HOUR  # moved on before the run: not run again
        other = await store.get(finished.id)
        assert other is not None and other.last_status == "ok"
        # Its turn was journaled and resumes: how it ends replaces the mark, once.
        assert await store.finish_run(left, "ok")
        assert not await store.finish_run(left, "error", "again")
        (run,) = await store.runs(crashed.id)
        assert (run.status, run.error) == ("ok", None)


async def test_an_older_run_finishing_keeps_the_newer_status(
    store: CronStore, clock: Clock
) -> None:
    job = await add(store)
    older = await store.start_run(job.id, due_at=None, next_run=T0)
    clock.time += timedelta(seconds=1)
    newer = await store.start_run(job.id, due_at=None, next_run=T0)
    assert older is not None and newer is not None
    await store.finish_run(older, "error", "slow")
    current = await store.get(job.id)
    assert current is not None and current.last_status == "running"
    await store.finish_run(newer, "ok")
    current = await store.get(job.id)
    assert current is not None and current.last_status == "ok"


async def test_long_errors_are_truncated(store: CronStore) -> None:
    job = await add(store)
    run_id = await store.start_run(job.id, due_at=None, next_run=T0)
    assert run_id is not None
    await store.finish_run(run_id, "error", "x" * 10_000)
    (run,) = await store.runs(job.id)
    assert run.error is not None and len(run.error) == 2000


# --- delivery of a run's answer ------------------------------------------------------------


async def started(store: CronStore) -> tuple[Job, int]:
    job = await add(store)
    run_id = await store.start_run(job.id, due_at=None, next_run=T0)
    assert run_id is not None
    return job, run_id


async def queue_answer(journal: Journal, run_id: int | None, text: str = "done") -> int:
    """The dispatcher's step: the run's event answered, its reply queued, atomically."""
    outbox_id = await journal.complete([], ("telegram", {"text": text}), cron_run=run_id)
    assert outbox_id is not None
    return outbox_id


async def delivery(store: CronStore, job: Job) -> tuple[str, str | None, str | None]:
    (run, *_) = await store.runs(job.id)
    return run.status, run.delivery, run.delivery_error


@pytest.mark.parametrize("finished_first", [True, False])
async def test_a_run_is_delivered_only_once_the_outbox_confirms_its_answer(
    store: CronStore, db: Database, finished_first: bool
) -> None:
    journal = Journal(db)
    job, run_id = await started(store)
    outbox_id = await queue_answer(journal, run_id)
    assert await delivery(store, job) == ("running", "pending", None)
    # The channel may confirm before the dispatcher reports the turn's end, or after.
    if finished_first:
        await store.finish_run(run_id, "ok")
        assert await delivery(store, job) == ("ok", "pending", None)
    await journal.progress(outbox_id, 1)  # one part of two is out: still pending
    assert (await delivery(store, job))[1] == "pending"
    await journal.confirm(outbox_id, "77")
    if not finished_first:
        assert await delivery(store, job) == ("running", "delivered", None)
        await store.finish_run(run_id, "ok")
    assert await delivery(store, job) == ("ok", "delivered", None)
    (run,) = await store.runs(job.id)
    assert run.summary == "ok, delivered"


async def test_a_refused_answer_makes_the_run_not_delivered_with_the_reason(
    store: CronStore, db: Database
) -> None:
    journal = Journal(db)
    job, run_id = await started(store)
    outbox_id = await queue_answer(journal, run_id)
    await store.finish_run(run_id, "ok")
    await journal.fail(outbox_id, "502 Bad Gateway")  # a passing failure: tried again later
    assert await delivery(store, job) == ("ok", "pending", None)
    reason = "sendMessage: Bad Request: chat not found"
    await journal.give_up(outbox_id, reason)
    assert await delivery(store, job) == ("ok", "failed", reason)
    (run,) = await store.runs(job.id)
    assert run.summary == "ok, not delivered"
    await journal.give_up(outbox_id, "again")  # already failed: the first reason stays
    assert await delivery(store, job) == ("ok", "failed", reason)


async def test_a_give_up_after_delivery_changes_nothing(store: CronStore, db: Database) -> None:
    journal = Journal(db)
    job, run_id = await started(store)
    outbox_id = await queue_answer(journal, run_id)
    await journal.confirm(outbox_id)
    await journal.give_up(outbox_id, "too late")
    assert (await delivery(store, job))[1:] == ("delivered", None)


async def test_a_run_with_two_answers_is_delivered_when_both_are(
    store: CronStore, db: Database
) -> None:
    journal = Journal(db)
    job, run_id = await started(store)
    first = await queue_answer(journal, run_id, "one")
    await journal.confirm(first)
    assert (await delivery(store, job))[1] == "delivered"
    second = await queue_answer(journal, run_id, "two")  # queued later: pending again
    assert (await delivery(store, job))[1] == "pending"
    await journal.confirm(second)
    assert (await delivery(store, job))[1] == "delivered"

    job, run_id = await started(store)
    first, second = await queue_answer(journal, run_id), await queue_answer(journal, run_id)
    await journal.give_up(first, "refused")
    await journal.confirm(second)  # one part failed: the run's answer did not all arrive
    assert (await delivery(store, job))[1:] == ("failed", "refused")


async def test_a_run_without_an_answer_for_a_chat_has_no_delivery(
    store: CronStore, db: Database
) -> None:
    journal = Journal(db)
    job, run_id = await started(store)
    await journal.complete([], None, cron_run=run_id)  # answered, nothing to deliver
    await store.finish_run(run_id, "ok")
    assert await delivery(store, job) == ("ok", None, None)
    (run,) = await store.runs(job.id)
    assert run.summary == "ok"
    # A reply that answers no run, or a run since dropped, touches no run.
    await journal.confirm(await queue_answer(journal, None))
    await journal.confirm(await queue_answer(journal, 9999))
    assert await delivery(store, job) == ("ok", None, None)


async def test_a_pending_answer_survives_a_restart_and_settles_the_run_after_it(
    store_target: Path | str,
) -> None:
    path = store_target
    async with await Database.open(path) as db:
        store = CronStore(db)
        job, run_id = await started(store)
        await queue_answer(Journal(db), run_id)
        await store.finish_run(run_id, "ok")
    async with await Database.open(path) as db:  # the gateway restarted; the CLI looks
        store, journal = CronStore(db), Journal(db)
        assert await store.mark_interrupted_runs() == 0
        assert await delivery(store, job) == ("ok", "pending", None)
        (owed,) = await journal.pending_outbox()  # re-published by the dispatcher's recover
        await journal.confirm(owed.id)
        assert await delivery(store, job) == ("ok", "delivered", None)


async def test_runs_recorded_as_delivered_before_delivery_was_tracked_stay_delivered(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    tracked = next(i for i, m in enumerate(migrations.MIGRATIONS) if "cron_run INTEGER" in m)
    with closing(sqlite3.connect(path)) as conn:
        for version, script in enumerate(migrations.MIGRATIONS[:tracked], start=1):
            conn.executescript(script)
            conn.execute(f"PRAGMA user_version = {version}")
        conn.execute(
            "INSERT INTO cron_jobs (id, name, message, schedule, enabled, created_at)"
            " VALUES ('j1', 'n', 'm', '{\"kind\":\"every\",\"seconds\":60}', 0, '2026')"
        )
        for delivered in (1, 0):
            conn.execute(
                "INSERT INTO cron_runs (job_id, started_at, ended_at, status, delivered)"
                " VALUES ('j1', '2026-01-01T00:00:00+00:00', '2026-01-01T00:00:01+00:00',"
                " 'ok', ?)",
                (delivered,),
            )
        conn.commit()
    async with await Database.open(path) as db:
        runs = await CronStore(db).runs("j1")
    assert [(run.delivery, run.delivery_error) for run in runs] == [
        (None, None),
        ("delivered", None),
    ]


# --- schema --------------------------------------------------------------------------------


async def test_an_unreadable_schedule_is_a_store_error(store: CronStore, db: Database) -> None:
    job = await add(store)
    await db.execute("UPDATE cron_jobs SET schedule = ? WHERE id = ?", ('{"kind":"x"}', job.id))
    with pytest.raises(StoreError, match="unreadable cron schedule"):
        await store.get(job.id)
    await db.execute("UPDATE cron_jobs SET schedule = ? WHERE id = ?", ("{", job.id))
    with pytest.raises(StoreError, match="unreadable cron schedule"):
        await store.list()


async def test_the_schema_keeps_enabled_jobs_scheduled(db: Database) -> None:
    with pytest.raises(StoreError, match=r"(?i)check constraint"):
        await db.execute(
            "INSERT INTO cron_jobs (id, name, message, schedule, enabled, created_at)"
            " VALUES ('x', 'x', 'x', '{}', 1, '2026-01-01')"
        )


async def test_due_jobs_are_found_through_the_index(tmp_path: Path) -> None:
    async with await Database.open(tmp_path / "state.db") as db:  # SQLite's query plan
        plan = await db.fetchall(
            "EXPLAIN QUERY PLAN SELECT * FROM cron_jobs WHERE enabled = 1 AND next_run <= ?"
            " ORDER BY next_run, id",
            ("2026",),
        )
    assert any("cron_jobs_next_run" in str(row["detail"]) for row in plan)


async def test_on_postgresql_a_job_changed_wakes_every_member(postgres_url: str) -> None:
    """A cluster's members hear of a changed job at once (LISTEN/NOTIFY), not at their next
    look at the version: said on commit, whichever process changed it."""
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(postgres_url)
    try:
        async with await Database.open(postgres_url) as db:
            await listener.add_listener(CRON_CHANGED, lambda *args: heard.put_nowait(args[2]))
            store = CronStore(db)
            job = await store.add(name="n", message="m", schedule=DAILY, next_run=T0)
            assert await asyncio.wait_for(heard.get(), 10) == CRON_CHANGED
            await store.remove(job.id)
            assert await asyncio.wait_for(heard.get(), 10) == CRON_CHANGED
    finally:
        await listener.close()
