"""The inbound journal and the outbox: what makes delivery durable.

An accepted user message is written here before its channel acknowledges it, keyed by
(channel, platform message id) so a redelivery is recognised. It stays `pending` until its
turn has produced a reply; the reply goes into the outbox in the same transaction, and stays
`pending` there until the platform confirms it (`delivered`) or refuses it for good
(`failed`, with the reason). After a crash, what is pending is exactly what is owed.

A reply that answers a cron run names the run (`cron_run`), and the run's record follows
the reply in the same transactions: `pending` once it is queued, `delivered` once the
platform has all of it, `failed` with the reason once a part is refused or the reply is
given up. So the run's record never says more than the outbox knows, whichever process
delivers it and however many restarts lie between.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from nanobot.store._outbox_sql import (
    DONE,
    INSERT_OUTBOX,
    OURS,
    RUN_DELIVERED,
    RUN_FAILED,
    RUN_PENDING,
    queue,
    queue_if_ours,
)
from nanobot.store._times import from_text, now_text, to_text
from nanobot.store._together import write_one
from nanobot.store.database import Database, SqlValue, Statement

Record = dict[str, Any]

# An answer handed in to be written with others: the messages it answers, and the reply's
# channel, encoded record, moment and sending member.
_Answer = tuple[tuple[int, ...], str, str, str, str | None]


@dataclass(frozen=True, slots=True)
class PendingInbound:
    id: int
    channel: str
    message: Record


@dataclass(frozen=True, slots=True)
class Accepted:
    """An inbound message newly journaled: its row, and whether this process answers it
    (always, alone; in a cluster, when it took the message's session as it journaled it)."""

    id: int
    here: bool = True


@dataclass(frozen=True, slots=True)
class FailedReplies:
    """Replies the platforms refused for good, kept as long as delivered ones (`prune`):
    how many, and the latest one's reason and moment (None when there are none)."""

    count: int
    last_reason: str | None = None
    last_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class PendingOutbox:
    id: int
    channel: str
    message: Record
    attempts: int
    parts_sent: int = 0  # leading parts of the reply already on the platform


class Journal:
    """Inbound journal and outbox over the state database. All methods are short writes."""

    def __init__(self, db: Database, *, member: str | None = None) -> None:
        """`member`: in a cluster, this process's member id: the replies it queues are its
        own to send (another member takes them if it dies; `store.claims`)."""
        self._db = db
        self._member = member
        # Many turns' answers, and many replies' confirmations, at once in one statement
        # each (PostgreSQL).
        self._answers = db.together("answers", self._answer_each)
        self._confirms = db.together("confirmations", self._confirm_each)

    async def accept(
        self, channel: str, message_id: str, message: Record, session_key: str | None = None
    ) -> int | None:
        """Journal an inbound message for session `session_key`; its row id, or None if it
        was journaled before."""
        row = await self._db.fetchone(
            ACCEPT.format(claimed_by="NULL"),
            (channel, message_id, encode(message), now_text(), session_key),
        )
        return None if row is None else int(row["id"])

    async def complete(
        self,
        inbound_ids: Sequence[int],
        reply: tuple[str, Record] | None,
        *,
        cron_run: int | None = None,
    ) -> int | None:
        """Mark inbound messages answered and queue their reply, atomically, when they are
        still this member's to answer: pending, and claimed by no other member.

        `reply` is (channel, message record); returns its outbox id. None without a reply,
        and None when none of the messages was this member's any more (answered already, or
        claimed by a member that took the session over while this one had lost touch with
        the store): then nothing is written, and the reply is not sent. `cron_run`: the
        cron run the reply answers, whose delivery is now pending.
        """
        now = now_text()
        if reply is not None and cron_run is None and self._db.dialect.name == "postgresql":
            return await self._answer(inbound_ids, reply, now)
        statements: list[Statement] = []
        if reply is not None:
            # First, so that it sees the messages as they were (SQLite runs one writer).
            queued = queue(reply[0], encode(reply[1]), now, cron_run, self._member)
            statements.append(queue_if_ours(queued, self._member, inbound_ids))
            if cron_run is not None:
                statements.append((RUN_PENDING, (cron_run,)))
        statements += [(DONE, (now, inbound_id, self._member)) for inbound_id in inbound_ids]
        rows = await self._db.atomic(statements)
        if reply is None or not rows[0]:
            return None
        return int(rows[0][0]["id"])

    async def _answer(
        self, inbound_ids: Sequence[int], reply: tuple[str, Record], now: str
    ) -> int | None:
        """`complete`'s usual case on PostgreSQL, in one statement (each one is a round
        trip there), shared with other turns' answers where it may be."""
        answer = (tuple(inbound_ids), reply[0], encode(reply[1]), now, self._member)
        return await write_one(self._answers, self._answer_each, answer)

    async def _answer_each(self, answers: Sequence[_Answer]) -> list[int | None]:
        """Replies queued, and the messages they answer marked answered, by a
        data-modifying WITH: the same statement, so the same transaction. A reply is queued
        only where this statement marked its first message (see `complete`; a turn's
        messages are claimed together, so its first stands for them): the UPDATE's
        condition is checked again on a row another member changes meanwhile, so of two
        members answering one message, one queues. Their outbox ids, in order (None for
        one not queued)."""
        done = [i for ids, *_ in answers for i in ids]
        marks = ",".join("?" * len(done)) or "NULL"
        values = ", ".join(["(?::integer, ?::bigint, ?, ?, ?, ?)"] * len(answers))
        params: list[SqlValue] = [answers[0][3], *done, answers[0][4]]
        for n, (ids, channel, message, at, member) in enumerate(answers):
            params += [n, ids[0] if ids else None, channel, message, at, member]
        rows = await self._db.fetchall(
            f"WITH done AS (UPDATE inbound SET state = 'done', done_at = ? WHERE id IN ({marks})"
            f" AND state = 'pending' AND {OURS} RETURNING id),"
            f" v (n, first, channel, message, created_at, claimed_by) AS (VALUES {values}),"
            f" queued AS ({INSERT_OUTBOX}"
            " SELECT channel, message, created_at, NULL, claimed_by FROM v"
            " WHERE v.first IS NULL OR v.first IN (SELECT id FROM done) ORDER BY n RETURNING id)"
            " SELECT id, NULL AS refused FROM queued UNION ALL SELECT NULL, n FROM v"
            " WHERE v.first IS NOT NULL AND v.first NOT IN (SELECT id FROM done)",
            params,
        )
        refused = {int(r["refused"]) for r in rows if r["refused"] is not None}
        # Inserted in the answers' order, so their ids ascend in it.
        queued = iter(sorted(int(r["id"]) for r in rows if r["id"] is not None))
        return [None if n in refused else next(queued) for n in range(len(answers))]

    async def enqueue(self, channel: str, message: Record) -> int:
        """Put a message in the outbox; returns its id."""
        row = await self._db.fetchone(
            *queue(channel, encode(message), now_text(), member=self._member)
        )
        assert row is not None
        return int(row["id"])

    async def pending_inbound(self) -> list[PendingInbound]:
        rows = await self._db.fetchall(
            "SELECT id, channel, message FROM inbound WHERE state = 'pending' ORDER BY id"
        )
        return [PendingInbound(r["id"], r["channel"], json.loads(r["message"])) for r in rows]

    async def last_seen(self, channel: str, within: timedelta) -> dict[str, str]:
        """Per chat of `channel`, the newest platform message id journaled in the last
        `within` (chat id → message id). Only numeric ids count (the platform's own, not
        presses'), compared as numbers."""
        sql = self._db.dialect
        rows = await self._db.fetchall(
            f"SELECT {sql.json_text('message', 'chat', 'chat_id')} AS chat,"
            f" MAX({sql.number('message_id')}) AS newest FROM inbound"
            f" WHERE channel = ? AND received_at >= ? AND {sql.digits('message_id')}"
            " GROUP BY chat",
            (channel, to_text(datetime.now(UTC) - within)),
        )
        return {str(r["chat"]): str(r["newest"]) for r in rows if r["chat"] is not None}

    async def caught_up(self, channel: str, moment: datetime) -> None:
        """Record that `channel` has had everything its platform sent before `moment`. The
        record only moves forward: an earlier `moment` than the one kept changes nothing."""
        await self._db.write(
            "INSERT INTO channel_state (channel, caught_up_until) VALUES (?, ?)"
            " ON CONFLICT (channel) DO UPDATE SET caught_up_until = excluded.caught_up_until"
            " WHERE channel_state.caught_up_until < excluded.caught_up_until",
            (channel, to_text(moment)),
        )

    async def caught_up_until(self, channel: str) -> datetime | None:
        """The latest moment `caught_up` recorded for `channel`; None if it never did."""
        row = await self._db.fetchone(
            "SELECT caught_up_until FROM channel_state WHERE channel = ?", (channel,)
        )
        return None if row is None else from_text(str(row["caught_up_until"]))

    async def reached_session(self, inbound_ids: Sequence[int]) -> set[int]:
        """Which of `inbound_ids` already have their user message stored in a session."""
        if not inbound_ids:
            return set()
        marks = ",".join("?" * len(inbound_ids))
        rows = await self._db.fetchall(
            f"SELECT DISTINCT inbound_id FROM entries WHERE inbound_id IN ({marks})",
            tuple(inbound_ids),
        )
        return {int(r[0]) for r in rows}

    async def pending_outbox(self) -> list[PendingOutbox]:
        rows = await self._db.fetchall(
            "SELECT id, channel, message, attempts, parts_sent FROM outbox"
            " WHERE state = 'pending' ORDER BY id"
        )
        return [
            PendingOutbox(
                r["id"], r["channel"], json.loads(r["message"]), r["attempts"], r["parts_sent"]
            )
            for r in rows
        ]

    async def progress(self, outbox_id: int, parts: int) -> None:
        """Record that the first `parts` parts of a long reply are on the platform."""
        await self._db.write(
            "UPDATE outbox SET parts_sent = ? WHERE id = ? AND state = 'pending'",
            (parts, outbox_id),
        )

    async def confirm(self, outbox_id: int, sent_id: str | None = None) -> None:
        """Record that the whole reply is on the platform (as message `sent_id`, where the
        channel says which), and on its cron run once none of the run's replies is pending."""
        cron_run = await write_one(self._confirms, self._confirm_each, (outbox_id, sent_id))
        # Most replies answer no cron run: one statement for them (on PostgreSQL each one is
        # a round trip). Should the process die between the two, the run stays `pending`,
        # never `delivered` too early.
        if cron_run is not None:
            await self._db.write(RUN_DELIVERED, (outbox_id,))

    async def _confirm_each(self, confirmed: Sequence[tuple[int, str | None]]) -> list[int | None]:
        """Replies marked delivered in one statement; the cron run each answers, if any."""
        if len(confirmed) == 1:
            [(outbox_id, sent_id)] = confirmed
            row = await self._db.fetchone(
                "UPDATE outbox SET state = 'delivered', delivered_at = ?, sent_id = ?"
                " WHERE id = ? RETURNING cron_run",
                (now_text(), sent_id, outbox_id),
            )
            return [None if row is None else row["cron_run"]]
        values = ", ".join(["(CAST(? AS BIGINT), CAST(? AS TEXT))"] * len(confirmed))
        rows = await self._db.fetchall(
            f"WITH sent (id, sent_id) AS (VALUES {values}) UPDATE outbox"
            " SET state = 'delivered', delivered_at = ?, sent_id = sent.sent_id FROM sent"
            " WHERE outbox.id = sent.id RETURNING outbox.id, outbox.cron_run",
            (*(v for item in confirmed for v in item), now_text()),
        )
        runs = {int(row["id"]): row["cron_run"] for row in rows}
        return [runs.get(outbox_id) for outbox_id, _ in confirmed]

    async def sent_id(self, outbox_id: int) -> str | None:
        """The platform's id of the message that delivered outbox row `outbox_id`; None
        while it is not delivered, or when its channel did not say."""
        row = await self._db.fetchone("SELECT sent_id FROM outbox WHERE id = ?", (outbox_id,))
        return None if row is None or row["sent_id"] is None else str(row["sent_id"])

    async def fail(self, outbox_id: int, error: str) -> None:
        """Record a failed delivery attempt; the message stays pending for a later retry."""
        await self._db.execute(
            "UPDATE outbox SET attempts = attempts + 1, last_error = ? WHERE id = ?",
            (error[:500], outbox_id),
        )

    async def give_up(self, outbox_id: int, reason: str) -> None:
        """Mark a pending reply failed for good (the platform refused it): it is never sent
        again, and its cron run, if it answers one, is not delivered, for `reason`. A reply
        already delivered or failed is left as it is."""
        await self._db.atomic(
            [
                (
                    "UPDATE outbox SET state = 'failed', attempts = attempts + 1,"
                    " last_error = ?, failed_at = ? WHERE id = ? AND state = 'pending'",
                    (reason[:500], now_text(), outbox_id),
                ),
                (RUN_FAILED, (reason[:500], outbox_id)),
            ]
        )

    async def failed_replies(self) -> FailedReplies:
        """How many replies failed for good, and the latest one's reason (for `status`)."""
        count = await self._db.fetchone("SELECT count(*) FROM outbox WHERE state = 'failed'")
        last = await self._db.fetchone(
            "SELECT last_error, failed_at FROM outbox WHERE state = 'failed'"
            " ORDER BY failed_at DESC, id DESC LIMIT 1"
        )
        if count is None or last is None:
            return FailedReplies(0)
        at = datetime.fromisoformat(last["failed_at"]) if last["failed_at"] else None
        return FailedReplies(int(count[0]), last["last_error"], at)

    async def stream_started(self, stream_id: str, message_id: int) -> None:
        """Record the platform message that shows stream `stream_id` while it is written."""
        await self._db.write(
            "INSERT INTO streams (stream_id, message_id, created_at) VALUES (?, ?, ?)"
            " ON CONFLICT (stream_id) DO UPDATE SET message_id = excluded.message_id",
            (stream_id, message_id, now_text()),
        )

    async def stream_finished(self, stream_id: str) -> None:
        """Forget stream `stream_id`: its final text is out."""
        await self._db.write("DELETE FROM streams WHERE stream_id = ?", (stream_id,))

    async def open_streams(self) -> dict[str, int]:
        """Streams whose message is on the platform and whose final text is not: stream id
        to platform message id."""
        rows = await self._db.fetchall("SELECT stream_id, message_id FROM streams")
        return {str(r["stream_id"]): int(r["message_id"]) for r in rows}

    async def prune(self, older_than: timedelta) -> int:
        """Forget finished rows older than `older_than` (the dedupe window); returns how many."""
        cutoff = to_text(datetime.now(UTC) - older_than)
        async with self._db.transaction():
            inbound = await self._db.execute(
                "DELETE FROM inbound WHERE state = 'done' AND received_at < ?", (cutoff,)
            )
            outbox = await self._db.execute(
                "DELETE FROM outbox WHERE state IN ('delivered', 'failed') AND created_at < ?",
                (cutoff,),
            )
            # A stream whose reply never came (its turn was lost) leaves a message behind.
            streams = await self._db.execute("DELETE FROM streams WHERE created_at < ?", (cutoff,))
        return inbound + outbox + streams


# An inbound message journaled, unless its (channel, platform id) was; `claimed_by`: the
# member answering it, as SQL (in a cluster, `Claims.accept`).
ACCEPT = (
    "INSERT INTO inbound (channel, message_id, message, received_at, session_key, claimed_by)"
    " VALUES (?, ?, ?, ?, ?, {claimed_by}) ON CONFLICT (channel, message_id) DO NOTHING"
    " RETURNING id, claimed_by"
)


def encode(record: Record) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))
