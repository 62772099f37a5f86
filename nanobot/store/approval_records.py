"""The records of approvals, as the store keeps and returns them: requests and their places,
decisions, saved rules, grants, the log; and how a database row becomes one.

Times are UTC; `Row`s come from `nanobot.store.approvals`' queries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal, cast, get_args

from nanobot.errors import StoreError
from nanobot.store._times import from_text
from nanobot.store.database import Row

State = Literal["pending", "approved", "denied", "expired", "cancelled"]
Scope = Literal["once", "chat", "always"]
"""How far an approval reaches: this call, this chat until `/new`, or this command for good."""
Verdict = Literal["once", "chat", "always", "deny"]
"""A person's answer to a request."""
Outcome = Literal[
    "decided",  # this answer won; the request holds it
    "already_decided",  # an earlier answer (or expiry, or cancel) won; the request holds it
    "unknown",  # no request has this id
    "other_chat",  # the request was not asked in the chat the answer came from
    "not_approver",  # the one answering is not one of the request's deciders
    "expired",  # too late: the request has expired (and is marked so now)
    "changed",  # the arguments the answer was for are not the request's
    "not_offered",  # the request does not offer that scope ("always" for inline code)
]
LogOutcome = Literal["approved", "denied", "expired", "cancelled", "refused", "allowed", "revoked"]

ID_ALPHABET: Final = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O or 1/I to misread
ID_LENGTH: Final = 12
"""60 random bits: unguessable, and short enough for Telegram's 64-byte `callback_data`."""
RESTARTED: Final = "nanobot restarted before it was approved"
ASKER_GONE: Final = "the gateway that asked stopped before it was approved"
"""A request whose member died, settled by the member that took its session over."""
TIMED_OUT: Final = "not approved in time"

STATES: Final = frozenset(get_args(State))
SCOPES: Final = frozenset(get_args(Scope))


@dataclass(frozen=True, slots=True)
class Place:
    """A chat a request is asked in, and its card there once the card is out."""

    channel: str
    chat_id: str
    message_id: str | None = None


@dataclass(frozen=True, slots=True)
class NewRequest:
    """What a request asks, to store (and, stored, its `ApprovalRequest.asked`). `arguments`
    is what the card shows (canonical JSON), `rule_key` what a rule made from it binds to,
    `scopes` the approvals it may get besides a denial, `deciders` the platform user ids who
    may decide and `places` the chats it is asked in (all on one channel). `owner` is the
    person whose private turn asks (None: a group's turn); a rule made from it binds to them,
    else to the session. `fingerprint` pins the code the call would run ('' for none)."""

    session_key: str
    run_id: str
    tool_call_id: str
    tool: str
    arguments: str
    args_hash: str
    rule_key: str
    scopes: tuple[Scope, ...]
    reason: str
    deciders: tuple[str, ...]
    places: tuple[Place, ...]
    owner: str | None = None
    fingerprint: str = ""

    @property
    def channel(self) -> str:
        return self.places[0].channel if self.places else ""


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A stored request: what was `asked` (its `places` with their cards once sent) and, once
    decided, its decision (`scope` set exactly when approved)."""

    id: str
    asked: NewRequest
    state: State
    scope: Scope | None
    created_at: datetime
    expires_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    note: str | None
    decided_name: str | None = None  # the name `decided_by` went by, where the platform gave one


@dataclass(frozen=True, slots=True)
class Decision:
    """What became of an answer (or an expiry, or a cancel). `request` is None when the
    answer may learn nothing of the request: unknown id, other chat, not a decider."""

    outcome: Outcome
    request: ApprovalRequest | None = None

    @property
    def won(self) -> bool:
        """Whether this answer is the one that decided the request."""
        return self.outcome == "decided"


@dataclass(frozen=True, slots=True)
class SavedRule:
    """An "always allow" for one tool and rule key, made when `created_by` approved
    `request_id`: for the private turns of `user_id` on `channel`, or for the session
    `session_key` (a group); neither (saved before rules were bound) applies nowhere.
    `fingerprint` is the code it approved ('' unknown)."""

    id: str
    tool: str
    rule_key: str
    arguments: str
    created_at: datetime
    created_by: str | None
    request_id: str | None
    channel: str = ""
    user_id: str | None = None
    session_key: str | None = None
    fingerprint: str = ""


@dataclass(frozen=True, slots=True)
class Grant:
    """Why a call may need no card: a saved rule (`rule_id`) or this chat's approval, with
    the fingerprint of the code it approved ('' unknown)."""

    scope: Literal["chat", "always"]
    rule_id: str | None = None
    fingerprint: str = ""


@dataclass(frozen=True, slots=True)
class Turn:
    """Whose turn a call is made in, for matching rules: its session and channel, and the
    person when it is their private turn (None in a group, or when nobody is known)."""

    session_key: str
    channel: str
    user_id: str | None


@dataclass(frozen=True, slots=True)
class LogEntry:
    id: int
    at: datetime
    request_id: str | None
    session_key: str | None
    tool: str
    arguments: str
    outcome: LogOutcome
    scope: Scope | None
    decided_by: str | None
    reason: str | None


def request_of(row: Row, places: tuple[Place, ...]) -> ApprovalRequest:
    state = row["state"]
    if state not in STATES:
        raise StoreError(f"approval request {row['id']} has an unknown state {state!r}")
    asked = NewRequest(
        session_key=row["session_key"],
        run_id=row["run_id"],
        tool_call_id=row["tool_call_id"],
        tool=row["tool"],
        arguments=row["arguments"],
        args_hash=row["args_hash"],
        rule_key=row["rule_key"],
        scopes=tuple(cast(Scope, s) for s in row["scopes"].split() if s in SCOPES),
        reason=row["reason"],
        deciders=tuple(str(d) for d in json.loads(row["deciders"])),
        places=places,
        owner=row["owner"] or None,
        fingerprint=row["fingerprint"],
    )
    return ApprovalRequest(
        id=row["id"],
        asked=asked,
        state=cast(State, state),
        scope=cast(Scope | None, row["scope"]),
        created_at=from_text(row["created_at"]),
        expires_at=from_text(row["expires_at"]),
        decided_by=row["decided_by"],
        decided_at=None if row["decided_at"] is None else from_text(row["decided_at"]),
        note=row["note"],
        decided_name=row["decided_name"],
    )


def rule_of(row: Row) -> SavedRule:
    return SavedRule(
        id=row["id"],
        tool=row["tool"],
        rule_key=row["rule_key"],
        arguments=row["arguments"],
        created_at=from_text(row["created_at"]),
        created_by=row["created_by"],
        request_id=row["request_id"],
        channel=row["channel"],
        user_id=row["user_id"] or None,
        session_key=row["session_key"] or None,
        fingerprint=row["fingerprint"],
    )


def entry_of(row: Row) -> LogEntry:
    return LogEntry(
        id=row["id"],
        at=from_text(row["at"]),
        request_id=row["request_id"],
        session_key=row["session_key"],
        tool=row["tool"],
        arguments=row["arguments"],
        outcome=cast(LogOutcome, row["outcome"]),
        scope=cast(Scope | None, row["scope"]),
        decided_by=row["decided_by"],
        reason=row["reason"],
    )
