"""Telegram's intake lanes: in order per chat, concurrently across chats, owned tasks."""

from __future__ import annotations

import asyncio

from nanobot.channels._telegram_lanes import Lanes


class Work:
    """Records starts and ends; waits for `release[item]` if set; raises for `broken`."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.ended: list[int] = []
        self.release: dict[int, asyncio.Event] = {}
        self.broken: set[int] = set()

    async def __call__(self, item: int) -> None:
        self.started.append(item)
        if item in self.release:
            await self.release[item].wait()
        if item in self.broken:
            raise RuntimeError(f"item {item}")
        self.ended.append(item)


def add(lanes: Lanes[int], *items: tuple[int, int | None]) -> None:
    for item, key in items:
        lanes.add(key, item, name=f"item-{item}")


async def test_keys_run_concurrently_and_each_in_order() -> None:
    work = Work()
    work.release = {1: asyncio.Event()}
    lanes = Lanes(work)
    add(lanes, (1, 10), (2, 10), (3, 20), (4, None))
    await lanes.wait(0.05)
    assert work.started == [1, 3, 4]  # 2 waits for 1, its key's earlier item
    assert lanes.busy
    work.release[1].set()
    await lanes.wait(5)
    assert work.ended[-2:] == [1, 2] and not lanes.busy


async def test_wait_returns_when_all_are_done_or_after_its_seconds() -> None:
    work = Work()
    work.release = {1: asyncio.Event()}
    lanes = Lanes(work)
    add(lanes, (1, 10), (2, 20))
    async with asyncio.timeout(1):
        await lanes.wait(0.05)  # 1 is still running: it is not waited for longer
    assert work.ended == [2]
    work.release[1].set()
    async with asyncio.timeout(1):
        await lanes.wait(60)  # ends with the last item, not after a minute
    assert work.ended == [2, 1]


async def test_an_item_that_raises_does_not_stop_its_lane() -> None:
    work = Work()
    work.broken = {1}
    lanes = Lanes(work)
    add(lanes, (1, 10), (2, 10))
    await lanes.wait(5)
    assert (work.started, work.ended) == ([1, 2], [2])


async def test_close_cancels_what_is_running_or_waiting() -> None:
    work = Work()
    work.release = {1: asyncio.Event()}
    lanes = Lanes(work)
    add(lanes, (1, 10), (2, 10))
    await asyncio.sleep(0)
    await lanes.close()
    assert (work.started, work.ended, lanes.busy) == ([1], [], False)
    add(lanes, (3, 10))  # still usable
    await lanes.wait(5)
    assert work.ended == [3]
