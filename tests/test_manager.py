"""The ChannelManager with scripted channels: restarts, per-channel delivery, confirmation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from nanobot.bus.events import (
    ChatRef,
    InboundMessage,
    Outbound,
    OutboundMessage,
    StreamUpdate,
    Typing,
)
from nanobot.bus.queue import MessageBus
from nanobot.channels import manager as manager_module
from nanobot.channels.base import Channel, ChannelRefused, DeliveryError, Intake, Undeliverable
from nanobot.channels.manager import ChannelManager
from tests.fakes.outbox import MemoryOutbox


class Nobody:
    """An intake that takes nothing."""

    async def admits(self, channel: str, sender_id: str, *, private: bool, addressed: bool) -> bool:
        return False

    async def __call__(self, message: InboundMessage) -> Intake:
        return Intake.REFUSED


class ScriptedChannel(Channel):
    """Delivers after `slow` seconds; its first `failures` messages fail (DeliveryError);
    messages to a chat in `refusing` are refused with that error, every time."""

    def __init__(
        self, name: str, *, crashes: int = 0, slow: float = 0.0, failures: int = 0
    ) -> None:
        super().__init__(Nobody())
        self.name = name
        self.crashes = crashes
        self.runs = 0
        self.slow = slow
        self.failures = failures
        self.refusing: dict[str, Exception] = {}
        self.tried: list[Outbound] = []
        self.delivered: list[Outbound] = []
        self.arrived = asyncio.Event()  # set as each item is delivered
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
        self.tried.append(item)
        if isinstance(item, OutboundMessage) and item.chat.chat_id in self.refusing:
            raise self.refusing[item.chat.chat_id]
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
        self.arrived.set()


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


async def test_a_delivery_bug_is_recorded_as_a_failed_attempt() -> None:
    bus, ledger = MessageBus(), MemoryOutbox()
    channel = ScriptedChannel("tg")
    channel.refusing["1"] = KeyError("result")  # what PTB raised on a 200 without a result
    manager = ChannelManager([channel], bus, ledger)
    task = await run_manager(manager, channel)
    await bus.publish(reply("tg", 4))
    await asyncio.wait_for(manager.drain(), 5)
    assert ledger.failed == [(4, "KeyError: 'result'")]  # not left pending with 0 attempts
    assert ledger.confirmed == []
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


async def test_a_refused_reply_is_given_up_at_once_and_the_next_goes_ahead(
    warnings: list[str],
) -> None:
    bus, ledger = MessageBus(), MemoryOutbox()
    channel = ScriptedChannel("tg")
    channel.refusing["1"] = Undeliverable("Bad Request: message thread not found")
    manager = ChannelManager([channel], bus, ledger)
    task = await run_manager(manager, channel)
    await bus.publish(reply("tg", 1))
    await asyncio.wait_for(manager.drain(), 5)
    del channel.refusing["1"]
    await bus.publish(reply("tg", 2))
    await asyncio.wait_for(manager.drain(), 5)
    assert ledger.given_up == [(1, "Bad Request: message thread not found")]
    assert ledger.failed == [] and ledger.confirmed == [2]
    assert len(channel.tried) == 2  # the refused one was tried once, not retried
    assert [w.strip() for w in warnings if "thread not found" in w] == [
        "tg refused a reply to chat 1; given up: Bad Request: message thread not found"
    ]
    await stop(task)


async def test_a_chat_closed_to_the_bot_gets_nothing_until_it_writes_again(
    warnings: list[str],
) -> None:
    bus, ledger = MessageBus(), MemoryOutbox()
    channel = ScriptedChannel("tg")
    blocked = "Forbidden: bot was blocked by the user"
    channel.refusing["1"] = Undeliverable(blocked, chat_closed=True)
    manager = ChannelManager([channel], bus, ledger)
    task = await run_manager(manager, channel)
    chat, topic = ChatRef("tg", "1"), ChatRef("tg", "1", "7")
    await bus.publish(OutboundMessage(chat, "an answer", reply_to="1:10", outbox_id=1))
    await asyncio.wait_for(manager.drain(), 5)
    await bus.publish(Typing(chat, active=True))
    await bus.publish(StreamUpdate(topic, "s-1", "a cron job's"))  # answers no one
    await bus.publish(OutboundMessage(topic, "a cron job's run", outbox_id=2))
    await bus.publish(OutboundMessage(chat, "/status answer", kind="notice"))
    await bus.publish(Typing(chat, active=False))  # a turn's end always goes through
    await bus.publish(OutboundMessage(ChatRef("tg", "2"), "elsewhere", outbox_id=3))
    await asyncio.wait_for(manager.drain(), 5)
    assert [i for i in channel.tried if i.chat.chat_id == "1"] == [
        OutboundMessage(chat, "an answer", reply_to="1:10", outbox_id=1),
        Typing(chat, active=False),
    ]
    assert ledger.given_up == [
        (1, blocked),
        (2, f"not sent: the chat is closed to the bot ({blocked})"),
    ]
    assert len([w for w in warnings if "blocked" in w]) == 1  # said once
    del channel.refusing["1"]  # unblocked: the user writes, and is answered
    await bus.publish(OutboundMessage(chat, "welcome back", reply_to="1:11", outbox_id=4))
    await asyncio.wait_for(manager.drain(), 5)
    assert ledger.confirmed == [3, 4]
    await stop(task)


async def test_chats_backing_off_hold_up_no_other_chat(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each failing chat waits minutes between tries; they once held every delivery slot
    # (32) while they waited, and no other chat got anything meanwhile.
    monkeypatch.setattr(manager_module, "DELIVERY_RETRIES", (600.0,))
    bus, ledger = MessageBus(), MemoryOutbox()
    channel = ScriptedChannel("tg")
    manager = ChannelManager([channel], bus, ledger)
    task = await run_manager(manager, channel)
    failing = [str(n) for n in range(100, 150)]
    for chat_id in failing:
        channel.refusing[chat_id] = DeliveryError("500 Internal Server Error")
        await bus.publish(OutboundMessage(ChatRef("tg", chat_id), "hi", outbox_id=int(chat_id)))
    await bus.publish(reply("tg", 1))
    await asyncio.wait_for(channel.arrived.wait(), 5)
    assert channel.delivered == [reply("tg", 1)]
    assert sorted(i for i, _ in ledger.failed) == [int(c) for c in failing]  # backing off
    await stop(task)


class RefusedChannel(ScriptedChannel):
    """A channel whose platform refuses its token: every run raises `ChannelRefused`."""

    async def run(self, ready: Callable[[], None]) -> None:
        self.runs += 1
        raise ChannelRefused(f"channels.{self.name}.token was rejected")


async def test_a_refused_channel_stops_for_good_in_one_line(errors: list[str]) -> None:
    bus, ledger = MessageBus(), MemoryOutbox()
    refused, working = RefusedChannel("tg"), ScriptedChannel("dc")
    manager = ChannelManager([refused, working], bus, ledger)
    task = await run_manager(manager, working)
    await asyncio.sleep(0.1)  # ten restart delays (see fast_backoff)
    assert refused.runs == 1  # not restarted
    assert [line.strip() for line in errors] == ["tg stopped: channels.tg.token was rejected"]
    assert not manager.all_refused.is_set()  # the other one runs on
    await bus.publish(reply("dc", 1))
    await asyncio.wait_for(manager.drain(), 5)
    assert ledger.confirmed == [1]
    await stop(task)


async def test_all_refused_is_set_once_no_channel_is_left(errors: list[str]) -> None:
    channels = [RefusedChannel("tg"), RefusedChannel("dc")]
    manager = ChannelManager(channels, MessageBus(), MemoryOutbox())
    task = asyncio.create_task(manager.run())
    await asyncio.wait_for(manager.all_refused.wait(), 5)
    assert [channel.runs for channel in channels] == [1, 1]
    assert "every channel was refused; none is left running" in errors[-1]
    assert not any("Traceback" in line for line in errors)
    await stop(task)


class BuggyChannel(ScriptedChannel):
    """Its first run fails on a bug of its own (not the network)."""

    async def run(self, ready: Callable[[], None]) -> None:
        self.runs += 1
        if self.runs == 1:
            raise KeyError("chat_instance")
        ready()
        self.connected.set()
        await asyncio.Event().wait()


async def test_an_unreachable_platform_is_one_warning_a_try_and_a_bug_a_traceback(
    warnings: list[str], errors: list[str]
) -> None:
    offline, buggy = ScriptedChannel("offline", crashes=3), BuggyChannel("buggy")
    manager = ChannelManager([offline, buggy], MessageBus(), MemoryOutbox())
    task = await run_manager(manager, offline, buggy)
    tries = [line.strip() for line in warnings if line.startswith("offline ")]
    assert (
        tries == ["offline cannot reach its platform (platform went away); trying again in 0s"] * 3
    )
    # A bug is not routine: its traceback is logged, as an error.
    [crash] = errors
    assert crash.startswith("buggy crashed: 'chat_instance'") and "Traceback" in crash
    states = {state.name: state for state in manager.health.states()}
    assert states["offline"].up and states["buggy"].up
    await stop(task)


async def test_the_states_say_since_when_a_channel_is_down_and_why() -> None:
    refused, offline = RefusedChannel("tg"), ScriptedChannel("dc", crashes=1000)
    manager = ChannelManager([refused, offline], MessageBus(), MemoryOutbox())
    first = manager.health.states()
    assert [(s.name, s.up, s.reason) for s in first] == [("tg", False, ""), ("dc", False, "")]
    task = asyncio.create_task(manager.run())
    for _ in range(100):
        await asyncio.sleep(0.01)
        if offline.runs > 3:
            break
    tg, dc = manager.health.states()
    assert (tg.up, tg.for_good, tg.reason) == (False, True, "channels.tg.token was rejected")
    assert (dc.up, dc.for_good, dc.reason) == (False, False, "platform went away")
    assert tg.since == first[0].since and dc.since == first[1].since  # down since the start
    await stop(task)


class Speech:
    """Makes the audio of spoken replies (the `Voices` port): `fails` raises instead."""

    def __init__(self, *, fails: bool = False) -> None:
        self.asked: list[int | None] = []
        self.fails = fails

    async def voice(self, message: OutboundMessage) -> Path | None:
        self.asked.append(message.outbox_id)
        if self.fails:
            raise RuntimeError("a bug in the speech code")
        return Path(f"outbox/voice/{message.outbox_id}.ogg")


async def test_a_spoken_reply_has_its_audio_made_before_it_is_delivered(
    errors: list[str],
) -> None:
    bus, ledger, speech = MessageBus(), MemoryOutbox(), Speech()
    channel = ScriptedChannel("tg", failures=1)
    manager = ChannelManager([channel], bus, ledger, voices=speech)
    task = await run_manager(manager, channel)
    chat = ChatRef("tg", "1")
    await bus.publish(OutboundMessage(chat, "spoken", outbox_id=1, speak=True))
    # Its voice note is out already (a restart between its parts): not spoken again.
    await bus.publish(OutboundMessage(chat, "resumed", outbox_id=2, speak=True, parts_sent=1))
    await bus.publish(OutboundMessage(chat, "plain", outbox_id=3))
    await asyncio.wait_for(manager.drain(), 5)
    assert speech.asked == [1]  # once, though its delivery was tried twice
    voices = [(i.text, i.voice) for i in channel.delivered if isinstance(i, OutboundMessage)]
    assert voices == [
        ("spoken", Path("outbox/voice/1.ogg")),
        ("resumed", None),
        ("plain", None),
    ]
    assert ledger.confirmed == [1, 2, 3]

    # A bug in making it leaves the text to go alone.
    speech.fails = True
    await bus.publish(OutboundMessage(chat, "still said", outbox_id=4, speak=True))
    await asyncio.wait_for(manager.drain(), 5)
    last = channel.delivered[-1]
    assert isinstance(last, OutboundMessage) and (last.text, last.voice) == ("still said", None)
    assert ledger.confirmed[-1] == 4
    assert any("the speech of reply 4 failed" in line for line in errors)
    await stop(task)
