"""Wake-ups between members (store/wakeups.py) on a real PostgreSQL server: what many tasks
say at once goes out together, and every listener hears each distinct payload; a lost or
unreachable server is said once, and listening resumes on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from loguru import logger

from nanobot.outage import Backoff
from nanobot.store import Database
from nanobot.store.wakeups import APPROVAL, INBOUND, Listening, PostgresWakeups


class Said:
    """What was said (payloads heard, lines logged) as it comes, with a way to wait."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._changed = asyncio.Event()

    def __call__(self, item: str) -> None:
        self.items.append(item)
        self._changed.set()

    def __contains__(self, text: str) -> bool:
        return any(text in item for item in self.items)

    async def until(self, text: str) -> None:
        async with asyncio.timeout(10):
            while text not in self:
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
def lines() -> Iterator[Said]:
    """What the wake-ups logged, from DEBUG up."""
    said = Said()
    sink = logger.add(
        lambda m: said(f"{m.record['level'].name} {m.record['message']}"),
        level="DEBUG",
        filter="nanobot.store.wakeups",
    )
    yield said
    logger.remove(sink)


async def test_what_many_say_at_once_is_heard_by_every_listener(postgres_url: str) -> None:
    async with await Database.open(postgres_url) as db:
        speaker = PostgresWakeups(db, postgres_url)
        inbound: list[str] = []
        approvals: list[str] = []
        heard = asyncio.Event()

        def hear(into: list[str]) -> Callable[[str], None]:
            def listener(payload: str) -> None:
                into.append(payload)
                heard.set()

            return listener

        hearer = Listening(
            PostgresWakeups(db, postgres_url), {INBOUND: hear(inbound), APPROVAL: hear(approvals)}
        )
        listening = asyncio.create_task(hearer.run())
        try:
            async with asyncio.timeout(10):  # until it listens
                while "probe" not in inbound:
                    await speaker.notify(INBOUND, "probe")
                    await asyncio.sleep(0.05)
            assert approvals == [""]  # told once it listens: look, what came before is lost
            inbound.clear()
            approvals.clear()
            said = [f"telegram:{n % 30}" for n in range(90)]  # repeats among them
            await asyncio.gather(
                *(speaker.notify(INBOUND, key) for key in said),
                *(speaker.notify(APPROVAL, str(n)) for n in range(5)),
            )
            async with asyncio.timeout(10):
                while not set(said) <= set(inbound) or len(approvals) < 5:
                    heard.clear()
                    await heard.wait()
            assert sorted(approvals) == ["0", "1", "2", "3", "4"]  # each topic its own
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)


async def test_a_lost_connection_is_said_once_and_every_listener_woken_when_it_listens_again(
    postgres_url: str, lines: Said
) -> None:
    async with await Database.open(postgres_url) as db:
        wakeups = PostgresWakeups(db, postgres_url, retry=Backoff((0.05,)))
        heard = Said()
        listening = asyncio.create_task(Listening(wakeups, {INBOUND: heard}).run())
        try:
            async with asyncio.timeout(10):  # until it listens
                while "probe" not in heard.items:
                    await wakeups.notify(INBOUND, "probe")
                    await asyncio.sleep(0.05)
            heard.items.clear()
            await db.fetchall(  # what a restart of the server does to it
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            )
            await heard.until("")  # listening again: everyone looks now
            assert heard.items[0] == ""
            await wakeups.notify(INBOUND, "after")
            await heard.until("after")
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
    [lost, back] = lines.items
    assert lost.startswith("WARNING cannot listen for wake-ups on postgresql://")
    assert "the server ended the wake-up connection" in lost
    assert lost.endswith("(next try in 0.05 s)")
    assert back.startswith("WARNING listening on postgresql://") and " again after " in back


async def test_a_server_that_cannot_be_reached_is_said_once_then_tried_on_the_backoff(
    tmp_path: Path, lines: Said
) -> None:
    url = "postgresql://nanobot:hunter2@127.0.0.1:1/nanobot"  # nothing listens on port 1
    async with await Database.open(tmp_path / "state.db") as db:  # not used to listen
        wakeups = PostgresWakeups(db, url, retry=Backoff((0.01,)))
        listening = asyncio.create_task(Listening(wakeups, {}).run())
        try:
            await lines.until("(try 4)")
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
    first, *tries = lines.items
    assert first.startswith("WARNING cannot listen for wake-ups on postgresql://nanobot:***@")
    # Each later try at DEBUG only, counted.
    assert all(f"(try {n}): " in line for n, line in enumerate(tries[:3], start=2))
    assert all(line.startswith("DEBUG cannot listen for wake-ups on ") for line in tries)
    assert "hunter2" not in lines


async def test_a_notification_that_gets_through_brings_the_next_try_to_listen_forward(
    postgres_url: str, lines: Said
) -> None:
    """The server answers this member's statements (a notification went out) while
    listening still fails: the next try comes now, not after the backoff's long pause."""
    unreachable = "postgresql://nanobot@127.0.0.1:1/nanobot"
    async with await Database.open(postgres_url) as db:
        wakeups = PostgresWakeups(db, unreachable, retry=Backoff((0.01, 3600.0)))
        listening = asyncio.create_task(Listening(wakeups, {}).run())
        try:
            await lines.until("(try 2)")  # and an hour until the next
            await wakeups.notify(INBOUND, "a message")
            await lines.until("(try 3)")
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
