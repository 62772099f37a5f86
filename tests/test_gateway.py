"""The gateway's lifecycle with real parts: start-up order, stopping on `until`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from nanobot.bus.events import ChatRef, InboundMessage, Outbound, OutboundMessage
from nanobot.channels.base import Channel, IntakePort
from nanobot.channels.manager import ChannelManager
from nanobot.gateway import Gateway
from nanobot.store import Database
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
        await self.intake(InboundMessage(ChatRef("telegram", "1"), "1", "hi", "m1"))
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
    await harness.gate(InboundMessage(ChatRef("telegram", "2"), "2", "old", "m0"))
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
