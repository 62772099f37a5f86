"""TaskSet: spawn, forget on end, log a failure once, close with a grace period."""

from __future__ import annotations

import asyncio

import pytest

from nanobot.tasks import TaskSet


async def test_spawned_tasks_are_named_counted_and_forgotten_when_they_end() -> None:
    tasks = TaskSet()
    release = asyncio.Event()
    task = tasks.spawn(release.wait(), name="waiter")
    assert task.get_name() == "waiter"
    assert len(tasks) == 1
    assert list(tasks) == [task]
    release.set()
    assert await task is True
    assert len(tasks) == 0


async def test_a_failure_is_logged_once_with_its_traceback(errors: list[str]) -> None:
    tasks = TaskSet("owner")

    async def broken() -> None:
        raise ValueError("boom")

    task = tasks.spawn(broken(), name="broken-1")
    await asyncio.wait([task])
    await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    assert len(errors) == 1
    assert "owner: task broken-1 failed" in errors[0]
    assert "ValueError: boom" in errors[0]
    assert len(tasks) == 0
    await tasks.close()


async def test_cancellation_is_not_logged(errors: list[str]) -> None:
    tasks = TaskSet()
    tasks.spawn(asyncio.Event().wait(), name="forever")
    await tasks.close()
    assert errors == []
    assert len(tasks) == 0


async def test_close_cancels_what_runs_and_awaits_it() -> None:
    tasks = TaskSet()
    started, cleaned = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup that awaits still runs to its end
            cleaned.set()

    task = tasks.spawn(work(), name="work")
    await started.wait()
    await tasks.close()
    assert task.cancelled()
    assert cleaned.is_set()


async def test_close_with_grace_lets_quick_tasks_finish_and_cancels_slow_ones() -> None:
    tasks = TaskSet()
    release = asyncio.Event()
    quick = tasks.spawn(release.wait(), name="quick")
    slow = tasks.spawn(asyncio.Event().wait(), name="slow")
    asyncio.get_running_loop().call_soon(release.set)
    await tasks.close(grace=0.05)
    assert quick.result() is True
    assert slow.cancelled()


async def test_close_without_limit_waits_for_tasks_and_those_they_start() -> None:
    tasks = TaskSet()
    steps: list[str] = []

    async def second() -> None:
        await asyncio.sleep(0)
        steps.append("second")

    async def first() -> None:
        await asyncio.sleep(0)
        tasks.spawn(second(), name="second")
        steps.append("first")

    tasks.spawn(first(), name="first")
    await tasks.close(grace=None)
    assert steps == ["first", "second"]
    assert len(tasks) == 0


async def test_close_cancelled_while_waiting_still_cancels_the_tasks() -> None:
    tasks = TaskSet()
    task = tasks.spawn(asyncio.Event().wait(), name="forever")
    closing = asyncio.create_task(tasks.close(grace=None))
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert task.cancelled()
    assert len(tasks) == 0


async def test_the_set_takes_work_again_after_close() -> None:
    tasks = TaskSet()
    await tasks.close()
    assert await tasks.spawn(asyncio.sleep(0, "again"), name="again") == "again"
