"""The typing indicator: per-chat tasks counted by turns, and the channel-wide signal rate."""

from __future__ import annotations

import asyncio

from nanobot.bus.events import ChatRef, Typing
from nanobot.channels._typing import TypingIndicator


def chat(number: int) -> ChatRef:
    return ChatRef("telegram", str(number))


async def test_signals_repeat_while_turns_run_and_stop_with_the_last() -> None:
    sent: list[ChatRef] = []

    async def send(target: ChatRef) -> None:
        sent.append(target)

    typing = TypingIndicator(send, 0.02, delay=0.0, rate=1000, name="test")
    typing.start()
    await typing.update(Typing(chat(1), active=True))
    await typing.update(Typing(chat(1), active=True))  # a second turn in the same chat
    await asyncio.sleep(0.1)
    await typing.update(Typing(chat(1), active=False))
    count = len(sent)
    assert count >= 3
    await asyncio.sleep(0.05)
    assert len(sent) > count  # one turn still runs
    await typing.update(Typing(chat(1), active=False))
    count = len(sent)
    await asyncio.sleep(0.05)
    assert len(sent) == count
    await typing.stop()


async def test_many_chats_share_the_rate_and_excess_signals_are_skipped() -> None:
    sent: list[float] = []
    loop = asyncio.get_running_loop()

    async def send(target: ChatRef) -> None:
        sent.append(loop.time())

    rate, seconds = 20.0, 0.5
    typing = TypingIndicator(send, 0.01, delay=0.0, rate=rate, name="test")
    typing.start()
    began = loop.time()
    for number in range(200):
        await typing.update(Typing(chat(number), active=True))
    await asyncio.sleep(seconds)
    await typing.stop()
    elapsed = loop.time() - began
    # A full bucket at first, then the rate: never the 200 chats × 50 ticks asked for.
    assert rate <= len(sent) <= rate + rate * elapsed + 1
    assert all(time - began <= elapsed for time in sent)
