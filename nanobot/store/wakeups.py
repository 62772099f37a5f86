"""Wake-ups between the members of a cluster: PostgreSQL's LISTEN/NOTIFY.

A member that journals a message, decides an approval or changes a cron job says so on a
topic; every member listening wakes and looks at the store (the notification carries no
state: the store is the truth, so one lost while a connection was down costs only the wait
for the next look). Listening takes one connection of its own, opened again when the server
ends it; on reconnecting, every listener is woken, since what was said meanwhile is lost.
A server that cannot be reached is an outage (`nanobot.outage`): said once, tried again
after each pause of `store.retry_seconds`, or sooner once a notification of this member's
gets through (the server answers again), and said when it listens again.

One gateway on SQLite has no one to wake: its gate hands each message to its own bus.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Final, Protocol

from loguru import logger

from nanobot.outage import DEFAULT_BACKOFF, Backoff, Outage
from nanobot.store import url as store_url
from nanobot.store._together import Together, write_one
from nanobot.store.database import Database

_Say = Callable[[Sequence[str]], Awaitable[list[None]]]
Listener = Callable[[str], None]
"""Called on the event loop with a notification's payload; must not raise or block."""

INBOUND: Final = "nanobot_inbound"  # a message was journaled; payload: its session key
APPROVAL: Final = "nanobot_approval"  # an approval request was decided; payload: its id
CRON_CHANGED: Final = "nanobot_cron"  # a cron job was added, changed or removed


class Wakeups(Protocol):
    """Topics a process can speak on and listen to."""

    async def notify(self, topic: str, payload: str = "") -> None:
        """Wake every listener of `topic` (in every member).

        Raises:
            StoreError: it could not be said; callers treat it as a late wake-up (the
                store holds the truth, and the next look finds it)."""
        ...

    def listen(self, topic: str, listener: Listener) -> None:
        """Call `listener` with each payload said on `topic` from now on."""
        ...

    async def run(self) -> None:
        """Keep listening until cancelled."""
        ...


class PostgresWakeups:
    """LISTEN/NOTIFY on the PostgreSQL database `db` (at `url`): said through `db`'s own
    connections, heard on a connection of its own. `retry`: the pauses between attempts to
    listen while the server cannot be reached."""

    def __init__(self, db: Database, url: str, *, retry: Backoff = DEFAULT_BACKOFF) -> None:
        self._db = db
        self._url = url
        where = store_url.redact(url)
        self._outage = Outage(
            failing=f"cannot listen for wake-ups on {where}",
            effect="this member learns of the other members' work only at its next look "
            "at the store",
            back=f"listening on {where} again",
            backoff=retry,
        )
        self._listeners: defaultdict[str, list[Listener]] = defaultdict(list)
        # Per topic: what says many at once (None on a backend without), and what says them.
        self._said: dict[str, tuple[Together[str, None] | None, _Say]] = {}

    async def notify(self, topic: str, payload: str = "") -> None:
        # Many tasks saying something at once (a burst of messages journaled) say it in one
        # statement; what is said while one is under way goes in the next, so every
        # notification still follows the commit it announces.
        if topic not in self._said:
            speak: _Say = partial(self._say, topic)
            self._said[topic] = (self._db.together(f"wake-ups on {topic}", speak), speak)
        together, say = self._said[topic]
        await write_one(together, say, payload)
        self._outage.wake()  # the server answers: listen again without waiting out a pause

    async def _say(self, topic: str, payloads: Sequence[str]) -> list[None]:
        distinct = list(dict.fromkeys(payloads))  # the server would fold repeats anyway
        await self._db.execute(
            "SELECT " + ", ".join(["pg_notify(?, ?)"] * len(distinct)),
            [value for payload in distinct for value in (topic, payload)],
        )
        return [None] * len(payloads)

    def listen(self, topic: str, listener: Listener) -> None:
        self._listeners[topic].append(listener)

    async def run(self) -> None:
        first = True
        while True:
            try:
                await self._listen(first)
            except Exception as exc:  # noqa: BLE001 - the server went away: listen again
                self._outage.failed(exc)
            first = False
            await self._outage.wait()

    async def _listen(self, first: bool) -> None:
        """Listen on one connection until the server ends it (told to the outage)."""
        import asyncpg

        lost = asyncio.Event()
        conn = await asyncpg.connect(self._url, timeout=10)
        try:
            conn.add_termination_listener(lambda _: lost.set())
            for topic in list(self._listeners):
                await conn.add_listener(topic, self._deliver)
            self._outage.recovered()
            if not first:  # what was said while away is lost: everyone looks now
                for listeners in self._listeners.values():
                    for listener in listeners:
                        _call(listener, "")
            await lost.wait()
            self._outage.failed("the server ended the wake-up connection")
        finally:
            if not conn.is_closed():
                with contextlib.suppress(Exception):
                    await conn.close()

    def _deliver(self, _conn: Any, _pid: int, topic: str, payload: str) -> None:
        for listener in self._listeners.get(topic, ()):
            _call(listener, payload)


def _call(listener: Listener, payload: str) -> None:
    try:
        listener(payload)
    except Exception:  # noqa: BLE001 - one listener's bug must not silence the others
        logger.exception("a wake-up listener failed")
