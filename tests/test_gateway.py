"""The gateway's lifecycle with real parts: start-up order, stopping on `until`, its row in
the members table."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from nanobot.bus.events import ChatRef, InboundMessage, Outbound, OutboundMessage
from nanobot.channels.base import Channel, IntakePort
from nanobot.channels.manager import ChannelManager
from nanobot.cluster.membership import Membership
from nanobot.gateway import Gateway
from nanobot.store import Database
from nanobot.store.members import Members
from tests.fakes.llm import FakeLLM, Text
from tests.test_dispatcher import Harness
from tests.test_loop import make_parts


class EagerChannel(Channel):
    """Hands a message in the moment it runs, before it even says it is connected, then
    ends the gateway once the answer is delivered."""

    name = "telegram"

    def __init__(self, intake: IntakePort) -> None:
        super().__init__(intake)
        self.delivered: list[str] = []
        self.done = asyncio.Event()

    async def run(self, ready: Callable[[], None]) -> None:
        await self.intake(InboundMessage.from_chat(ChatRef("telegram", "1"), "1", "hi", "m1"))
        ready()
        await asyncio.get_running_loop().create_future()

    async def deliver(self, item: Outbound) -> None:
        if isinstance(item, OutboundMessage):
            self.delivered.append(item.text)
            self.done.set()


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


async def test_a_message_taken_while_starting_is_answered_once(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    harness = Harness(await make_parts(tmp_path, fake_llm, db), db)
    # A message from before the restart, so that recovery has work and takes its time.
    harness.gate.close()
    await harness.gate(InboundMessage.from_chat(ChatRef("telegram", "2"), "2", "old", "m0"))
    harness = Harness(harness.parts, db)
    channel = EagerChannel(harness.gate)
    fake_llm.script(Text("answer"), Text("answer"))
    gateway = Gateway(
        harness.bus,
        harness.gate,
        harness.dispatcher,
        ChannelManager([channel], harness.bus, harness.journal),
        until=channel.done,
    )
    async with asyncio.timeout(30):
        assert await gateway.run() == 0
    assert fake_llm.request_count == 2  # the old message and the new one, each once
    assert await harness.journal.pending_inbound() == []


class IdleChannel(Channel):
    """Says it runs, then waits; takes nothing in."""

    name = "telegram"

    def __init__(self, intake: IntakePort) -> None:
        super().__init__(intake)
        self.running = asyncio.Event()

    async def run(self, ready: Callable[[], None]) -> None:
        ready()
        self.running.set()
        await asyncio.get_running_loop().create_future()

    async def deliver(self, item: Outbound) -> None:
        raise AssertionError(f"nothing to deliver: {item}")


async def test_the_gateway_is_a_member_while_it_runs_and_leaves_at_a_clean_stop(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    harness = Harness(await make_parts(tmp_path, fake_llm, db), db)
    channel, stop, members = IdleChannel(harness.gate), asyncio.Event(), Members(db)
    gateway = Gateway(
        harness.bus,
        harness.gate,
        harness.dispatcher,
        ChannelManager([channel], harness.bus, harness.journal),
        until=stop,
        membership=Membership(members),
    )
    async with asyncio.timeout(30):
        running = asyncio.create_task(gateway.run())
        await channel.running.wait()
        [member] = await members.all()
        assert member.pid == os.getpid() and not member.stale(members.now())
        stop.set()
        assert await running == 0
    assert await members.all() == []
