"""Lanes: in order per key, concurrent across keys, bounded, one way to close."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from nanobot.lanes import Closed, Lanes


class Log:
    """Records what items did; items wait on gates the test opens."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.started: dict[str, asyncio.Event] = {}

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    def began(self, name: str) -> asyncio.Event:
        return self.started.setdefault(name, asyncio.Event())

    async def item(self, name: str, *, wait: bool = False) -> str:
        self.steps.append(f"start {name}")
        self.began(name).set()
        if wait:
            await self.gate(name).wait()
        self.steps.append(f"end {name}")
        return name


async def test_items_of_one_key_run_in_order_one_at_a_time() -> None:
    lanes: Lanes[str] = Lanes()
    log = Log()
    lanes.add("a", log.item("1", wait=True))
    lanes.add("a", log.item("2"))
    lanes.add("a", log.item("3"))
    await log.began("1").wait()
    assert log.steps == ["start 1"]
    assert lanes.waiting == 2
    log.gate("1").set()
    await lanes.close(grace=None)
    assert log.steps == ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"]


async def test_keys_run_concurrently() -> None:
    lanes: Lanes[str] = Lanes()
    log = Log()
    lanes.add("a", log.item("a", wait=True))
    lanes.add("b", log.item("b", wait=True))
    await log.began("a").wait()
    await log.began("b").wait()  # b started while a still waits: not behind it
    assert set(lanes) == {"a", "b"}
    log.gate("b").set()
    log.gate("a").set()
    assert await lanes.close(grace=None) == 0


async def test_the_limit_bounds_items_running_at_once_over_all_keys() -> None:
    lanes: Lanes[int] = Lanes(limit=2)
    log = Log()
    for key in range(4):
        lanes.add(key, log.item(str(key), wait=True))
    await log.began("0").wait()
    await log.began("1").wait()
    for _ in range(5):
        await asyncio.sleep(0)
    assert log.steps == ["start 0", "start 1"]  # 2 and 3 wait for a slot
    assert len(lanes) == 4  # but are busy: their next items queue behind them
    log.gate("0").set()
    await log.began("2").wait()  # first come, first served
    assert "start 3" not in log.steps
    log.gate("1").set()
    log.gate("2").set()
    log.gate("3").set()
    await lanes.close(grace=None)
    assert len(lanes) == 0


async def test_run_returns_the_result_in_the_callers_task_after_earlier_items() -> None:
    lanes: Lanes[str] = Lanes()
    log = Log()
    lanes.add("a", log.item("queued", wait=True))
    running = asyncio.create_task(lanes.run("a", log.item("inline")))
    await log.began("queued").wait()
    assert lanes.busy("a")
    log.gate("queued").set()
    assert await running == "inline"
    assert log.steps == ["start queued", "end queued", "start inline", "end inline"]
    assert not lanes.busy("a")


async def test_run_on_an_idle_key_starts_without_a_task_and_raises_what_the_item_raises() -> None:
    lanes: Lanes[str] = Lanes(limit=1)
    me = asyncio.current_task()

    async def item() -> None:
        assert asyncio.current_task() is me
        assert lanes.busy("a")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await lanes.run("a", item())
    assert not lanes.busy("a")  # and the slot is free again:
    assert await lanes.run("b", asyncio.sleep(0, "next")) == "next"


async def test_items_added_during_a_run_are_taken_after_it() -> None:
    lanes: Lanes[str] = Lanes()
    log = Log()
    running = asyncio.create_task(lanes.run("a", log.item("inline", wait=True)))
    await log.began("inline").wait()
    lanes.add("a", log.item("queued"))
    log.gate("inline").set()
    await running
    await lanes.close(grace=None)
    assert log.steps == ["start inline", "end inline", "start queued", "end queued"]


async def test_a_failing_item_is_logged_and_its_lane_goes_on(errors: list[str]) -> None:
    lanes: Lanes[str] = Lanes(name="test")
    log = Log()

    async def broken() -> None:
        raise ValueError("boom")

    lanes.add("a", broken())
    lanes.add("a", log.item("after"))
    await lanes.close(grace=None)
    assert log.steps == ["start after", "end after"]
    assert len(errors) == 1
    assert "test: an item of a failed" in errors[0]
    assert "ValueError: boom" in errors[0]


async def test_idle_keys_are_dropped() -> None:
    lanes: Lanes[int] = Lanes(limit=10)
    for key in range(1000):
        await lanes.run(key, asyncio.sleep(0))
        lanes.add(key, asyncio.sleep(0))
    await lanes.close(grace=None)
    assert len(lanes) == 0
    assert lanes._lanes == {}


