"""The gate: who may talk to nanobot, and the one way in for every accepted message.

Deny by default. A sender is allowed by the channel's `allow_from` (numeric platform ids, or
"*") or by an approved pairing. An unknown sender in a private chat gets a pairing code and
nothing else; in a group they are ignored. Group messages are answered only as the channel's
`group_policy` says. Channels ask `admits` before downloading a message's files, so nothing a
stranger sends is fetched. An allowed message is journaled (recognising redeliveries) and
queued for the agent, in that order, before the channel acknowledges it.

A store failure (disk full, an I/O error, a damaged file) stops intake: a journal write
that fails, or any other write the store reports to `store_failed` (a turn's session, the
outbox). One line says so and why (`nanobot.outage`), and from then on every message is
refused with `IntakePaused` without the store being asked, so no channel acknowledges it:
each waits and hands it over again when the exception says. There is no timer: the first
message after a pause (`store.retry_seconds`, growing while the store keeps failing) tries
the store again, and once its journal write succeeds intake is open again (`reopened`), so a
disk that was full recovers without a restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Final, Literal, Protocol

from loguru import logger

from nanobot.bus.events import InboundMessage, OutboundMessage
from nanobot.bus.intake import IntakePaused
from nanobot.bus.queue import MessageBus
from nanobot.bus.records import inbound_record
from nanobot.channels.base import Intake
from nanobot.errors import StoreError
from nanobot.log import printable
from nanobot.outage import DEFAULT_BACKOFF, Backoff, Outage
from nanobot.store import Access, Journal
from nanobot.store.access import MAX_PENDING
from nanobot.store.journal import Accepted

CATCH_UP_WINDOW: Final = timedelta(days=7)
"""How far back `last_seen` looks for the chats a channel catches up on at start."""

GroupPolicy = Literal["mention", "open", "disabled"]


@dataclass(frozen=True, slots=True)
class ChannelRules:
    """The access rules of one channel, from its config section."""

    allow_from: frozenset[str]
    group_policy: GroupPolicy = "mention"

    @property
    def everyone(self) -> bool:
        return "*" in self.allow_from


def pairing_notice(code: str) -> str:
    return (
        "Hi! I only talk to people my owner has approved. To be approved, ask them to run:\n"
        f"nanobot pairing approve {code}\n"
        "(The code is valid for one hour.)"
    )


class Entry(Protocol):
    """Where an accepted message goes: into the journal, then to whoever answers it."""

    async def accept(self, message: InboundMessage) -> Accepted | None:
        """Journal `message`; its row and whether this process answers it, or None when it
        was journaled before (nothing is done).

        Raises:
            StoreError: nothing was journaled.
        """
        ...

    async def hand_over(self, message: InboundMessage, accepted: Accepted) -> None:
        """Queue the journaled `message` to be answered. Never raises: once journaled, it
        is answered even across a crash."""
        ...


@dataclass(frozen=True, slots=True)
class LocalEntry:
    """One gateway alone: this process's journal, and its bus to the dispatcher."""

    journal: Journal
    bus: MessageBus

    async def accept(self, message: InboundMessage) -> Accepted | None:
        row = await self.journal.accept(
            message.chat.channel, message.message_id, inbound_record(message), message.session_key
        )
        return None if row is None else Accepted(row)

    async def hand_over(self, message: InboundMessage, accepted: Accepted) -> None:
        await self.bus.publish_inbound(message)


