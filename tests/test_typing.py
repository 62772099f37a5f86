"""The typing indicator: per-chat tasks counted by turns, and the channel-wide signal rate."""

from __future__ import annotations

import asyncio

from nanobot.bus.events import ChatRef, Typing
from nanobot.channels._typing import TypingIndicator


def chat(number: int) -> ChatRef:
    return ChatRef("telegram", str(number))


class Sent:
    """A `send` that records the chats signalled and lets a test wait for a count."""

    def __init__(self) -> None:
        self.chats: list[ChatRef] = []
        self._changed = asyncio.Condition()

    async def send(self, target: ChatRef) -> None:
        async with self._changed:
            self.chats.append(target)
            self._changed.notify_all()

    async def reach(self, count: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.chats) >= count)


async def test_signals_repeat_while_turns_run_and_stop_with_the_last() -> None:
    sent = Sent()
    interval = 0.02
    typing = TypingIndicator(sent.send, interval, delay=0.0, rate=1000, name="test")
    typing.start()
    await typing.update(Typing(chat(1), active=True))
    await typing.update(Typing(chat(1), active=True))  # a second turn in the same chat
    await sent.reach(3)
    await typing.update(Typing(chat(1), active=False))
    await sent.reach(len(sent.chats) + 1)  # one turn still runs
    await typing.update(Typing(chat(1), active=False))
    count = len(sent.chats)
    # Nothing more may come: wait a few intervals (the task is already cancelled and
    # awaited when `update` returns, so this can only catch a signal that should not exist).
    await asyncio.sleep(3 * interval)
    assert len(sent.chats) == count
    assert set(sent.chats) == {chat(1)}
    await typing.stop()


async def test_many_chats_share_the_rate_and_excess_signals_are_skipped() -> None:
    sent: list[float] = []
    loop = asyncio.get_running_loop()

    async def send(target: ChatRef) -> None:
        sent.append(loop.time())

    # Real time: the rate over a window is the behaviour under test (the bucket reads the
    # loop's clock). A quarter second already tells 25 signals from 200 × 25 asked for.
    rate, seconds = 20.0, 0.25
    typing = TypingIndicator(send, 0.01, delay=0.0, rate=rate, name="test")
    typing.start()
    began = loop.time()
    for number in range(200):
        await typing.update(Typing(chat(number), active=True))
    await asyncio.sleep(seconds)
    await typing.stop()
    elapsed = loop.time() - began
    # A full bucket at first, then the rate: never the 200 chats × 25 ticks asked for.
    assert rate <= len(sent) <= rate + rate * elapsed + 1
    assert all(time - began <= elapsed for time in sent)
