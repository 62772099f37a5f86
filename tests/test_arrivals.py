"""The order a session's messages are handed to the loop in (nanobot/agent/_arrivals.py)."""

from __future__ import annotations

import asyncio

from nanobot.agent._arrivals import Arrivals


async def waiting(wait: asyncio.Task[None]) -> bool:
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return not wait.done()


async def test_each_waits_for_those_before_it_and_keys_are_apart() -> None:
    arrivals = Arrivals()
    first, second, other = arrivals.ticket("a"), arrivals.ticket("a"), arrivals.ticket("b")
    await first.wait()
    await other.wait()  # another session's: nothing before it
    second_waits = asyncio.create_task(second.wait())
    assert await waiting(second_waits)
    first.handed()
    await second_waits


async def test_one_handed_early_still_waits_for_those_before_it() -> None:
    # The second failed while the first was still being read: the third goes after the first.
    arrivals = Arrivals()
    first, second, third = (arrivals.ticket("a") for _ in range(3))
    second.handed()
    third_waits = asyncio.create_task(third.wait())
    assert await waiting(third_waits)
    first.handed()
    first.handed()  # idempotent
    await third_waits
    third.handed()
    fresh = arrivals.ticket("a")  # all handed: a new message waits for nothing
    await asyncio.wait_for(fresh.wait(), 1)


async def test_a_cancelled_wait_leaves_the_order_as_it_was() -> None:
    arrivals = Arrivals()
    first, second, third = (arrivals.ticket("a") for _ in range(3))
    second_waits = asyncio.create_task(second.wait())
    assert await waiting(second_waits)
    second_waits.cancel()
    second.handed()  # as the dispatcher's `finally` does
    third_waits = asyncio.create_task(third.wait())
    assert await waiting(third_waits)
    first.handed()
    await third_waits