class Gate:
    """Decides on every inbound message; the `IntakePort` given to channels."""

    def __init__(
        self,
        rules: Mapping[str, ChannelRules],
        access: Access,
        journal: Journal,
        bus: MessageBus,
        *,
        clock: Callable[[], float] = time.monotonic,
        entry: Entry | None = None,
        retry: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        """`entry`: where an accepted message goes instead of `journal` and `bus` (in a
        cluster, the distribution of work among the members). `retry`: the pauses after a
        store failure before the next message tries the store again."""
        self._rules = dict(rules)
        self._entry = entry or LocalEntry(journal, bus)
        self._access = access
        self._journal = journal
        self._bus = bus
        self._closed = False
        # Active while a store failure stops intake.
        self._outage = Outage(
            failing="intake stopped",
            effect="no message is taken or acknowledged until the state database takes "
            "writes again, tried with the first message after each pause",
            back="intake resumed: the state database takes writes again",
            backoff=retry,
            now=clock,
        )
        self._crowded: set[str] = set()  # channels whose pairing requests push out others

    def close(self) -> None:
        """Stop handing messages to the agent: from now on an allowed message is journaled
        and answered after the restart (Discord never delivers a message twice, so leaving
        it to the platform would lose it). Strangers get no pairing code while stopping:
        their messages are not taken (`Intake.CLOSED`; Telegram delivers them again)."""
        self._closed = True

    def describe(self) -> list[str]:
        """One line per channel saying who may talk to it (for the start-up log)."""
        lines = []
        for name, rules in sorted(self._rules.items()):
            if rules.everyone:
                who = "everyone"
            elif rules.allow_from:
                who = f"{len(rules.allow_from)} allowed user(s) and approved pairings"
            else:
                who = "nobody yet (allow_from is empty): unknown users get a pairing code"
            lines.append(f"{name}: answers {who}; groups: {rules.group_policy}")
        return lines

    @property
    def stopped(self) -> bool:
        """Whether a store failure has stopped intake (see the module docstring)."""
        return self._outage.active

    async def reopened(self) -> None:
        """Return once intake is open: at once, or when a journal write succeeds again after
        a store failure stopped it. Cancellation is safe."""
        await self._outage.ended()

    async def retry_due(self, after: float | None = None) -> float | None:
        """Return once the store may be tried: at once while intake is open (None); else
        when it opens again (None), or when the pause before the next try has passed (the
        pause's end, on the gate's clock). `after`: the end of a pause the caller tried at
        already: that one does not count, only a later one (a try that failed for want of
        storage sets it) or intake opening. So a process that takes no messages, a cluster
        member the load balancer sends nothing to, still tries the store after each pause,
        never in a loop; and its try does not push back the next message's. Cancellation
        is safe."""
        return await self._outage.wait(after)

    def store_failed(self, error: StoreError) -> None:
        """A write failed for want of storage (`FailureWatcher`: the store tells the gate of
        its every such failure): stop intake, or keep it stopped."""
        self._failed(error)

    async def admits(self, channel: str, sender_id: str, *, private: bool, addressed: bool) -> bool:
        """See `IntakePort.admits`. While intake is stopped, or when the store cannot say,
        the answer comes from the config alone (no files are fetched onto a disk that may be
        full); the message itself is then refused by `__call__`. Never raises."""
        rules = self._rules.get(channel)
        if rules is None or not (private or _listens(rules.group_policy, addressed)):
            return False
        configured = rules.everyone or sender_id in rules.allow_from
        if configured or self._outage.active:
            return configured
        try:
            return await self._access.is_allowed(channel, sender_id)
        except StoreError as exc:
            self._failed(exc)
            return False

    async def last_seen(self, channel: str) -> dict[str, str]:
        """See `IntakeHistory.last_seen`: the journal's newest message per chat of
        `channel` over the last `CATCH_UP_WINDOW` (at most what the journal keeps)."""
        try:
            return await self._journal.last_seen(channel, CATCH_UP_WINDOW)
        except StoreError as exc:
            self._failed(exc)
            raise

    async def caught_up_until(self, channel: str) -> datetime | None:
        """See `IntakeHistory.caught_up_until`: at most `CATCH_UP_WINDOW` back."""
        try:
            until = await self._journal.caught_up_until(channel)
        except StoreError as exc:
            self._failed(exc)
            raise
        return None if until is None else max(until, datetime.now(UTC) - CATCH_UP_WINDOW)

    async def caught_up(self, channel: str, moment: datetime) -> None:
        """See `IntakeHistory.caught_up`."""
        try:
            await self._journal.caught_up(channel, moment)
        except StoreError as exc:
            self._failed(exc)
            raise

    async def __call__(self, message: InboundMessage) -> Intake:
        self._refuse_while_stopped()
        try:
            refusal = await self._check(message)
        except StoreError as exc:
            raise self._paused(exc) from exc
        if refusal is not None:
            return refusal
        journal_id = await self.submit(message)
        return Intake.DUPLICATE if journal_id is None else Intake.ACCEPTED

    async def submit(self, message: InboundMessage) -> int | None:
        """Journal `message` and queue it for the agent, without asking who sent it: the
        way in for nanobot's own events (`EventIntake`), and for chat messages once they
        passed the checks. Its journal row; None when it was journaled before.

        Raises:
            IntakePaused: the journal could not be written, or intake is stopped by an
                earlier failure; nothing was taken.
        """
        self._refuse_while_stopped()
        try:
            accepted = await self._entry.accept(message)
        except StoreError as exc:
            raise self._paused(exc) from exc
        self._resumed()
        if accepted is None:
            logger.debug(
                "{} message {} seen before; ignored", message.chat.channel, message.message_id
            )
            return None
        if self._closed:  # checked after the journal write: the gate may close during it
            logger.info(
                "{} message {} arrived while stopping: kept, answered after the restart",
                message.chat.channel,
                message.message_id,
            )
            return accepted.id
        await self._entry.hand_over(replace(message, journal_id=accepted.id), accepted)
        return accepted.id

    def _refuse_while_stopped(self) -> None:
        """Raise while intake is stopped and the pause before the next try has not passed."""
        outage = self._outage
        if outage.active and (retry_in := outage.retry_in) > 0:
            raise IntakePaused(
                f"intake is stopped ({outage.error}); the message was not taken",
                reason=outage.error,
                retry_in=retry_in,
            )

    def _paused(self, exc: StoreError) -> IntakePaused:
        """Intake stopped over `exc`, a write of the message's that failed: what to raise."""
        self._failed(exc)
        return IntakePaused(str(exc), reason=str(exc), retry_in=self._outage.retry_in)

    def _failed(self, exc: StoreError) -> None:
        """Stop intake after a store failure, or keep it stopped after a failed try (see
        `Outage.failed`: failures of writes already under way when intake stopped only
        update the reason)."""
        self._outage.failed(exc)

    def _resumed(self) -> None:
        """A store write succeeded: intake is open again, if a failure had stopped it."""
        self._outage.recovered()

    async def _check(self, message: InboundMessage) -> Intake | None:
        """Why `message` is not taken, or None when it may go to the agent."""
        rules = self._rules.get(message.chat.channel)
        if rules is None:
            return self._refuse(message, "unknown channel")
        channel, sender = message.chat.channel, message.sender_id
        if message.is_private:
            if await self._allowed(rules, channel, sender):
                return None
            return Intake.CLOSED if self._closed else await self._pair(message)
        if not _listens(rules.group_policy, message.addressed):
            return Intake.REFUSED  # not talking to us: not even worth a log line
        if not await self._allowed(rules, channel, sender):
            return self._refuse(message, "sender is not allowed")
        return None

    async def _allowed(self, rules: ChannelRules, channel: str, sender_id: str) -> bool:
        if rules.everyone or sender_id in rules.allow_from:
            return True
        return await self._access.is_allowed(channel, sender_id)

    def _refuse(self, message: InboundMessage, why: str) -> Intake:
        logger.info(
            "refused a {} message from user {} in chat {}: {}",
            message.chat.channel,
            message.sender_id,
            message.chat.chat_id,
            why,
        )
        return Intake.REFUSED

    async def _pair(self, message: InboundMessage) -> Intake:
        channel = message.chat.channel
        issued = await self._access.request(
            channel, message.sender_id, message.chat.chat_id, message.sender_name
        )
        self._resumed()
        if not issued.new:
            return self._refuse(message, f"unknown sender; pairing code {issued.code} already sent")
        self._note_crowding(channel, issued.evicted)
        logger.info(
            "pairing requested on {} by user {} ({}): code {}; approve with "
            "`nanobot pairing approve {}`",
            channel,
            message.sender_id,
            printable(message.sender_name or "no name"),
            issued.code,
            issued.code,
        )
        notice = OutboundMessage(message.chat, pairing_notice(issued.code), kind="notice")
        await self._bus.publish(notice)
        return Intake.PAIRING

    def _note_crowding(self, channel: str, evicted: int) -> None:
        """Warn once when a channel's pairing requests start pushing out older ones, not on
        every request while that lasts: a flood would otherwise flood the log as well."""
        if not evicted:
            self._crowded.discard(channel)
        elif channel not in self._crowded:
            self._crowded.add(channel)
            logger.warning(
                "{}: {} pairing requests are waiting, so each new one now replaces the oldest "
                "(many strangers, or one with many accounts?); see `nanobot pairing list`",
                channel,
                MAX_PENDING,
            )


def _listens(policy: GroupPolicy, addressed: bool) -> bool:
    """Whether a group message is for us under `policy`."""
    return policy == "open" or (policy == "mention" and addressed)
