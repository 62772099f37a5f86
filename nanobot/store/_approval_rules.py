"""The saved rules ("always allow"), the chat-scope grants (until `/new`) and the decision
log: the part of `ApprovalStore` that outlives a request (see `store.approvals`, whose
requests' decisions make the rules and grants, in their transactions).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Final, Literal, cast

from nanobot.errors import StoreError
from nanobot.store._times import to_text
from nanobot.store.approval_records import (
    ApprovalRequest,
    Grant,
    LogEntry,
    LogOutcome,
    SavedRule,
    Turn,
    entry_of,
    rule_of,
)
from nanobot.store.database import Database

ID_ATTEMPTS: Final = 5
"""Tries at a random id that is free (a request's, a rule's) before giving up."""


class RulesAndLog:
    """Grants, saved rules and the log over `db`, with `clock` for the moments written."""

    def __init__(self, db: Database, clock: Callable[[], datetime]) -> None:
        self._db = db
        self._clock = clock

    # -- rules and grants --------------------------------------------------------------------

    async def match(self, tool: str, rule_key: str, turn: Turn) -> list[Grant]:
        """The grants that may let this call in `turn` run without a card, this chat's first:
        its session's chat grant, a rule for its person's private turns on its channel, a
        rule for its session (a group's). Empty if none; whether their fingerprints still
        hold is the caller's to check."""
        rows = await self._db.fetchall(
            "SELECT 0 AS rank, 'chat' AS scope, NULL AS id, fingerprint FROM approval_grants"
            " WHERE session_key = ? AND tool = ? AND rule_key = ?"
            " UNION ALL SELECT 1, 'always', id, fingerprint FROM approval_rules"
            " WHERE tool = ? AND rule_key = ? AND channel = ?"
            " AND ((user_id <> '' AND user_id = ?) OR (session_key <> '' AND session_key = ?))"
            " ORDER BY rank, id",
            (
                turn.session_key,
                tool,
                rule_key,
                tool,
                rule_key,
                turn.channel,
                turn.user_id or "",
                turn.session_key,
            ),
        )
        return [
            Grant(cast(Literal["chat", "always"], row["scope"]), row["id"], row["fingerprint"])
            for row in rows
        ]

    async def rules(self, *, channel: str | None = None) -> list[SavedRule]:
        """Every saved rule (only those of `channel` when given), oldest first."""
        where, params = ("", ()) if channel is None else (" WHERE channel = ?", (channel,))
        rows = await self._db.fetchall(
            f"SELECT * FROM approval_rules{where} ORDER BY created_at, id", params
        )
        return [rule_of(row) for row in rows]

    async def revoke(self, rule_id: str, *, by: str | None = None) -> SavedRule | None:
        """Delete a saved rule (logged as revoked); None if there is none with that id."""
        now = to_text(self._clock())
        async with self._db.transaction():
            row = await self._db.fetchone(
                "DELETE FROM approval_rules WHERE id = ? RETURNING *", (rule_id.strip().lower(),)
            )
            if row is None:
                return None
            rule = rule_of(row)
            await self._db.execute(
                "INSERT INTO approval_log (at, request_id, tool, arguments, outcome, decided_by,"
                " reason) VALUES (?, ?, ?, ?, 'revoked', ?, ?)",
                (now, rule.request_id, rule.tool, rule.arguments, by, f"saved rule {rule.id}"),
            )
        return rule

    async def clear_chat_scope(self, session_key: str) -> int:
        """Drop the chat-scope approvals of a session (on `/new`); returns how many."""
        return await self._db.execute(
            "DELETE FROM approval_grants WHERE session_key = ?", (session_key,)
        )

    # -- the log -----------------------------------------------------------------------------

    async def record(
        self,
        *,
        tool: str,
        arguments: str,
        outcome: LogOutcome,
        reason: str,
        session_key: str | None = None,
        request_id: str | None = None,
    ) -> None:
        """Log a decision that had no request: a call refused at once (no approver, policy
        deny, unattended) or allowed by a grant."""
        await self._db.execute(
            "INSERT INTO approval_log (at, request_id, session_key, tool, arguments, outcome,"
            " reason) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (to_text(self._clock()), request_id, session_key, tool, arguments, outcome, reason),
        )

    async def log(self, limit: int = 50) -> list[LogEntry]:
        """The latest `limit` decisions, oldest first."""
        rows = await self._db.fetchall(
            "SELECT * FROM (SELECT * FROM approval_log ORDER BY id DESC LIMIT ?) AS latest"
            " ORDER BY id",
            (limit,),
        )
        return [entry_of(row) for row in rows]

    # -- internals ---------------------------------------------------------------------------

    async def _save_rule(self, request: ApprovalRequest, by: str, now: str) -> None:
        asked = request.asked
        user_id, session_key = (asked.owner, "") if asked.owner else ("", asked.session_key)
        bound = (asked.tool, asked.rule_key, asked.channel, user_id, session_key)
        where = "tool = ? AND rule_key = ? AND channel = ? AND user_id = ? AND session_key = ?"
        for _ in range(ID_ATTEMPTS):
            # The same command saved before for the same person and place: one rule is
            # enough, pinned to the code as it is now.
            again = await self._db.fetchone(
                "UPDATE approval_rules SET fingerprint = ?, arguments = ?, created_at = ?,"
                f" created_by = ?, request_id = ? WHERE {where} RETURNING id",
                (asked.fingerprint, asked.arguments, now, by, request.id, *bound),
            )
            if again is not None:
                return
            row = await self._db.fetchone(
                "INSERT INTO approval_rules (id, tool, rule_key, arguments, created_at,"
                " created_by, request_id, channel, user_id, session_key, fingerprint)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING id",
                (
                    secrets.token_hex(4),
                    asked.tool,
                    asked.rule_key,
                    asked.arguments,
                    now,
                    by,
                    request.id,
                    asked.channel,
                    user_id,
                    session_key,
                    asked.fingerprint,
                ),
            )
            if row is not None:
                return
        raise StoreError(f"{self._db.name}: could not find a free approval rule id")

    async def _log(self, request: ApprovalRequest, outcome: LogOutcome, now: str) -> None:
        await self._db.execute(
            "INSERT INTO approval_log (at, request_id, session_key, tool, arguments, outcome,"
            " scope, decided_by, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                now,
                request.id,
                request.asked.session_key,
                request.asked.tool,
                request.asked.arguments,
                outcome,
                request.scope,
                request.decided_by,
                request.note or request.asked.reason,
            ),
        )
