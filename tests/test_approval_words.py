"""The words for each outcome of an approval request: answers, decisions, calls not run."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from nanobot.agent._approval_words import answer_text, decision_text, not_run
from nanobot.store.approvals import RESTARTED, TIMED_OUT, ApprovalRequest, NewRequest, Place

DECIDED_AT = datetime(2026, 3, 1, 14, 5, tzinfo=UTC)


def request(**changes: object) -> ApprovalRequest:
    asked = NewRequest(
        session_key="telegram:42",
        run_id="r",
        tool_call_id="c",
        tool="exec",
        arguments='{"command":"ls"}',
        args_hash="0" * 16,
        rule_key="ls",
        scopes=("once", "chat", "always"),
        reason="exec asks first",
        deciders=("42",),
        places=(Place("telegram", "42"),),
    )
    base = ApprovalRequest(
        id="ABCDEFGHJKLM",
        asked=asked,
        state="pending",
        scope=None,
        created_at=DECIDED_AT,
        expires_at=DECIDED_AT,
        decided_by=None,
        decided_at=None,
        note=None,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_the_words_for_decisions_and_answers() -> None:
    approved = request(state="approved", scope="chat", decided_by="42", decided_at=DECIDED_AT)
    assert decision_text(approved) == "allowed for this chat by 42 at 14:05 UTC"
    denied = request(state="denied", decided_by="42", decided_at=DECIDED_AT)
    assert decision_text(denied) == "denied by 42 at 14:05 UTC"
    expired = request(state="expired", decided_at=DECIDED_AT, note=TIMED_OUT)
    assert decision_text(expired) == f"expired at 14:05 UTC: {TIMED_OUT}"
    assert answer_text("already_decided", approved) == (
        "This was already decided. Allowed for this chat by 42 at 14:05 UTC."
    )
    assert answer_text("not_approver") == "Only an approver can decide this."
    assert not_run(denied) == "Not run: the user denied it."
    assert not_run(expired) == "Not run: it was not approved in time."
    assert not_run(request(state="expired", note=RESTARTED)) == (
        "Not run: nanobot restarted before it was approved."
    )
    assert "stopped" in not_run(request(state="cancelled", note="the run was stopped"))
    assert not_run(refused="no approver in this group") == "Not run: no approver in this group."
    with pytest.raises(ValueError):
        not_run(approved)


def test_a_decision_names_who_decided_where_their_name_is_known() -> None:
    decided = request(state="approved", scope="once", decided_by="42", decided_at=DECIDED_AT)
    assert decision_text(decided) == "allowed once by 42 at 14:05 UTC"  # no name known
    alice = replace(decided, decided_name="Alice")
    assert decision_text(alice) == "allowed once by Alice (42) at 14:05 UTC"
    forged = decision_text(replace(decided, decided_name="Eve\x1b[2J"))
    assert "\x1b" not in forged and "(42)" in forged  # a name is the sender's to choose
    repeat = answer_text("already_decided", alice)
    assert repeat == "This was already decided. Allowed once by Alice (42) at 14:05 UTC."
