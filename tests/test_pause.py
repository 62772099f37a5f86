"""Channels wait out a paused intake (a state database that cannot be written): nothing is
acknowledged or dropped meanwhile, one line is logged, no channel crashes or restarts, and
what waited is taken once the store takes writes again.

The store fails for real: `PRAGMA query_only` makes every write fail as on a file that
turned read-only. The gate's pauses (`store.retry_seconds`) are a fraction of a second."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from loguru import logger

from nanobot.app import build_gateway, open_parts
from nanobot.bus.events import ChatRef
from nanobot.bus.intake import IntakePaused
from nanobot.bus.queue import MessageBus
from nanobot.channels import _discord_inbound, base
from nanobot.channels._pause import Pause
from nanobot.channels.base import InboxPolicy
from nanobot.config import load
from nanobot.gate import ChannelRules, Gate
from nanobot.outage import Backoff
from nanobot.store import Access, Database, Journal
from nanobot.store.failures import LateWatcher
from tests.fakes.discord import AttachmentFile, FakeDiscord
from tests.fakes.llm import Echo, FakeLLM
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.test_channel_discord import TOKEN, Recorder
from tests.test_channel_discord import make_channel as discord_channel
from tests.test_channel_discord import running as discord_running
from tests.test_channel_telegram import make_channel as telegram_channel
from tests.test_channel_telegram import running as telegram_running
from tests.test_gateway_telegram import ALICE, BOB, gateway_config, replies

PAUSE = 0.2  # seconds: the gate's pause before each try of the store, in these tests
PAUSES = Backoff((PAUSE,))


class Lines:
    """The log lines at INFO and above, and the gate's at DEBUG (its failed tries after the
    first), with a way to wait for one. `having` leaves the DEBUG ones out."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

    def __call__(self, message: Any) -> None:
        record = message.record
        self.lines.append(f"{record['level'].name} {record['message']}")
        if record["exception"] is not None:
            self.lines.append("TRACEBACK")
        self._loop.call_soon_threadsafe(self._changed.set)

    def having(self, text: str) -> list[str]:
        return [line for line in self.lines if text in line and not line.startswith("DEBUG ")]

    async def wait_for(self, text: str, seconds: float = 10.0) -> None:
        async with asyncio.timeout(seconds):
            while not any(text in line for line in self.lines):
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
async def lines() -> AsyncIterator[Lines]:
    lines = Lines()
    sinks = [
        logger.add(lines, level="INFO"),
        logger.add(
            lines,
            level="DEBUG",
            filter=lambda r: (
                r["name"] == "nanobot.gate" and r["level"].no < logger.level("INFO").no
            ),
        ),
    ]
    yield lines
    for sink in sinks:
        logger.remove(sink)


async def read_only(db: Database, on: bool) -> None:
    await db.fetchall(f"PRAGMA query_only = {'ON' if on else 'OFF'}")


# ---- the pause itself ------------------------------------------------------------------------


class PausedIntake:
    """A hand-over that raises `IntakePaused` while `paused`; records every call."""

    def __init__(self) -> None:
        self.paused = True
        self.calls: list[str] = []

    async def hand(self, name: str) -> str:
        self.calls.append(name)
        if self.paused:
            raise IntakePaused("intake is stopped", reason="disk full", retry_in=5.0)
        return name


