"""`nanobot approvals`: the saved rules, the log of decisions, the requests waiting for one."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from zoneinfo import ZoneInfo

from nanobot import log
from nanobot.config import Config
from nanobot.manage._command import config_zone, on_store, shown, table, when
from nanobot.store import ApprovalStore, SavedRule


def approvals(config: Config, action: str, *args: str) -> tuple[list[str], bool]:
    """Run a `nanobot approvals` action (rules, revoke ID, log [LIMIT], pending); returns the
    lines to print and whether it succeeded."""
    log.configure(config, quiet=True)
    zone = config_zone(config)
    actions: dict[str, Callable[..., Awaitable[tuple[list[str], bool]]]] = {
        "rules": _rules,
        "revoke": _revoke_rule,
        "log": _decision_log,
        "pending": _pending_approvals,
    }

    return on_store(config, lambda db: actions[action](ApprovalStore(db), zone, *args))


async def _rules(store: ApprovalStore, zone: ZoneInfo | None) -> tuple[list[str], bool]:
    rules = await store.rules()
    if not rules:
        return ['No saved rules. "Always allow" on an approval card saves one.'], True
    rows = [("ID", "TOOL", "SAVED", "BY", "FOR", "CALL")]
    for rule in rules:
        saved = when(rule.created_at, zone)
        by = rule.created_by or "-"
        rows.append((rule.id, rule.tool, saved, by, _bound(rule), _call(rule.tool, rule.arguments)))
    return table(rows), True


def _bound(rule: SavedRule) -> str:
    """Whose turns and where a saved rule applies, for `nanobot approvals rules`."""
    if rule.tool == "web_fetch" and rule.rule_key.startswith("host:"):
        what = f"fetches from {rule.rule_key[5:]}, "
    else:
        what = ""
    if rule.user_id is not None:
        return f"{what}{rule.channel} user {rule.user_id}'s own turns"
    if rule.session_key is not None:
        return f"{what}chat {rule.session_key} only"
    return "nowhere (saved before rules were bound to a chat: revoke it)"


async def _revoke_rule(
    store: ApprovalStore, zone: ZoneInfo | None, rule_id: str
) -> tuple[list[str], bool]:
    rule = await store.revoke(rule_id, by="cli")
    if rule is None:
        return [f"No saved rule has the id {shown(rule_id)} (see nanobot approvals rules)."], False
    return [f"Revoked rule {rule.id}: {rule.tool} {_call(rule.tool, rule.arguments)}"], True


async def _decision_log(
    store: ApprovalStore, zone: ZoneInfo | None, limit: str = "50"
) -> tuple[list[str], bool]:
    entries = await store.log(int(limit))
    if not entries:
        return ["No decisions yet."], True
    rows = [("WHEN", "OUTCOME", "TOOL", "BY", "CALL", "WHY")]
    for entry in entries:
        outcome = entry.outcome + (f" ({entry.scope})" if entry.scope else "")
        rows.append(
            (
                when(entry.at, zone),
                outcome,
                entry.tool,
                entry.decided_by or "-",
                _call(entry.tool, entry.arguments),
                shown(entry.reason, "-"),
            )
        )
    return table(rows), True


async def _pending_approvals(store: ApprovalStore, zone: ZoneInfo | None) -> tuple[list[str], bool]:
    pending = await store.pending()
    if not pending:
        return ["No requests are waiting for a decision."], True
    rows = [("ID", "TOOL", "ASKED IN", "UNTIL", "CALL")]
    for request in pending:
        asked = request.asked
        places = ", ".join(f"{p.channel}:{p.chat_id}" for p in asked.places)
        until = when(request.expires_at, zone)
        rows.append((request.id, asked.tool, places, until, _call(asked.tool, asked.arguments)))
    hint = "Decide in the chat: tap a button, or send /approve ID [once|chat|always] or /deny ID."
    return [*table(rows), hint], True


_CALL_WIDTH = 100


def _call(tool: str, arguments: str) -> str:
    """A call as one printable line: exec's command itself, other tools' arguments as JSON;
    cut when long."""
    text = arguments
    if tool == "exec":
        try:
            command = json.loads(arguments).get("command")
        except (ValueError, AttributeError):
            command = None
        text = command if isinstance(command, str) else arguments
    text = log.printable(text)
    return text if len(text) <= _CALL_WIDTH else text[: _CALL_WIDTH - 1] + "…"