async def test_close_lets_lanes_go_on_within_grace_then_cancels_and_drops() -> None:
    lanes: Lanes[str] = Lanes()
    log = Log()
    cancelled = asyncio.Event()

    async def stuck() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    lanes.add("a", log.item("a1", wait=True))
    lanes.add("a", log.item("a2"))  # starts within the grace
    lanes.add("b", stuck())
    lanes.add("b", log.item("b2"))  # never starts: dropped unrun
    asyncio.get_running_loop().call_soon(log.gate("a1").set)
    assert await lanes.close(grace=0.05) == 1
    assert cancelled.is_set()
    assert log.steps == ["start a1", "end a1", "start a2", "end a2"]
    assert len(lanes) == 0


async def test_close_cancels_at_once_without_grace() -> None:
    lanes: Lanes[str] = Lanes()
    log = Log()
    lanes.add("a", log.item("a1", wait=True))
    lanes.add("a", log.item("a2"))
    await log.began("a1").wait()
    assert await lanes.close() == 1
    assert log.steps == ["start a1"]


async def test_a_closed_lanes_takes_nothing() -> None:
    lanes: Lanes[str] = Lanes()
    await lanes.close()
    assert lanes.closed
    item = asyncio.sleep(0)
    with pytest.raises(Closed):
        lanes.add("a", item)
    assert inspect.getcoroutinestate(item) == "CORO_CLOSED"  # no "never awaited" warning
    with pytest.raises(Closed):
        await lanes.run("a", asyncio.sleep(0))


async def test_close_tells_waiting_run_callers_and_leaves_running_ones_to_their_task() -> None:
    lanes: Lanes[str] = Lanes()
    log = Log()
    first = asyncio.create_task(lanes.run("a", log.item("first", wait=True)))
    await log.began("first").wait()
    second = asyncio.create_task(lanes.run("a", log.item("second")))
    await asyncio.sleep(0)
    assert await lanes.close() == 1
    with pytest.raises(Closed):
        await second
    assert not first.done()  # its caller's, not ours to cancel
    log.gate("first").set()
    assert await first == "first"
    assert len(lanes) == 0


async def test_a_run_cancelled_while_waiting_is_skipped_and_the_lane_goes_on() -> None:
    lanes: Lanes[str] = Lanes()
    log = Log()
    lanes.add("a", log.item("first", wait=True))
    waiting = asyncio.create_task(lanes.run("a", log.item("cancelled")))
    lanes.add("a", log.item("last"))
    await log.began("first").wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    log.gate("first").set()
    await lanes.close(grace=None)
    assert log.steps == ["start first", "end first", "start last", "end last"]


async def test_a_run_cancelled_as_its_turn_came_hands_the_lane_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lanes: Lanes[str] = Lanes()
    log = Log()
    first = asyncio.create_task(lanes.run("a", log.item("first", wait=True)))
    await log.began("first").wait()
    second = asyncio.create_task(lanes.run("a", log.item("second")))
    await asyncio.sleep(0)
    hand_on = lanes._next

    def then_cancel(key: str, lane: Any) -> None:
        hand_on(key, lane)  # gives `second` its turn...
        second.cancel()  # ...which is cancelled before it resumes

    monkeypatch.setattr(lanes, "_next", then_cancel)
    log.gate("first").set()
    await first
    monkeypatch.undo()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert not lanes.busy("a")
    assert await lanes.run("a", log.item("third")) == "third"
    assert "start second" not in log.steps


async def test_a_run_cancelled_while_waiting_for_a_slot_frees_its_key() -> None:
    lanes: Lanes[str] = Lanes(limit=1)
    log = Log()
    holder = asyncio.create_task(lanes.run("a", log.item("holder", wait=True)))
    await log.began("holder").wait()
    waiting = asyncio.create_task(lanes.run("b", log.item("b")))
    await asyncio.sleep(0)
    assert lanes.busy("b")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not lanes.busy("b")
    log.gate("holder").set()
    await holder
    assert "start b" not in log.steps


async def test_slots_go_to_run_callers_first_come_first_served() -> None:
    # The agent loop's turns (`run`) wait for their slot in the order they asked: a burst of
    # chats is answered in the order it came, and a session's next turn (handed its lane
    # when the one before ends) queues behind the others that already wait, not before them.
    lanes: Lanes[str] = Lanes(limit=2)
    log = Log()
    holders = [asyncio.create_task(lanes.run(k, log.item(k, wait=True))) for k in ("h1", "h2")]
    await log.began("h2").wait()
    keys = [f"k{i}" for i in range(20)]
    waiting = [asyncio.create_task(lanes.run(k, log.item(k))) for k in keys]
    nxt = asyncio.create_task(lanes.run("h1", log.item("h1 next")))  # h1's next turn
    for _ in range(5):
        await asyncio.sleep(0)
    assert lanes.waiting == 1  # h1's next waits for its lane; the keys wait for a slot
    late = asyncio.create_task(lanes.run("late", log.item("late")))
    log.gate("h1").set()
    log.gate("h2").set()
    await asyncio.gather(*holders, *waiting, nxt, late)
    starts = [step.removeprefix("start ") for step in log.steps if step.startswith("start ")]
    assert starts == ["h1", "h2", *keys, "late", "h1 next"]
