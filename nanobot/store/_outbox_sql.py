"""The statements that queue replies in the outbox and keep cron runs in step with them.

A reply is queued only where the messages it answers are still this member's to answer
(pending, claimed by no other member), and the run a reply answers follows its delivery in
the same transactions (`nanobot.store.journal`).
"""

from __future__ import annotations

from collections.abc import Sequence

from nanobot.store.database import Statement

INSERT_OUTBOX = "INSERT INTO outbox (channel, message, created_at, cron_run, claimed_by)"
# A message is this member's to mark answered while no other member has claimed it.
OURS = "(claimed_by IS NULL OR claimed_by = ?)"
DONE = (
    f"UPDATE inbound SET state = 'done', done_at = ? WHERE id = ? AND state = 'pending' AND {OURS}"
)

# A cron run's delivery: NULL (nothing to deliver), then pending, then delivered or failed.
# A run has one reply in practice; with more, it is delivered when all of them are, and
# failed when one is. A failure is final: a later reply of the run does not undo it.
RUN_PENDING = (
    "UPDATE cron_runs SET delivery = 'pending'"
    " WHERE id = ? AND (delivery IS NULL OR delivery = 'delivered')"
)
RUN_DELIVERED = (
    "UPDATE cron_runs SET delivery = 'delivered' WHERE delivery = 'pending'"
    " AND id = (SELECT cron_run FROM outbox WHERE id = ?)"
    " AND NOT EXISTS (SELECT 1 FROM outbox WHERE cron_run = cron_runs.id AND state = 'pending')"
)
# Only when the reply is failed now: a give-up of a reply already delivered changes nothing.
RUN_FAILED = (
    "UPDATE cron_runs SET delivery = 'failed', delivery_error = ? WHERE delivery = 'pending'"
    " AND id = (SELECT cron_run FROM outbox WHERE id = ? AND state = 'failed')"
)


def queue(
    channel: str,
    message: str,
    now: str,
    cron_run: int | None = None,
    member: str | None = None,
) -> Statement:
    """The outbox insert of `message` (encoded), returning its id."""
    return (
        f"{INSERT_OUTBOX} VALUES (?, ?, ?, ?, ?) RETURNING id",
        (channel, message, now, cron_run, member),
    )


def queue_if_ours(queued: Statement, member: str | None, inbound_ids: Sequence[int]) -> Statement:
    """The outbox insert `queued` (`queue`), made only where one of `inbound_ids` (if any)
    is still this member's to answer."""
    if not inbound_ids:
        return queued
    marks = ",".join("?" * len(inbound_ids))
    return (
        f"{INSERT_OUTBOX} SELECT ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM inbound"
        f" WHERE id IN ({marks}) AND state = 'pending' AND {OURS}) RETURNING id",
        (*queued[1], *inbound_ids, member),
    )
