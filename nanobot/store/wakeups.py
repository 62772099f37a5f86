"""Wake-ups between the members of a cluster: PostgreSQL's LISTEN/NOTIFY.

A member that journals a message, decides an approval or changes a cron job says so on a
topic; every member listening wakes and looks at the store (the notification carries no
state: the store is the truth, so one lost while a connection was down costs only the wait
for the next look). Speaking (`PostgresWakeups`) goes through the database's own connections;
listening (`Listening`) takes one connection of its own, opened again when the server ends it;
on reconnecting, every listener is woken, since what was said meanwhile is lost.
A server that cannot be reached is an outage (`nanobot.outage`): said once, tried again
after each pause of `store.retry_seconds`, or sooner once a notification of this member's
gets through (the server answers again), and said when it listens again.

The two are built apart so that the order of building is plain: the parts that speak (the
distributor, the approver) are given the speaker when they are built, and the listening is
built last, given each topic's listener (a method of a part built before it).

One gateway on SQLite has no one to wake: its gate hands each message to its own bus.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
    """Topics a process can speak on (`Listening` hears them)."""

    async def notify(self, topic: str, payload: str = "") -> None:
        """Wake every listener of `topic` (in every member).

        Raises:
            StoreError: it could not be said; callers treat it as a late wake-up (the
                store holds the truth, and the next look finds it)."""
        ...


class PostgresWakeups:
    """NOTIFY on the PostgreSQL database `db` (at `url`), said through `db`'s own
    connections; `Listening` hears it. `retry`: the pauses between attempts to listen while
    the server cannot be reached (the outage of listening is kept here, so that a
    notification that gets through brings the next try forward)."""

    def __init__(self, db: Database, url: str, *, retry: Backoff = DEFAULT_BACKOFF) -> None:
        self._db = db
        self.url = url
        where = store_url.redact(url)
        self.outage = Outage(
            failing=f"cannot listen for wake-ups on {where}",
            effect="this member learns of the other members' work only at its next look "
            "at the store",
            back=f"listening on {where} again",
            backoff=retry,
        )
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
        self.outage.wake()  # the server answers: listen again without waiting out a pause

    async def _say(self, topic: str, payloads: Sequence[str]) -> list[None]:
        distinct = list(dict.fromkeys(payloads))  # the server would fold repeats anyway
        await self._db.execute(
            "SELECT " + ", ".join(["pg_notify(?, ?)"] * len(distinct)),
            [value for payload in distinct for value in (topic, payload)],
        )
        return [None] * len(payloads)


class Listening:
    """Hears what is said through `wakeups` (any member's), calling `listeners[topic]` with
    each payload said on that topic, and every listener with "" each time it starts to
    listen: at first and after losing its connection, as what was said before it listened
    was not heard (a member that left while this one was starting). One per
    `PostgresWakeups`: it takes over that one's outage."""

    def __init__(self, wakeups: PostgresWakeups, listeners: Mapping[str, Listener]) -> None:
        self._url = wakeups.url
        self._outage = wakeups.outage
        self._listeners = dict(listeners)

    async def run(self) -> None:
        """Keep listening until cancelled."""
        while True:
            try:
                await self._listen()
            except Exception as exc:  # noqa: BLE001 - the server went away: listen again
                self._outage.failed(exc)
            await self._outage.wait()

    async def _listen(self) -> None:
        """Listen on one connection until the server ends it (told to the outage)."""
        import asyncpg

        lost = asyncio.Event()
        conn = await asyncpg.connect(self._url, timeout=10)
        try:
            conn.add_termination_listener(lambda _: lost.set())
            for topic in list(self._listeners):
                await conn.add_listener(topic, self._deliver)
            self._outage.recovered()
            # What was said before this connection listened is lost: everyone looks now.
            for listener in self._listeners.values():
                _call(listener, "")
            await lost.wait()
            self._outage.failed("the server ended the wake-up connection")
        finally:
            if not conn.is_closed():
                with contextlib.suppress(Exception):
                    await conn.close()

    def _deliver(self, _conn: Any, _pid: int, topic: str, payload: str) -> None:
        listener = self._listeners.get(topic)
        if listener is not None:
            _call(listener, payload)


def _call(listener: Listener, payload: str) -> None:
    try:
        listener(payload)
    except Exception:  # noqa: BLE001 - one listener's bug must not silence the others
        logger.exception("a wake-up listener failed")
