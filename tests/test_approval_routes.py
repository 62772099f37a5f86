"""Where a call that needs approval is asked and who decides it (`route`): approvers
configured or not, private chats and groups, unattended turns."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nanobot.agent._approval_routes import AskApprovers, AskHere, Origin, RefuseNow, Route, route

PRIVATE = Origin("telegram", "42", private=True, user_id="42")
GROUP = Origin("telegram", "-100", private=False, user_id="42")
CRON_PRIVATE = replace(PRIVATE, unattended=True)
CRON_GROUP = replace(GROUP, user_id=None, unattended=True)


@pytest.mark.parametrize(
    ("origin", "approvers", "unattended", "expected"),
    [
        # No approvers configured: the one talking in a private chat decides there.
        (PRIVATE, [], "ask", AskHere(("42",))),
        # In a group nobody can: refused at once, saying what to configure.
        (GROUP, [], "ask", RefuseNow),
        # Configured approvers decide everywhere: here if this is one's private chat…
        (PRIVATE, ["42", "7"], "ask", AskHere(("42", "7"))),
        # …else each in their own private chat.
        (replace(PRIVATE, chat_id="5", user_id="5"), ["42", "7"], "ask", AskApprovers(("42", "7"))),
        (GROUP, ["42"], "ask", AskApprovers(("42",))),
        (GROUP, ["7", "7"], "ask", AskApprovers(("7",))),
        # Unattended: asked like the delivery chat would be, or refused.
        (CRON_PRIVATE, [], "ask", AskHere(("42",))),
        (CRON_GROUP, [], "ask", RefuseNow),
        (CRON_GROUP, ["42"], "ask", AskApprovers(("42",))),
        (CRON_PRIVATE, ["42"], "deny", RefuseNow),
        (replace(CRON_PRIVATE, user_id=None), [], "ask", RefuseNow),
        (None, ["42"], "ask", RefuseNow),
        # `unattended: deny` is for unattended turns only.
        (PRIVATE, [], "deny", AskHere(("42",))),
    ],
)
def test_route(
    origin: Origin | None, approvers: list[str], unattended: str, expected: Route | type
) -> None:
    result = route(origin, approvers, unattended=unattended)  # type: ignore[arg-type]
    if expected is RefuseNow:
        assert isinstance(result, RefuseNow)
    else:
        assert result == expected


def test_a_group_without_approvers_is_told_how_to_configure_one() -> None:
    refused = route(replace(GROUP, channel="discord"), [])
    assert isinstance(refused, RefuseNow)
    assert "channels.discord.approvers" in refused.reason
    unattended = route(CRON_PRIVATE, [], unattended="deny")
    assert isinstance(unattended, RefuseNow)
    assert "tools.approval.unattended: deny" in unattended.reason
    # A scheduled turn whose chat is not named for its user (a Discord DM's channel id).
    unnamed = route(Origin("discord", "5550001", private=False, user_id=None, unattended=True), [])
    assert isinstance(unnamed, RefuseNow)
    assert "named `@<user id>` (discord chat 5550001 is not)" in unnamed.reason
    assert "channels.discord.approvers" in unnamed.reason
