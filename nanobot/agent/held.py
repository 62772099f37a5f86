"""Messages whose turn a store failure cut short, kept until the state database takes writes.

A turn whose session entries or reply cannot be written (disk full, an I/O error, the
database server restarting) ends without its message being marked answered: the message
stays pending in the journal, and a restart answers it (`Dispatcher.recover`). `Held`
answers it sooner: it keeps such messages and hands them back once the store may be tried
again (`StoreOutage.retry_due`): once intake is open again (a journal write succeeded after
the failure: the gate tries the store again with the first message after a pause), or once
that pause has passed without a message (a process that takes none in, such as a cluster
member the load balancer does not send to), once per pause: a retry that fails for want of
storage sets the next pause, one that fails otherwise waits for intake to open. A message is
kept only while a store failure has stopped intake, so retries follow the gate's pauses
(`store.retry_seconds`, growing while the store keeps failing), and a failure of another kind
(a bug) is never retried in a loop. Each message is said once when it is first kept (a
retry of it that fails again only at DEBUG); the gate says when the store is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from loguru import logger

from nanobot.bus.events import InboundMessage
from nanobot.errors import StoreError
from nanobot.store import Journal


class StoreOutage(Protocol):
    """Whether a store failure has stopped intake, and when it is open again (the gate)."""

    @property
    def stopped(self) -> bool: ...

    async def retry_due(self, after: float | None = None) -> float | None:
        """Return once intake is open (None), or once the pause before the store's next
        try has passed (its end); not for the pause ending at `after`, tried already."""
        ...


class Held:
    """The messages kept; see the module docstring."""

    def __init__(self, outage: StoreOutage, journal: Journal) -> None:
        self._outage = outage
        self._journal = journal
        self._messages: dict[int, InboundMessage] = {}  # journal row -> message
        self._waiting = asyncio.Event()  # set while messages are kept
        self._ever: set[int] = set()  # rows kept before (retried): not announced again
        self._drops = 0  # how many times `drop` was called: a batch taken before one is void

    def can_hold(self, message: InboundMessage) -> bool:
        """Whether `message` would be kept: it has a journal row, and a store failure has
        stopped intake (so a failure of its turn was the store's)."""
        return message.journal_id is not None and self._outage.stopped

    def hold(self, message: InboundMessage, error: StoreError) -> bool:
        """Keep `message` (see `can_hold`), whose turn `error` cut short; True the first time
        it is kept (tell its chat), False when a retry of it failed again."""
        row = message.journal_id
        assert row is not None and self._outage.stopped, "see can_hold"
        self._messages[row] = message
        self._waiting.set()
        first = row not in self._ever
        self._ever.add(row)
        logger.log(
            "WARNING" if first else "DEBUG",
            "{} message {} is not answered yet: {}; it is answered once the state database "
            "takes writes again (or after a restart)",
            message.chat.channel,
            message.message_id,
            error,
        )
        return first

    def drop(self) -> None:
        """Forget the messages kept (they stay pending in the journal for whoever answers
        them next)."""
        if self._messages:
            logger.info(
                "{} kept message(s) are left to the member that takes them", len(self._messages)
            )
        self._messages.clear()
        self._waiting.clear()
        self._drops += 1

    async def released(self) -> AsyncIterator[tuple[InboundMessage, bool]]:
        """Each time the store may be tried again (`StoreOutage.retry_due`), the messages
        kept: each with whether its user message reached its session (resume its turn
        rather than start it). Runs until cancelled; what is kept then stays pending in the
        journal for the next start."""
        tried = None  # the end of the pause it last tried the store at
        while True:
            await self._waiting.wait()
            tried = await self._outage.retry_due(tried)
            batch, self._messages = self._messages, {}
            self._waiting.clear()
            drops = self._drops
            if not batch:  # dropped while it waited
                continue
            try:
                reached = await self._journal.reached_session(list(batch))
            except StoreError as exc:
                if self._drops != drops:
                    continue
                if self._outage.stopped:  # failing again: wait for the next try
                    self._messages = batch | self._messages
                    self._waiting.set()
                else:
                    logger.error(
                        "{} kept message(s) are answered after a restart: {}", len(batch), exc
                    )
                continue
            if self._drops != drops:  # dropped meanwhile: they are another's to answer now
                continue
            logger.info("answering {} message(s) kept while the store failed", len(batch))
            for row, message in batch.items():
                yield message, row in reached
