"""The ChannelManager with scripted channels: restarts, per-channel delivery, confirmation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from nanobot.bus.events import ChatRef, InboundMessage, Outbound, OutboundMessage, Typing
from nanobot.bus.queue import MessageBus
from nanobot.channels import manager as manager_module
from nanobot.channels.base import Channel, DeliveryError, Intake
from nanobot.channels.manager import ChannelManager
from tests.fakes.outbox import MemoryOutbox


class Nobody:
    """An intake that takes nothing."""

    async def admits(self, channel: str, sender_id: str, *, private: bool, addressed: bool) -> bool:
        return False

    async def __call__(self, message: InboundMessage) -> Intake:
        return Intake.REFUSED


class ScriptedChannel(Channel):
    def __init__(
        self, name: str, *, crashes: int = 0, slow: float = 0.0, failures: int = 0
    ) -> None:
        super().__init__(Nobody())
        self.name = name
        self.crashes = crashes
        self.runs = 0
        self.slow = slow
        self.failures = failures
        self.delivered: list[Outbound] = []
        self.active = 0
        self.peak = 0
        self.connected = asyncio.Event()

    async def run(self, ready: Callable[[], None]) -> None:
        self.runs += 1
        if self.crashes:
            self.crashes -= 1
            raise ConnectionError("platform went away")
        ready()
        self.connected.set()
        await asyncio.Event().wait()

    async def deliver(self, item: Outbound) -> None:
        if self.failures and isinstance(item, OutboundMessage):
            self.failures -= 1
            raise DeliveryError("500 from the platform")
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.slow)
        finally:
            self.active -= 1
        self.delivered.append(item)


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager_module, "RESTART_DELAYS", (0.01,))
    monkeypatch.setattr(manager_module, "DELIVERY_RETRIES", (0.01, 0.01))


def reply(channel: str, outbox_id: int, text: str = "hi") -> OutboundMessage:
    return OutboundMessage(ChatRef(channel, "1"), text, outbox_id=outbox_id)


async def run_manager(manager: ChannelManager, *channels: ScriptedChannel) -> asyncio.Task[None]:
    task = asyncio.create_task(manager.run())
    for channel in channels:
        await asyncio.wait_for(channel.connected.wait(), 5)
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_crashed_channel_is_restarted() -> None:
    bus, ledger = MessageBus(), MemoryOutbox()
    channel = ScriptedChannel("flaky", crashes=2)
    manager = ChannelManager([channel], bus, ledger)
    task = await run_manager(manager, channel)
    assert channel.runs == 3
    await bus.publish(reply("flaky", 1))
    await asyncio.wait_for(manager.drain(), 5)
    assert ledger.confirmed == [1]
    await stop(task)


async def test_a_slow_platform_does_not_delay_another() -> None:
    bus, ledger = MessageBus(), MemoryOutbox()
    slow = ScriptedChannel("slow", slow=0.5)
    fast = ScriptedChannel("fast")
    manager = ChannelManager([slow, fast], bus, ledger)
    task = await run_manager(manager, slow, fast)
    await bus.publish(reply("slow", 1))
    await bus.publish(reply("fast", 2))
    await asyncio.sleep(0.1)
    assert ledger.confirmed == [2]
    await asyncio.wait_for(manager.drain(), 5)
    assert ledger.confirmed == [2, 1]
    await stop(task)


async def test_delivery_is_retried_and_confirmed_once() -> None:
    bus, ledger = MessageBus(), MemoryOutbox()
    channel = ScriptedChannel("tg", failures=2)
    manager = ChannelManager([channel], bus, ledger)
    task = await run_manager(manager, channel)
    await bus.publish(reply("tg", 7))
    await asyncio.wait_for(manager.drain(), 5)
    assert ledger.confirmed == [7]
    assert [f[0] for f in ledger.failed] == [7, 7]
    assert len(channel.delivered) == 1
    await stop(task)


async def test_undeliverable_messages_stay_unconfirmed() -> None:
    bus, ledger = MessageBus(), MemoryOutbox()
    channel = ScriptedChannel("tg", failures=10)
    manager = ChannelManager([channel], bus, ledger)
    task = await run_manager(manager, channel)
    await bus.publish(reply("tg", 9))
    await bus.publish(Typing(ChatRef("tg", "1"), active=True))
    await asyncio.wait_for(manager.drain(), 5)
    assert ledger.confirmed == []
    assert len(ledger.failed) == 3  # every attempt recorded; the row stays pending
    assert channel.delivered == [Typing(ChatRef("tg", "1"), active=True)]
    await stop(task)


async def test_chats_are_delivered_in_parallel_each_in_order() -> None:
    bus, ledger = MessageBus(), MemoryOutbox()
    channel = ScriptedChannel("tg", slow=0.3)
    manager = ChannelManager([channel], bus, ledger)
    task = await run_manager(manager, channel)
    for outbox_id in range(1, 11):
        chat = ChatRef("tg", str(outbox_id % 5))
        await bus.publish(OutboundMessage(chat, f"m{outbox_id}", outbox_id=outbox_id))
    await asyncio.wait_for(manager.drain(), 5)
    assert sorted(ledger.confirmed) == list(range(1, 11))
    assert channel.peak == 5  # five chats at once, never two items of one chat
    for chat_id in map(str, range(5)):
        texts = [
            i.text
            for i in channel.delivered
            if isinstance(i, OutboundMessage) and i.chat.chat_id == chat_id
        ]
        assert texts == sorted(texts, key=lambda t: int(t[1:]))
    await stop(task)
