"""What of a session's entries the memory search indexes: what was said.

Indexed: the text of user messages (without the time envelope each starts with) and of
assistant messages. Not indexed: tool results and the arguments of tool calls (file
contents, command output, fetched pages: large, mostly from outside, and where a secret a
tool read would sit; the assistant's own words about them are indexed), compaction
summaries (the entries they summarise stay indexed themselves) and system notes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

# The envelope `agent.context.user_message` puts before the user's text: "[2026-01-31 09:05
# Sat CET]\n".
_ENVELOPE: Final = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d[^\]\n]{0,40}\]\n")
_ROLES: Final = frozenset({"user", "assistant"})


@dataclass(frozen=True, slots=True)
class Said:
    """An entry's words: who said them (`role`: user or assistant; `sender`: the name the
    message carries, where it has one) and the text."""

    role: str
    sender: str | None
    text: str


def said(kind: str, data: Mapping[str, Any]) -> Said | None:
    """What the entry of `kind` with `data` says, if it is indexed (see the module); None for
    entries that are not, or that hold no text."""
    if kind != "message" or data.get("role") not in _ROLES:
        return None
    text = content_text(data.get("content"))
    if data["role"] == "user":
        text = _ENVELOPE.sub("", text, count=1) if text.startswith("[") else text
    if not text.strip():
        return None
    name = data.get("name")
    return Said(str(data["role"]), name if isinstance(name, str) and name else None, text)


def content_text(content: object) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts
    (images and other parts left out), one line between each."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    return ""
