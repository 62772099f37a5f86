"""What an approval card shows: the whole call, invisible and bidirectional characters made
visible with a warning, the long ones whole or refused, and a short excerpt once decided."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nanobot.agent.approval_cards import (
    MAX_SHOWN,
    buttons,
    card_text,
    decided_text,
    shown,
    too_long,
    visible,
)
from nanobot.channels.render import split_discord
from nanobot.store.approvals import ApprovalRequest, NewRequest, Place, Scope

WHEN = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def request(
    command: str, scopes: tuple[Scope, ...] = ("once", "chat", "always")
) -> ApprovalRequest:
    asked = NewRequest(
        session_key="telegram:1",
        run_id="r",
        tool_call_id="c",
        tool="exec",
        arguments=json.dumps({"command": command}, ensure_ascii=False),
        args_hash="h",
        rule_key=command,
        scopes=scopes,
        reason="exec asks first",
        deciders=("1",),
        places=(Place("telegram", "@1"),),
    )
    return ApprovalRequest(
        "REQ", asked, "pending", None, WHEN, WHEN + timedelta(minutes=10), None, None, None
    )


@pytest.mark.parametrize(
    ("text", "shown_as", "count"),
    [
        ("ls -la\n\tx", "ls -la\n\tx", 0),
        ("echo \u202egnp.exe", "echo <U+202E>gnp.exe", 1),
        ("a\u200bb\u200dc\ufeff", "a<U+200B>b<U+200D>c<U+FEFF>", 3),
        ("rm\u00a0-rf\u2003x", "rm<U+00A0>-rf<U+2003>x", 2),  # look-alike spaces
        ("x\r\x1b[2Ky", "x<U+000D><U+001B>[2Ky", 2),
        ("\u2066i\u2069 \u061c", "<U+2066>i<U+2069> <U+061C>", 3),
        ("e\ufe0f\U000e0041", "e<U+FE0F><U+E0041>", 2),
        ("naïve café ✓", "naïve café ✓", 0),
    ],
)
def test_visible(text: str, shown_as: str, count: int) -> None:
    assert visible(text) == (shown_as, count)


def test_a_card_shows_hidden_characters_and_warns() -> None:
    text = card_text(
        request("echo safe \u202e; rm -rf x"), workspace=Path("/ws"), once_only=None, always=None
    )
    assert "\u202e" not in text
    assert "echo safe <U+202E>; rm -rf x" in text
    assert "Careful: it holds 1 invisible or direction-changing character," in text
    plain = card_text(request("ls"), workspace=Path("/ws"), once_only=None, always=None)
    assert "Careful" not in plain


def test_a_long_command_is_on_the_card_whole_and_its_parts_hold_all_of_it() -> None:
    command = "echo start; " + "true; " * 900 + "touch PROOF-hidden-tail"
    text = card_text(request(command), workspace=Path("/ws"), once_only=None, always=None)
    assert command in text
    parts = split_discord(text)
    assert len(parts) > 1 and "touch PROOF-hidden-tail" in parts[-1] + parts[-2]
    assert too_long("exec", json.dumps({"command": command})) is None


def test_what_cannot_be_shown_whole_is_refused_before_it_is_asked() -> None:
    command = "x" * (MAX_SHOWN + 1)
    reason = too_long("exec", json.dumps({"command": command}))
    assert reason is not None and f"{MAX_SHOWN + 1} characters long" in reason


def test_a_decided_card_shows_an_excerpt_and_no_buttons() -> None:
    command = "echo " + "y" * 2000
    text = decided_text(request(command), "allowed once by 1 at 12:01 UTC")
    assert text.startswith("Approval REQ for **exec**: allowed once by 1 at 12:01 UTC.")
    assert "more characters, shown on the card" in text and len(text) < 800


def test_shown_puts_the_command_or_url_first_and_other_arguments_after() -> None:
    assert shown("exec", '{"command":"ls"}') == "ls"
    assert shown("exec", '{"command":"ls","timeout":5}') == 'ls\n\n(and {"timeout": 5})'
    assert shown("web_fetch", '{"url":"https://x.test/?q=1"}') == "https://x.test/?q=1"
    assert shown("cron", '{"action":"list"}') == '{\n  "action": "list"\n}'


def test_buttons_offer_the_scopes_of_the_request() -> None:
    keys = buttons(request("ls", ("once", "always")), always_label="Always for host")
    assert [key.label for key in keys] == ["Allow once", "Always for host", "Deny"]
    assert keys[1].data == "/approve REQ always h"
