"""Work distribution in a cluster: which member answers which session.

Every member of a cluster (gateways sharing one PostgreSQL store) journals what its channels
take in. A message of a session the member holds already, or of a free session while no
other member is alive, it claims in the same statement and answers itself (one round trip
per message, as a gateway alone on SQLite has one write); any other it announces (a wake-up
on `INBOUND`). Each member then takes work from the journal: the pending messages of
sessions it holds the lease on, or can take (free, or lapsed because their holder died). A
taken session stays with its member while the member lives (its leases are renewed together
every third of `lease`), so a session's turns run in one process, in order; a new session
goes to whichever member takes it first, at most `BATCH` sessions a round (leased in one
statement, claimed in another), in a random order, so that members with time to spare take
more.

When a member dies its leases lapse, and the members that see pending messages of those
sessions look again at that moment: one takes each session, and resumes the interrupted
turn as a restart does (the tool call that was running is not run again; the reply is not
doubled). The replies the dead member queued and did not send are taken by a live member
(`orphaned_replies`) once its membership expires (as its leases lapse: `timings`); the
members look again at that moment. A member stopping
cleanly finishes or checkpoints its turns, then gives its leases up and says so, so the
others take its waiting work at once.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol

from loguru import logger

from nanobot.bus.events import InboundMessage
from nanobot.bus.queue import MessageBus
from nanobot.bus.records import inbound_from, inbound_record, outbound_from
from nanobot.cluster.timings import renewal
from nanobot.errors import StoreError
from nanobot.outage import DEFAULT_BACKOFF, Backoff, Outage
from nanobot.store.claims import Candidate, Claims
from nanobot.store.journal import Accepted, Journal
from nanobot.store.members import Members
from nanobot.store.wakeups import INBOUND, Wakeups
from nanobot.tasks import TaskSet

BATCH: Final = 32  # sessions one round takes at most, before it looks again
LOOK: Final = 200  # pending messages one round reads
LAPSE_MARGIN: Final = 0.05  # seconds after a lease's end before looking again
FULL_LOOK: Final = 0.5  # seconds at most between two looks at what other members claimed


class Taker(Protocol):
    """Where taken messages go: the dispatcher."""

    def take(self, message: InboundMessage, *, resume: bool) -> None:
        """Answer `message` (resuming its interrupted turn when `resume`)."""
        ...

    def drop_all(self) -> None:
        """Stop every turn taken, as if this process had died (another member resumes
        them): its sessions are about to be another's."""
        ...


