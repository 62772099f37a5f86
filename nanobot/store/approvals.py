"""Approvals, durably: requests for a person's decision, the saved rules ("always allow"),
the chat-scope grants (until `/new`) and the log of every decision.

A request is a row from the moment it is asked until long after: the first answer wins by a
compare-and-set (one `UPDATE … WHERE state = 'pending' … RETURNING`), so a double click or two
approvers produce exactly one decision, across processes too; every later answer is told the
decision that stands. An answer is checked against the row, never trusted: an unknown id, an
answer from a chat the request was not asked in, from someone who is not one of its deciders,
for a request that expired or whose arguments changed, or for a scope it did not offer, changes
nothing and says which. A rule or grant is made only by such an answer, in its transaction,
bound to the request's rule key: nothing else adds one, so "always" can be refused once and for
all by leaving it out of a request's scopes (the policy does, for inline code).

A rule belongs to whose turn it was saved in, and where: a request from someone's private turn
(`owner`) saves a rule for that person's private turns on that channel; one from a group saves
it for that group's session (only an approver can decide there). It keeps the request's
`fingerprint` (the code the call would run, `nanobot.agent.code_pins`): `match` returns it,
and the caller decides whether it still holds.

Times are UTC ISO 8601 strings of fixed width, so they compare as text.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, cast, get_args

from nanobot.errors import StoreError
from nanobot.store._approval_rules import ID_ATTEMPTS, RulesAndLog
from nanobot.store._times import to_text, wall_clock
from nanobot.store.approval_records import (
    ASKER_GONE,
    ID_ALPHABET,
    ID_LENGTH,
    RESTARTED,
    SCOPES,
    TIMED_OUT,
    ApprovalRequest,
    Decision,
    Grant,
    LogEntry,
    LogOutcome,
    NewRequest,
    Outcome,
    Place,
    SavedRule,
    Scope,
    State,
    Turn,
    Verdict,
    request_of,
)
from nanobot.store.claims import SESSIONS
from nanobot.store.database import Database, Row, SqlValue

__all__ = [
    "ASKER_GONE",
    "ID_ALPHABET",
    "ID_LENGTH",
    "RESTARTED",
    "TIMED_OUT",
    "ApprovalRequest",
    "ApprovalStore",
    "Decision",
    "Grant",
    "LogEntry",
    "LogOutcome",
    "NewRequest",
    "Outcome",
    "Place",
    "SavedRule",
    "Scope",
    "State",
    "Turn",
    "Verdict",
]

_VERDICTS: Final = frozenset(get_args(Verdict))


class ApprovalStore(RulesAndLog):
    """Requests, rules, chat grants and the decision log (the last three: `RulesAndLog`).
    All methods are short transactions and safe to call from several processes at once."""

    def __init__(self, db: Database, clock: Callable[[], datetime] | None = None) -> None:
        """`clock` gives the current time (creation, expiry, decisions); the wall clock by
        default."""
        super().__init__(db, clock or wall_clock)

    # -- requests ----------------------------------------------------------------------------

    async def create(self, new: NewRequest, *, expires_in: timedelta) -> ApprovalRequest:
        """Store a pending request that expires `expires_in` from now, with a fresh id."""
        if not new.places or not new.deciders:
            raise ValueError("a request needs a chat to be asked in and someone to decide it")
        if len({place.channel for place in new.places}) != 1:
            raise ValueError("a request is asked on one channel")
        if not set(new.scopes) <= SCOPES:
            raise ValueError(f"unknown scopes {new.scopes!r}")
        now = self._clock()
        async with self._db.transaction():
            for _ in range(ID_ATTEMPTS):
                request_id = "".join(secrets.choice(ID_ALPHABET) for _ in range(ID_LENGTH))
                row = await self._db.fetchone(
                    "INSERT INTO approval_requests (id, session_key, run_id, tool_call_id, tool,"
                    " arguments, args_hash, rule_key, scopes, reason, deciders, created_at,"
                    " expires_at, owner, fingerprint)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (id) DO NOTHING RETURNING *",
                    (
                        request_id,
                        new.session_key,
                        new.run_id,
                        new.tool_call_id,
                        new.tool,
                        new.arguments,
                        new.args_hash,
                        new.rule_key,
                        " ".join(new.scopes),
                        new.reason,
                        json.dumps(list(new.deciders)),
                        to_text(now),
                        to_text(now + expires_in),
                        new.owner or "",
                        new.fingerprint,
                    ),
                )
                if row is not None:
                    for place in new.places:
                        await self._db.execute(
                            "INSERT INTO approval_places (request_id, channel, chat_id, message_id)"
                            " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                            (request_id, place.channel, place.chat_id, place.message_id),
                        )
                    return request_of(row, _dedupe(new.places))
        raise StoreError(f"{self._db.name}: could not find a free approval request id")

    async def get(self, request_id: str) -> ApprovalRequest | None:
        row = await self._db.fetchone(
            "SELECT * FROM approval_requests WHERE id = ?", (_clean_id(request_id),)
        )
        return None if row is None else (await self._with_places([row]))[0]

    async def card_sent(self, request_id: str, place: Place, message_id: str) -> bool:
        """Remember the message that shows the request's card in `place`, to edit it later.
        False if the request was not asked there."""
        changed = await self._db.execute(
            "UPDATE approval_places SET message_id = ?"
            " WHERE request_id = ? AND channel = ? AND chat_id = ?",
            (message_id, request_id, place.channel, place.chat_id),
        )
        return changed > 0

    async def decide(
        self,
        request_id: str,
        verdict: Verdict,
        *,
        by: str,
        channel: str,
        chat_id: str,
        args_hash: str | None = None,
        by_name: str | None = None,
    ) -> Decision:
        """Answer a request: `by` (a platform user id, going by `by_name` where known) in
        `channel`/`chat_id`. When
        `args_hash` is given it must be the request's (the card's arguments are the ones
        that will run).

        The first answer that passes every check wins (`outcome` "decided"); with "chat" it
        also grants the request's rule key to its session, with "always" it saves a rule for
        it, in the same transaction. Otherwise nothing changes (except that a request found
        past its expiry is marked expired) and `outcome` says why.
        """
        if verdict not in _VERDICTS:
            raise ValueError(f"unknown verdict {verdict!r}")
        answer = _Answer(_clean_id(request_id), verdict, by, channel, chat_id, args_hash)
        moment = self._clock()
        now = to_text(moment)
        state, scope = ("denied", None) if verdict == "deny" else ("approved", verdict)
        # Every check of `_refused_because`, made by the compare-and-set itself.
        checks = [
            "id = ? AND state = 'pending' AND expires_at > ?",
            "EXISTS (SELECT 1 FROM approval_places AS p WHERE"
            " p.request_id = approval_requests.id AND p.channel = ? AND p.chat_id = ?)",
            f"EXISTS (SELECT 1 FROM {self._db.dialect.json_elements('deciders')} WHERE value = ?)",
        ]
        params: list[SqlValue] = [answer.request_id, now, channel, chat_id, by]
        if args_hash is not None:
            checks.append("args_hash = ?")
            params.append(args_hash)
        if scope is not None:
            checks.append("(' ' || scopes || ' ') LIKE ('% ' || ? || ' %')")
            params.append(scope)
        async with self._db.transaction():
            row = await self._db.fetchone(
                "UPDATE approval_requests SET state = ?, scope = ?, decided_by = ?,"
                f" decided_name = ?, decided_at = ? WHERE {' AND '.join(checks)} RETURNING *",
                (state, scope, by, by_name, now, *params),
            )
            if row is None:
                return await self._refusal(answer, moment)
            request = (await self._with_places([row]))[0]
            if scope == "chat":
                asked = request.asked
                # A grant made again pins the code as it is now.
                await self._db.execute(
                    "INSERT INTO approval_grants (session_key, tool, rule_key, created_at,"
                    " created_by, request_id, fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (session_key, tool, rule_key) DO UPDATE SET"
                    " fingerprint = excluded.fingerprint, created_at = excluded.created_at,"
                    " created_by = excluded.created_by, request_id = excluded.request_id",
                    (
                        asked.session_key,
                        asked.tool,
                        asked.rule_key,
                        now,
                        by,
                        request.id,
                        asked.fingerprint,
                    ),
                )
            elif scope == "always":
                await self._save_rule(request, by, now)
            await self._log(request, "approved" if scope else "denied", now)
        return Decision("decided", request)

    async def expire(self, request_id: str, note: str = TIMED_OUT) -> Decision:
        """Mark a pending request expired (its time is up); "decided" if this did it, else
        the decision that stands ("already_decided") or "unknown"."""
        return await self._close(request_id, "expired", note)

    async def cancel(self, request_id: str, note: str) -> Decision:
        """Mark a pending request cancelled (`note` says why: its run was stopped, …)."""
        return await self._close(request_id, "cancelled", note)

    async def cancel_run(self, run_id: str, note: str) -> list[ApprovalRequest]:
        """Cancel every pending request of a run; returns them, to edit their cards."""
        return await self._close_where("cancelled", note, "run_id = ?", (run_id,))

    async def expire_pending(
        self, note: str = RESTARTED, *, spare_held: bool = False, session_key: str | None = None
    ) -> list[ApprovalRequest]:
        """At start-up: mark pending requests expired (their runs are gone with the process
        that asked) and return them, with their cards, to edit those and tell the turns.

        Alone, every pending request. In a cluster (`spare_held`), only those whose session
        no member holds a live lease on: the others' runs still wait in live members. With
        `session_key`, only that session's: a member that took it over from a dead one."""
        if session_key is not None:
            return await self._close_where("expired", note, "session_key = ?", (session_key,))
        if not spare_held:
            return await self._close_where("expired", note, "1 = 1", ())
        return await self._close_where(
            "expired",
            note,
            "NOT EXISTS (SELECT 1 FROM leases l WHERE l.name ="
            f" '{SESSIONS}' || approval_requests.session_key AND l.expires_at > ?)",
            (to_text(self._clock()),),
        )

    async def pending(self, session_key: str | None = None) -> list[ApprovalRequest]:
        """Unexpired pending requests (only `session_key`'s when given), oldest first."""
        rows = await self._db.fetchall(
            "SELECT * FROM approval_requests WHERE state = 'pending' AND expires_at > ?"
            f"{'' if session_key is None else ' AND session_key = ?'} ORDER BY created_at, id",
            (to_text(self._clock()), *(() if session_key is None else (session_key,))),
        )
        return await self._with_places(rows)

    # -- internals ---------------------------------------------------------------------------

    async def _refusal(self, answer: _Answer, now: datetime) -> Decision:
        """Why an answer did not win at `now`; runs inside `decide`'s transaction."""
        request = await self.get(answer.request_id)
        if request is None:
            return Decision("unknown")
        outcome = _refused_because(request, answer, now)
        if outcome in {"other_chat", "not_approver"}:
            return Decision(outcome)
        if outcome == "expired":
            expired = await self._close(request.id, "expired", TIMED_OUT)
            return Decision("expired", expired.request or request)
        return Decision(outcome, request)

    async def _close(self, request_id: str, state: State, note: str) -> Decision:
        request_id = _clean_id(request_id)
        async with self._db.transaction():
            closed = await self._close_where(state, note, "id = ?", (request_id,))
            if closed:
                return Decision("decided", closed[0])
            request = await self.get(request_id)
        return Decision("unknown" if request is None else "already_decided", request)

    async def _close_where(
        self, state: State, note: str, where: str, params: Sequence[SqlValue]
    ) -> list[ApprovalRequest]:
        now = to_text(self._clock())
        async with self._db.transaction():
            rows = await self._db.fetchall(
                "UPDATE approval_requests SET state = ?, decided_at = ?, note = ?"
                f" WHERE state = 'pending' AND {where} RETURNING *",
                (state, now, note, *params),
            )
            requests = await self._with_places(rows)
            for request in requests:
                await self._log(request, cast(LogOutcome, state), now)
        return requests

    async def _with_places(self, rows: Sequence[Row]) -> list[ApprovalRequest]:
        if not rows:
            return []
        ids = [row["id"] for row in rows]
        marks = ", ".join("?" * len(ids))
        places: dict[str, list[Place]] = {request_id: [] for request_id in ids}
        for place in await self._db.fetchall(
            f"SELECT * FROM approval_places WHERE request_id IN ({marks}) ORDER BY rowid", ids
        ):
            places[place["request_id"]].append(
                Place(place["channel"], place["chat_id"], place["message_id"])
            )
        return [request_of(row, tuple(places[row["id"]])) for row in rows]


