"""What an approval card says: the whole call, with every invisible or direction-changing
character shown as what it is, so a person decides on what will run; and what `/approvals`
lists.

Pure. A card holds the call whole, however long (the channel splits it across messages, its
buttons under the last part), up to `MAX_SHOWN` characters; a longer call cannot be shown
whole and is refused before it is asked (`too_long`). The edit that says how a card was
decided shows a shorter excerpt: the card above it showed the rest.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from datetime import UTC
from pathlib import Path
from typing import Final

from nanobot.bus.events import Button
from nanobot.store.approvals import ApprovalRequest, SavedRule

__all__ = [
    "MAX_SHOWN",
    "buttons",
    "card_text",
    "decided_text",
    "listing",
    "shown",
    "too_long",
    "visible",
]

MAX_SHOWN: Final = 12_000
"""Characters of a call a card shows whole (Telegram: 3-4 messages, Discord: about 7)."""
EXCERPT_CHARS: Final = 600
"""Of a call, on the edit that says how its card was decided."""
_INVISIBLE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp", "Zs"})
_KEPT: Final = frozenset({"\n", "\t", " "})
# Variation selectors are marks, not formats, yet change nothing a reader sees.
_SELECTORS: Final = ((0xFE00, 0xFE0F), (0xE0100, 0xE01EF), (0x180B, 0x180F))


def visible(text: str) -> tuple[str, int]:
    """`text` with each invisible, control, bidirectional or look-alike space character
    written as `<U+XXXX>` (newlines, tabs and plain spaces stay), and how many there were."""
    out: list[str] = []
    count = 0
    for char in text:
        if _hidden(char):
            out.append(f"<U+{ord(char):04X}>")
            count += 1
        else:
            out.append(char)
    return "".join(out), count


def _hidden(char: str) -> bool:
    if char in _KEPT:
        return False
    code = ord(char)
    if any(low <= code <= high for low, high in _SELECTORS):
        return True
    return unicodedata.category(char) in _INVISIBLE_CATEGORIES


def shown(tool: str, arguments: str) -> str:
    """A call's arguments as a person reads them, whole: exec's command as it is, a
    web_fetch's URL as it is, others as indented JSON. Not yet made `visible`."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict):
        key = {"exec": "command", "web_fetch": "url"}.get(tool)
        if key is not None and isinstance(parsed.get(key), str):
            rest = {k: v for k, v in parsed.items() if k != key}
            extra = f"\n\n(and {json.dumps(rest, ensure_ascii=False)})" if rest else ""
            return f"{parsed[key]}{extra}"
    return json.dumps(parsed, indent=2, ensure_ascii=False) if parsed else arguments


def too_long(tool: str, arguments: str) -> str | None:
    """Why the call cannot be asked about (it cannot be shown whole), or None."""
    length = len(visible(shown(tool, arguments))[0])
    if length <= MAX_SHOWN:
        return None
    return (
        f"it is {length} characters long, more than an approval card shows whole"
        f" ({MAX_SHOWN}); split the work into shorter calls"
    )


def card_text(
    request: ApprovalRequest, *, workspace: Path, once_only: str | None, always: str | None
) -> str:
    """The card of `request`: the whole call made visible, where it runs, why it asks, until
    when, and what the buttons do not offer (`once_only`, why; `always`, what "always"
    means when it is not the command for good)."""
    asked = request.asked
    text, hidden = visible(shown(asked.tool, asked.arguments))
    lines = [f"**Approval needed** ({request.id}): the agent wants to run **{asked.tool}**"]
    if hidden:
        lines.append(
            f"⚠️ Careful: it holds {hidden} invisible or direction-changing character"
            f"{'s' if hidden != 1 else ''}, shown below as <U+…>; what runs holds them as they"
            " are."
        )
    lines += [
        block(text),
        f"Working directory: `{workspace}`",
        f"Why it asks: {visible(asked.reason)[0]}",
        f"Expires at {request.expires_at.astimezone(UTC):%H:%M} UTC if nobody decides.",
    ]
    if once_only:
        lines.append(f"Only once: {visible(once_only)[0]}.")
    if always:
        lines.append(f"Always: {always}.")
    return "\n".join(lines)


def decided_text(request: ApprovalRequest, decision: str) -> str:
    """The edit of a decided card: its decision and an excerpt of the call."""
    asked = request.asked
    text = visible(shown(asked.tool, asked.arguments))[0]
    if len(text) > EXCERPT_CHARS:
        cut = len(text) - EXCERPT_CHARS
        text = f"{text[:EXCERPT_CHARS]}\n… ({cut} more characters, shown on the card)"
    return f"Approval {request.id} for **{asked.tool}**: {decision}.\n" + block(text)


def buttons(request: ApprovalRequest, *, always_label: str = "Always allow") -> tuple[Button, ...]:
    """The buttons of a request's card; each sends back the command it stands for."""
    labels = {"once": "Allow once", "chat": "Allow for this chat", "always": always_label}
    args_hash = request.asked.args_hash
    keys = [
        Button(labels[scope], f"/approve {request.id} {scope} {args_hash}")
        for scope in request.asked.scopes
    ]
    return (*keys, Button("Deny", f"/deny {request.id} {args_hash}"))


def block(text: str) -> str:
    """`text` as a code block no backticks inside can close."""
    fence = "`" * max(3, _longest_backticks(text) + 1)
    return f"{fence}\n{text}\n{fence}"


def _longest_backticks(text: str) -> int:
    longest = current = 0
    for char in text:
        current = current + 1 if char == "`" else 0
        longest = max(longest, current)
    return longest


def listing(
    pending: Sequence[ApprovalRequest], rules: Sequence[SavedRule], *, me: str, private: bool
) -> str:
    """`/approvals` for `me`, given what they may see: the requests and the rules, each on
    one line (the first ten of each). In a group (not `private`) only how many: the calls
    are not for everyone there."""
    if not private:
        return (
            f"Waiting for a decision: {len(pending)}; saved rules: {len(rules)}. Send"
            " /approvals in your private chat with me to see them: calls are not shown in"
            " a group."
        )
    lines = [f"Waiting for a decision: {len(pending)}"]
    for request in pending[:10]:
        asked = request.asked
        lines.append(f"- {request.id}: {asked.tool} {_short(asked.arguments, 80)}")
    lines.append(f"Saved rules (always allowed): {len(rules)}")
    for rule in rules[:10]:
        where = _rule_place(rule, me)
        lines.append(f"- {rule.id}: {rule.tool} {_short(rule.rule_key, 80)} ({where})")
    lines.append("Revoke a rule with `nanobot approvals revoke ID`.")
    return "\n".join(lines)


def _rule_place(rule: SavedRule, me: str) -> str:
    if rule.user_id is not None:
        return "your private chats" if rule.user_id == me else f"user {rule.user_id}"
    if rule.session_key is not None:
        return f"chat {rule.session_key}"
    return "nowhere: saved before rules were bound to a chat; revoke it"


def _short(text: str, limit: int) -> str:
    flat = " ".join(visible(text)[0].split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
