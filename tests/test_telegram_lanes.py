"""Telegram intake lanes: in order per chat, concurrently across chats, and the polls."""

from __future__ import annotations

import asyncio
import datetime as dtm

import pytest
from telegram import Chat, Message, Update

from nanobot.channels._telegram_lanes import IntakeLanes, Unconfirmed


def update(update_id: int, chat_id: int | None) -> Update:
    if chat_id is None:
        return Update(update_id)
    chat = Chat(chat_id, Chat.PRIVATE)
    return Update(update_id, message=Message(update_id, dtm.datetime.now(dtm.UTC), chat))


class Takes:
    """A take that records starts and ends and waits for `release[update_id]` if set."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.ended: list[int] = []
        self.release: dict[int, asyncio.Event] = {}
        self.answer: dict[int, bool] = {}

    async def __call__(self, item: Update) -> bool:
        self.started.append(item.update_id)
        if item.update_id in self.release:
            await self.release[item.update_id].wait()
        self.ended.append(item.update_id)
        return self.answer.get(item.update_id, True)


async def test_chats_run_concurrently_and_each_in_order() -> None:
    takes = Takes()
    takes.release = {1: asyncio.Event()}
    lanes = IntakeLanes(takes)
    for item in (update(1, 10), update(2, 10), update(3, 20), update(4, None)):
        lanes.add(item)
    await asyncio.sleep(0.05)
    assert takes.started == [1, 3, 4]  # 2 waits for 1, its chat's earlier update
    poll = asyncio.create_task(lanes.before_poll({"offset": "5"}))
    await asyncio.sleep(0.05)
    assert not poll.done()  # a poll waits a moment while an update is being taken
    takes.release[1].set()
    await poll
    assert takes.ended[-2:] == [1, 2]


async def test_a_take_that_fails_stops_the_rest_and_the_barrier() -> None:
    takes = Takes()
    takes.answer = {1: False}
    lanes = IntakeLanes(takes)
    lanes.add(update(1, 10))
    with pytest.raises(Unconfirmed):
        await lanes.before_poll({})
    lanes.add(update(2, 20))
    with pytest.raises(Unconfirmed):
        await lanes.before_poll({})
    assert takes.started == [1]  # left for the redelivery, with the one that failed


async def test_a_take_that_raises_counts_as_not_taken() -> None:
    async def broken(item: Update) -> bool:
        raise RuntimeError("bug")

    lanes = IntakeLanes(broken)
    lanes.add(update(1, 10))
    with pytest.raises(Unconfirmed):
        await lanes.before_poll({})


async def test_close_cancels_what_is_still_being_taken() -> None:
    takes = Takes()
    takes.release = {1: asyncio.Event()}
    lanes = IntakeLanes(takes)
    lanes.add(update(1, 10))
    lanes.add(update(2, 10))
    await asyncio.sleep(0.01)
    await lanes.close()
    assert takes.ended == []
    with pytest.raises(Unconfirmed):
        await lanes.before_poll({})


async def test_a_poll_waits_a_moment_then_asks_again_from_the_oldest_update_in_hand() -> None:
    takes = Takes()
    takes.release = {5: asyncio.Event()}
    lanes = IntakeLanes(takes, patience=0.05)
    lanes.add(update(5, 10))
    lanes.add(update(6, 20))
    fields = {"offset": "7", "timeout": "10"}
    await lanes.before_poll(fields)
    assert fields == {"offset": "5", "timeout": "10"}  # confirms nothing not yet taken
    assert takes.ended == [6]
    for again in (update(5, 10), update(6, 20)):  # the answer repeats what is in hand
        lanes.add(again)
    lanes.add(update(7, 20))
    await asyncio.sleep(0.01)
    assert takes.started == [5, 6, 7]  # each once
    takes.release[5].set()
    fields = {"offset": "8"}
    await lanes.before_poll(fields)
    assert fields == {"offset": "8"}
    assert takes.ended == [6, 7, 5]


async def test_a_poll_with_nothing_in_hand_keeps_its_offset() -> None:
    lanes = IntakeLanes(Takes(), patience=0.05)
    first: dict[str, str] = {}
    await lanes.before_poll(first)
    assert first == {}
    lanes.add(update(3, 10))
    later = {"offset": "4"}
    await lanes.before_poll(later)
    assert later == {"offset": "4"}


async def test_a_poll_after_a_failed_take_is_not_made() -> None:
    takes = Takes()
    takes.answer = {1: False}
    lanes = IntakeLanes(takes, patience=0.05)
    lanes.add(update(1, 10))
    with pytest.raises(Unconfirmed):
        await lanes.before_poll({"offset": "2"})