class Waits:
    """A sleep that waits until the test lets it go (`go`), recording what it was asked."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._permits = asyncio.Semaphore(0)
        self.asked = asyncio.Event()

    async def __call__(self, seconds: float | None, wake: asyncio.Event) -> None:
        assert seconds is not None  # a probe waits for the next try, which intake named
        self.seconds.append(seconds)
        self.asked.set()
        await self._permits.acquire()

    def go(self) -> None:
        self.asked.clear()
        self._permits.release()


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_one_message_probes_the_others_wait_and_all_go_once_it_gets_through(
    lines: Lines,
) -> None:
    intake, waits = PausedIntake(), Waits()
    pause = Pause("chat", now=lambda: 0.0, sleep=waits)  # only `waits` moves
    tasks = [asyncio.create_task(pause.hand_over(partial(intake.hand, name))) for name in "abc"]
    await waits.asked.wait()
    await settle()
    # b and c met the pause before handing over: they wait without asking.
    assert pause.paused and intake.calls == ["a"] and waits.seconds == [5.0]
    opened = asyncio.create_task(pause.opened())

    waits.go()  # the store still fails: only the probe tried
    await waits.asked.wait()
    await settle()
    assert intake.calls == ["a", "a"] and not opened.done()

    intake.paused = False
    waits.go()
    assert await asyncio.gather(*tasks) == ["a", "b", "c"]
    await opened
    assert intake.calls[2:] == ["a", "b", "c"] and not pause.paused
    assert lines.lines == [
        "WARNING chat: intake paused: disk full; messages wait, unacknowledged, and are taken "
        "once the state database takes writes again (next try in 5 s)",
        "WARNING chat: intake resumed after 0 s",
    ]


async def test_a_probe_cancelled_leaves_probing_to_another_message() -> None:
    intake, waits = PausedIntake(), Waits()
    pause = Pause("chat", now=lambda: 0.0, sleep=waits)  # only `waits` moves
    probe = asyncio.create_task(pause.hand_over(lambda: intake.hand("a")))
    await waits.asked.wait()
    other = asyncio.create_task(pause.hand_over(lambda: intake.hand("b")))
    await settle()
    waits.asked.clear()
    probe.cancel()
    await waits.asked.wait()  # b tried, and now waits for the next try itself
    assert intake.calls == ["a", "b"]
    intake.paused = False
    waits.go()
    assert await other == "b"


# ---- Telegram, the whole gateway in this process ------------------------------------------


async def test_telegram_leaves_updates_unacknowledged_while_the_store_fails_and_answers_after(
    tmp_path: Path, fake_llm: FakeLLM, lines: Lines
) -> None:
    async with FakeTelegram(token=DEFAULT_TOKEN) as telegram:
        path = tmp_path / "config.yaml"
        settings = gateway_config(tmp_path, fake_llm, telegram)
        settings["store"] = {"retry_seconds": [PAUSE]}
        path.write_text(yaml.safe_dump(settings))
        config = load(path)
        async with open_parts(config, gateway=True) as parts:
            gateway = await build_gateway(config, parts, terminal=False)
            running = asyncio.create_task(gateway.run())
            try:
                await lines.wait_for("telegram connected")
                await read_only(parts.db, True)
                fake_llm.script(Echo(), Echo())  # the two chats' turns run side by side
                telegram.user_message(ALICE, "are you there?", user_id=ALICE)
                telegram.user_message(BOB, "me too?", user_id=BOB)
                await lines.wait_for("telegram: intake paused")
                await lines.wait_for("intake stopped (try 2)")  # tried again, failing still
                await telegram.wait_for(lambda: not telegram.polling)
                polls = len(telegram.calls("getUpdates"))
                await asyncio.sleep(3 * PAUSE)  # a few more tries: still no poll, no ack
                assert len(telegram.calls("getUpdates")) == polls
                assert len(telegram.pending_updates) == 2 and telegram.sent() == []

                await read_only(parts.db, False)
                (alice,) = await replies(telegram, ALICE, 1)
                (bob,) = await replies(telegram, BOB, 1)
                assert alice.endswith("\nare you there?") and bob.endswith("\nme too?")
                await telegram.wait_for(lambda: not telegram.pending_updates)
            finally:
                gateway.manager.all_refused.set()  # stops it as the end of its `until` does
                assert await asyncio.wait_for(running, 20) == 0
    assert len(lines.having("intake paused")) == 1
    assert len(lines.having("intake resumed")) == 2  # the gate's line and the channel's
    assert lines.having("TRACEBACK") == [] and lines.having("crashed") == []
    assert lines.having("restarting") == []


async def test_the_files_of_a_message_intake_did_not_take_are_deleted_at_once(
    tmp_path: Path, fake_telegram: FakeTelegram, lines: Lines
) -> None:
    inbox = InboxPolicy(tmp_path / "inbox", max_bytes=1000)
    failures = LateWatcher()
    async with await Database.open(tmp_path / "state.db", watch=failures) as db:
        rules = {"telegram": ChannelRules(frozenset({"42"}))}
        gate = Gate(rules, Access(db), Journal(db), MessageBus(), retry=PAUSES)
        failures.bind(gate)
        await read_only(db, True)
        async with telegram_running(telegram_channel(fake_telegram, gate, inbox)):
            fake_telegram.user_document(42, filename="a.txt", content=b"a", user_id=42)
            await lines.wait_for("telegram: intake paused")
            # Not taken: not kept (it is downloaded again when it is taken).
            assert list(inbox.directory.iterdir()) == []
            assert len(fake_telegram.calls("getFile")) == 1
        assert len(fake_telegram.pending_updates) == 1  # Telegram delivers it again


# ---- Discord ---------------------------------------------------------------------------


async def test_discord_messages_wait_while_the_store_fails_and_are_taken_after(
    tmp_path: Path, lines: Lines
) -> None:
    inbox = InboxPolicy(tmp_path / "inbox", max_bytes=1000)
    failures = LateWatcher()
    async with (
        FakeDiscord(token=TOKEN, heartbeat_interval_ms=500) as fake,
        await Database.open(tmp_path / "state.db", watch=failures) as db,
    ):
        ada = fake.add_user("ada")
        dm = fake.dm_channel(ada)
        bus = MessageBus()
        gate = Gate(
            {"discord": ChannelRules(frozenset({str(ada)}))},
            Access(db),
            Journal(db),
            bus,
            retry=PAUSES,
        )
        failures.bind(gate)
        async with discord_running(discord_channel(fake, gate, inbox)):
            await read_only(db, True)
            first = fake.user_message(dm, "one", user_id=ada)
            second = fake.user_message(dm, "two", user_id=ada)
            await lines.wait_for("discord: intake paused")
            await lines.wait_for("intake stopped (try 2)")
            assert await Journal(db).pending_inbound() == []
            await read_only(db, False)
            async with asyncio.timeout(10):
                taken = [await anext(bus.inbound()), await anext(bus.inbound())]
        assert [m.message_id for m in taken] == [str(first), str(second)]  # in order
        assert len(await Journal(db).pending_inbound()) == 2
    assert len(lines.having("intake paused")) == 1
    assert lines.having("TRACEBACK") == [] and lines.having("lost") == []
    assert ChatRef("discord", str(dm)) == taken[0].chat


async def test_files_saved_before_a_message_fails_to_be_read_are_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: Lines
) -> None:
    inbox = InboxPolicy(tmp_path / "inbox", max_bytes=1000)
    save = base.save_file
    saved: list[str] = []

    async def second_fails(policy: InboxPolicy, name: str, data: bytes) -> Path:
        saved.append(name)
        if len(saved) == 2:
            raise OSError(28, "No space left on device")
        return await save(policy, name, data)

    monkeypatch.setattr(_discord_inbound, "save_file", second_fails)
    intake = Recorder()
    async with FakeDiscord(token=TOKEN, heartbeat_interval_ms=500) as fake:
        ada = fake.add_user("ada")
        files = [AttachmentFile("a.txt", b"a"), AttachmentFile("b.txt", b"b")]
        async with discord_running(discord_channel(fake, intake, inbox)):
            fake.user_message(fake.dm_channel(ada), "two files", user_id=ada, attachments=files)
            await lines.wait_for("could not be taken")
    assert saved == ["a.txt", "b.txt"] and intake.messages == []
    assert list(inbox.directory.iterdir()) == []
