"""The words for every outcome of an approval request: the answer to a person who decided,
what became of a request (for its edited card), and the tool result of a call that did not
run. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Final

from nanobot.log import printable
from nanobot.store.approvals import ASKER_GONE, RESTARTED, ApprovalRequest, Outcome, Scope

_ANSWERS: Final[Mapping[Outcome, str]] = MappingProxyType(
    {
        "decided": "Decided.",
        "already_decided": "This was already decided.",
        "unknown": "There is no such approval request.",
        "other_chat": "That approval request was not asked in this chat.",
        "not_approver": "Only an approver can decide this.",
        "expired": "Too late: this request expired, and the call did not run.",
        "changed": "The call changed since this was asked; nothing was decided.",
        "not_offered": "That is not offered here: this call can only be allowed once.",
    }
)
_SCOPE_WORDS: Final[Mapping[Scope, str]] = MappingProxyType(
    {"once": "allowed once", "chat": "allowed for this chat", "always": "always allowed"}
)


def answer_text(outcome: Outcome, request: ApprovalRequest | None = None) -> str:
    """The reply to a person who answered a request (a click or `/approve`): one line."""
    text = _ANSWERS[outcome]
    if outcome == "already_decided" and request is not None:
        decided = decision_text(request)
        return f"{text} {decided[:1].upper()}{decided[1:]}."
    return text


def decision_text(request: ApprovalRequest) -> str:
    """What became of a request, for its edited card: "allowed once by Alice (123) at 14:05
    UTC", with the name the decider went by where the platform gave one, else the id."""
    when = f" at {request.decided_at:%H:%M} UTC" if request.decided_at else ""
    decider, name = request.decided_by, request.decided_name
    by = f" by {printable(name)} ({decider})" if name else f" by {decider}" if decider else ""
    if request.state == "approved" and request.scope is not None:
        return f"{_SCOPE_WORDS[request.scope]}{by}{when}"
    if request.state == "denied":
        return f"denied{by}{when}"
    if request.state in {"expired", "cancelled"}:
        return f"{request.state}{when}: {request.note or 'no answer'}"
    return "waiting for a decision"


def waiting_text(request: ApprovalRequest, now: datetime) -> str:
    """What a message sent while its chat's run waits on `request` is told at `now`."""
    minutes = max(1, round((request.expires_at - now).total_seconds() / 60))
    return (
        f"Your message waits: I am waiting for a decision on approval request {request.id} "
        "(the card above) and will read it once someone allows or denies it, or in "
        f"{minutes} min when the request runs out. /approvals lists it."
    )


def not_run(request: ApprovalRequest | None = None, *, refused: str | None = None) -> str:
    """The tool result for a call that did not run: refused at once (`refused`), or its
    request was denied, expired or cancelled."""
    if refused is not None:
        return f"Not run: {refused}."
    if request is None or request.state in {"pending", "approved"}:
        raise ValueError("not_run needs a refusal or a request that did not approve the call")
    if request.state == "denied":
        return "Not run: the user denied it."
    if request.note in (RESTARTED, ASKER_GONE):
        return f"Not run: {request.note}."
    if request.state == "expired":
        return "Not run: it was not approved in time."
    return f"Not run: the request was cancelled ({request.note or 'no reason given'})."