class Distributor:
    """This member's share of the cluster's work, from the journal to its dispatcher."""

    def __init__(
        self,
        claims: Claims,
        journal: Journal,
        members: Members,
        wakeups: Wakeups,
        bus: MessageBus,
        *,
        channels: Collection[str],
        lease: timedelta,
        retry: Backoff = DEFAULT_BACKOFF,
        taken_over: Callable[[str], Awaitable[None]] | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """`taken_over(session_key)`: settle what a dead member's interrupted turn left
        waiting (its approval requests) before this member resumes it."""
        self._claims = claims
        self._taken_over = taken_over
        self._journal = journal
        self._members = members
        self._wakeups = wakeups
        self._bus = bus
        self._taker: Taker | None = None
        self._channels = frozenset(channels)
        self._lease = lease
        self._now = now
        self._wake = asyncio.Event()
        self._wake.set()  # the first round recovers what the cluster left pending
        # Whether the next round looks for a dead member's replies: at start, when a lease
        # or a membership lapses, when a member leaves or listening starts again; not at
        # each message (that would be two more statements per message on every member).
        self._orphans_due = True
        self._full_look = 0.0  # when a round last looked at other members' claims too
        self._watched: datetime | None = None  # `_watched_moments` as last read, and when
        self._watched_at = -FULL_LOOK
        # Set while this member's turns are stopped for want of renewals (`_renewing`),
        # until it has handed back what it claimed: it takes nothing meanwhile.
        self._fenced = False
        self._tasks = TaskSet("distribution")
        self._looking = Outage(
            failing="could not take work from the store",
            effect="this member takes no new chats meanwhile",
            back="taking work from the store again",
            backoff=retry,
        )
        # Renewals keep the lease's cadence; this only says the failures once.
        self._renewals = Outage(
            failing="could not renew this member's session leases",
            effect="its turns go on while the leases hold",
            back="this member's session leases are renewed again",
        )

    def woken(self, session_key: str) -> None:
        """The listener of `INBOUND` (`Listening`): another member (or this one) said
        something: a message for `session_key`, or, with no session, that it left or that
        this member listens again."""
        if not session_key:
            self._orphans_due = True
        self._looking.wake()  # a member got through to the store: try it again soon
        self._wake.set()

    async def accept(self, message: InboundMessage) -> Accepted | None:
        """Journal `message` (the gate's `Entry`), taking its session for this member when
        it may answer it at once (`Claims.accept`): one statement, where the journal, a
        wake-up and a claim would be several. None when it was journaled before.

        Raises:
            StoreError: nothing was journaled.
        """
        record = inbound_record(message)
        if self._taker is None or self._fenced:  # not taking work: the cluster's, then
            row = await self._journal.accept(
                message.chat.channel, message.message_id, record, message.session_key
            )
            return None if row is None else Accepted(row, here=False)
        return await self._claims.accept(
            message.chat.channel,
            message.message_id,
            record,
            message.session_key,
            now=self._now(),
            ttl=self._lease,
        )

    async def hand_over(self, message: InboundMessage, accepted: Accepted) -> None:
        """Answer `message` here if this member took it; else wake this member and the
        others to take it. Never raises: a lost wake-up only delays the answer to the next
        look (a lapse, a member's start)."""
        if accepted.here and self._taker is not None and not self._fenced:
            self._taker.take(message, resume=False)
            return
        # Taken but fenced meanwhile: it is handed back with the rest (`_renewing`).
        self._wake.set()
        try:
            await self._wakeups.notify(INBOUND, message.session_key)
        except Exception:  # noqa: BLE001 - the next look (a lapse, a member's start) finds it
            logger.opt(exception=True).warning("could not wake the cluster for a message")

    async def run(self, taker: Taker) -> None:
        """Take work for `taker` until cancelled; then stop taking (the leases are kept
        until `leave`: the turns taken may still be running)."""
        self._taker = taker
        self._tasks.spawn(self._renewing(), name="session-leases")
        try:
            while True:
                try:
                    await self._wait()
                    if self._fenced:  # its turns were dropped: it takes work once unfenced
                        continue
                    await self._round()
                except StoreError as exc:
                    self._looking.failed(exc)
                    await self._looking.wait()
                    self._orphans_due = True
                    self._wake.set()
                else:
                    self._looking.recovered()
        finally:
            await self._tasks.close()
            self._taker = None  # stopping: what comes in now waits for the cluster

    async def leave(self) -> None:
        """Give up this member's sessions (its turns have ended) and wake the others to take
        what waits. Never raises: if the store is away, the leases lapse by themselves."""
        try:
            await self._claims.release()
            await self._wakeups.notify(INBOUND, "")
        except Exception as exc:  # noqa: BLE001 - they lapse within the lease anyway
            logger.warning("could not give up this member's sessions: {}", exc)

    async def _wait(self) -> None:
        """Until woken, or until another member may have died leaving work behind: a lease
        it holds lapses while its session has pending messages, or its membership expires
        while it has replies to send. Those moments are read at most every
        FULL_LOOK (a busy member waits between most rounds; reading them each time cost
        more than the rounds): one read a moment ago is used until then, and read again
        then if it is still waiting. A moment read earlier is never later than the true
        one (leases and memberships are only ever extended), so none is missed."""
        if self._wake.is_set():
            self._wake.clear()
            return
        age = time.monotonic() - self._watched_at
        if age >= FULL_LOOK:
            self._watched = await self._watched_moments()
            self._watched_at, age = time.monotonic(), 0.0
        lapse = None
        if self._watched is not None:
            lapse = max(0.0, (self._watched - self._now()).total_seconds()) + LAPSE_MARGIN
        timeout = lapse
        if age > 0:  # read before: read again once it may be out of date
            timeout = min(FULL_LOOK - age, lapse if lapse is not None else FULL_LOOK)
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            if timeout == lapse:
                self._orphans_due = True  # a lease or a membership lapsed: look
                self._watched_at = -FULL_LOOK  # and read the moments afresh
        self._wake.clear()

    async def _watched_moments(self) -> datetime | None:
        """The earliest moment another member may turn out dead with work left behind."""
        moments = [await self._claims.next_lapse(self._now()), await self._claims.next_expiry()]
        return min((moment for moment in moments if moment is not None), default=None)

    async def _round(self) -> None:
        # Messages other members claimed become takeable only when one died or left: look
        # for them then, and at least every FULL_LOOK while busy (a lapse goes unseen by a
        # member that is never idle long enough to wait for it).
        now = time.monotonic()
        full = self._orphans_due or now - self._full_look >= FULL_LOOK
        if full:
            self._full_look = now
        if self._orphans_due:
            self._orphans_due = False
            await self._orphaned_replies()
        while True:
            candidates = await self._claims.candidates(self._now(), LOOK, claimed=full)
            if not candidates or await self._take(candidates) < BATCH:
                return  # all it could take of what it saw (other members hold the rest)

    async def _take(self, candidates: list[Candidate]) -> int:
        """Take up to BATCH of the candidates' sessions; returns how many it took."""
        sessions: dict[str, list[Candidate]] = {}
        for candidate in candidates:
            message = inbound_from(candidate.message, candidate.id)
            if candidate.channel not in self._channels and (
                message.route.deliver or message.source == "chat"
            ):
                continue  # for a member that runs its channel
            sessions.setdefault(candidate.session_key or message.session_key, []).append(candidate)
        order = list(sessions)
        random.shuffle(order)  # members racing for a burst take different sessions first
        held: set[str] = set()
        while order and len(held) < BATCH:  # some may be another's by now: try the next
            tried, order = order[: BATCH - len(held)], order[BATCH - len(held) :]
            held |= await self._claims.hold_all(tried, self._now(), self._lease)
        ids = [c.id for key in held for c in sessions[key]]
        assert self._taker is not None
        for row in await self._claims.claim(ids):  # oldest first: each session in order
            message = inbound_from(row.message, row.id)
            if row.reached:
                logger.info("taking over session {}: resuming its turn", message.session_key)
                if self._taken_over is not None:
                    await self._taken_over(message.session_key)
            self._taker.take(message, resume=row.reached)
        return len(held)

    async def _orphaned_replies(self) -> None:
        now = self._now()
        alive = [m.id for m in await self._members.all() if not m.stale(now)]
        for item in await self._claims.orphaned_replies(alive):
            if item.channel in self._channels:
                logger.info("sending reply {} that a stopped member left unsent", item.id)
                await self._bus.publish(outbound_from(item.message, item.id, item.parts_sent))

    async def _renewing(self) -> None:
        """Renew this member's session leases every third of the lease. Unable to for so
        long that they would lapse before the next try, it drops its turns first, so that a
        session never runs on two members at once; once the store answers again, it gives
        the lapsed sessions up and takes work afresh."""
        period = renewal(self._lease)
        last_renewal = time.monotonic()
        while True:
            await asyncio.sleep(period)
            try:
                if self._fenced:
                    await self._claims.unclaim()
                    await self._claims.release()
                    self._fenced = False
                    logger.info("the store answers again: taking work afresh")
                    self._wake.set()
                await self._claims.renew(self._now(), self._lease)
            except StoreError as exc:
                late = time.monotonic() - last_renewal
                if not self._fenced and late + period >= self._lease.total_seconds():
                    self._fenced = True
                    assert self._taker is not None
                    self._taker.drop_all()
                    logger.error(
                        "could not renew this member's session leases for {:.0f}s ({}): its "
                        "turns are stopped before the leases lapse; other members resume them",
                        late,
                        exc,
                    )
                else:
                    self._renewals.failed(exc, retry_in=period)
            else:
                last_renewal = time.monotonic()
                self._renewals.recovered()
