"""What the model is told: the system prompt from the workspace, and the history window."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from nanobot.providers.base import Message
from nanobot.store import Entry

PROMPT_FILES = ("AGENTS.md", "SOUL.md", "USER.md", "TOOLS.md", "memory/MEMORY.md")


class _FileCache:
    """File text cached by (mtime, size), so an unchanged file is never read twice."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[tuple[int, int], str]] = {}

    def read(self, path: Path) -> str | None:
        try:
            stat = path.stat()
        except FileNotFoundError:
            self._cache.pop(path, None)
            return None
        key = (stat.st_mtime_ns, stat.st_size)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        text = path.read_text(encoding="utf-8", errors="replace")
        self._cache[path] = (key, text)
        return text


class ContextBuilder:
    """Builds model messages. Identical inputs give identical messages."""

    def __init__(self, workspace: Path) -> None:
        self._workspace = workspace
        self._files = _FileCache()

    def system_prompt(self) -> str:
        parts = [f"You are nanobot. Your workspace is {self._workspace}."]
        for name in PROMPT_FILES:
            text = self._files.read(self._workspace / name)
            if text and text.strip():
                parts.append(f"## {name}\n\n{text.strip()}")
        return "\n\n".join(parts)

    def messages(self, history: Sequence[Entry]) -> list[Message]:
        """System prompt plus the message entries of `history`, from its first user message."""
        chat = [entry.data for entry in history if entry.kind == "message"]
        start = next((i for i, m in enumerate(chat) if m.get("role") == "user"), len(chat))
        return [{"role": "system", "content": self.system_prompt()}, *chat[start:]]


def user_message(text: str, now: datetime) -> Message:
    """The user's message with a short time envelope (kept out of the system prompt, so the
    prompt stays byte-identical and provider prompt caches keep working)."""
    stamp = now.strftime("%Y-%m-%d %H:%M %Z").strip()
    return {"role": "user", "content": f"[{stamp}]\n{text}"}