@dataclass(frozen=True, slots=True)
class _Answer:
    request_id: str
    verdict: Verdict
    by: str
    channel: str
    chat_id: str
    args_hash: str | None


def _refused_because(request: ApprovalRequest, answer: _Answer, now: datetime) -> Outcome:
    """The first check `answer` fails, in the order an answer is told about them: one not
    asked in that chat, or not from a decider, learns nothing about the request."""
    asked = request.asked
    places = {(place.channel, place.chat_id) for place in asked.places}
    checks: tuple[tuple[bool, Outcome], ...] = (
        ((answer.channel, answer.chat_id) not in places, "other_chat"),
        (answer.by not in asked.deciders, "not_approver"),
        (request.state != "pending", "already_decided"),
        (request.expires_at <= now, "expired"),
        (answer.args_hash not in {None, asked.args_hash}, "changed"),
        (answer.verdict != "deny" and answer.verdict not in asked.scopes, "not_offered"),
    )
    failed = next((outcome for failing, outcome in checks if failing), None)
    if failed is None:
        raise StoreError(f"approval request {request.id}: an answer passed every check yet lost")
    return failed


def _dedupe(places: tuple[Place, ...]) -> tuple[Place, ...]:
    seen: dict[tuple[str, str], Place] = {}
    for place in places:
        seen.setdefault((place.channel, place.chat_id), place)
    return tuple(seen.values())


def _clean_id(request_id: str) -> str:
    """Ids as people type them (`/approve k7qx…`): case and surrounding blanks do not count."""
    return request_id.strip().upper()
