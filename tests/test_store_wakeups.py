"""Wake-ups between members (store/wakeups.py) on a real PostgreSQL server: what many tasks
say at once goes out together, and every listener hears each distinct payload."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nanobot.store import Database
from nanobot.store.wakeups import APPROVAL, INBOUND, PostgresWakeups


async def test_what_many_say_at_once_is_heard_by_every_listener(postgres_url: str) -> None:
    async with await Database.open(postgres_url) as db:
        speaker, hearer = PostgresWakeups(db, postgres_url), PostgresWakeups(db, postgres_url)
        inbound: list[str] = []
        approvals: list[str] = []
        heard = asyncio.Event()

        def hear(into: list[str]) -> Callable[[str], None]:
            def listener(payload: str) -> None:
                into.append(payload)
                heard.set()

            return listener

        hearer.listen(INBOUND, hear(inbound))
        hearer.listen(APPROVAL, hear(approvals))
        listening = asyncio.create_task(hearer.run())
        try:
            async with asyncio.timeout(10):  # until it listens
                while "probe" not in inbound:
                    await speaker.notify(INBOUND, "probe")
                    await asyncio.sleep(0.05)
            inbound.clear()
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
