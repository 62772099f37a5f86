"""Compaction: older conversation summarised by the model into one stored entry.

A compaction entry holds a summary and the id of the last entry it covers; the history
window uses it in place of everything up to that id. Each compaction covers strictly more
than the one before and is bounded in input, so compaction can never loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from loguru import logger

from nanobot.agent.history import History, Window, render
from nanobot.agent.taint import earlier, message_texts
from nanobot.errors import ProviderError
from nanobot.providers.base import LLMProvider, Message
from nanobot.store import Entry, NewEntry, SessionStore
from nanobot.tools.base import untrusted

SUMMARY_MAX_TOKENS = 1024
PAUSE_AFTER_FAILURE = 5  # turns of a session without compaction after a failed one
SUMMARY_OF = "a summary of messages that held "  # the source of a summary of outside content
RESULT_PREVIEW = 400  # characters of each tool result shown to the summariser
INSTRUCTIONS = (
    "You maintain the memory of a long conversation between a user and their assistant. "
    "Write a concise summary of the conversation below for the assistant's own later use: "
    "facts about the user, decisions, open tasks and promises, names, numbers and file "
    "paths that matter. Merge the previous summary in. Plain prose or short bullets; no "
    "preamble."
)


class Compactor:
    """Decides when to compact a session and does it.

    When the window is full (older history no longer fits, or it is nearly at its budget),
    the history that slid out plus the older half of the window are summarised. The window
    then restarts at about half its budget and grows again, so a session is compacted about
    once per half-budget of conversation, never every turn.
    """

    def __init__(
        self,
        provider: LLMProvider,
        sessions: SessionStore,
        history: History,
        *,
        full_at: float = 0.8,
    ) -> None:
        self._provider = provider
        self._sessions = sessions
        self._history = history
        self._full_at = full_at
        self._paused: dict[int, int] = {}  # session id -> turns left without compaction

    def worth_it(self, session_id: int, window: Window, budget: int) -> bool:
        """Whether the window is full enough to compact.

        After a failed compaction a session waits a few turns before the next try, so a
        model that cannot summarise does not cost an extra call every turn.
        """
        paused = self._paused.get(session_id, 0)
        if paused:
            self._paused[session_id] = paused - 1
            return False
        return self.full(window, budget)

    def full(self, window: Window, budget: int) -> bool:
        """Whether `window` is full enough to compact, by its count (without the pause)."""
        return window.beyond > 0 or window.tokens >= budget * self._full_at

    async def compact(self, session_id: int, window: Window, budget: int) -> bool:
        """Summarise what slid out of `window` and its older half. Returns whether it did.

        Reads at most `budget` tokens of the history before the window (the newest part); a
        model failure is logged and leaves the session as it was.
        """
        older = await self._unsummarised(session_id, window, budget)
        older.extend(window.entries[: _middle_user(window.entries)])
        if not older:
            return False
        return await self._store_summary(session_id, window.summary, older)

    async def compact_for_overflow(self, session_id: int, window: Window) -> str | None:
        """Summarise the window up to its last user message; returns the new summary.

        Used when the model said the input is too long. None when there is nothing older
        than the current turn to summarise, or the summary could not be made.
        """
        last_user = max(
            (i for i, e in enumerate(window.entries) if e.data.get("role") == "user"), default=0
        )
        older = list(window.entries[:last_user])
        if not older:
            return None
        if not await self._store_summary(session_id, window.summary, older):
            return None
        return await self.latest_summary(session_id)

    async def latest_summary(self, session_id: int) -> str | None:
        for entry in reversed(await self._sessions.tail(session_id, 50)):
            if entry.kind == "compaction":
                return str(entry.data.get("summary", ""))
        return None

    async def _unsummarised(self, session_id: int, window: Window, budget: int) -> list[Entry]:
        older: list[Entry] = []
        used = 0
        before = window.first_id or None
        while before is not None:
            page = await self._sessions.tail(session_id, 200, before_id=before)
            for entry in reversed(page):
                if entry.id <= window.summarised_through or used >= budget:
                    return older[::-1]
                if entry.kind == "message":
                    used += self._history.tokens(entry)
                    older.append(entry)
            before = page[0].id if len(page) == 200 else None
        return older[::-1]

    async def _store_summary(
        self, session_id: int, previous: str | None, entries: Sequence[Entry]
    ) -> bool:
        prompt: list[Message] = [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": _transcript(previous, entries)},
        ]
        try:
            completion = await self._provider.complete(prompt, max_tokens=SUMMARY_MAX_TOKENS)
        except ProviderError as exc:
            logger.warning("session {}: compaction failed: {}", session_id, exc)
            self._paused[session_id] = PAUSE_AFTER_FAILURE
            return False
        # The model was asked for SUMMARY_MAX_TOKENS at most; a server that ignores that must
        # not be able to crowd the conversation out of the window.
        summary = (completion.content or "").strip()[: SUMMARY_MAX_TOKENS * 6]
        if not summary:
            return False
        # A summary of content from outside is the model's retelling of it, instructions
        # included: it stays data, and a turn given it counts as having read from outside.
        read = (previous or "", *message_texts(render(entry) for entry in entries))
        if (source := earlier(read)) is not None:
            # What an earlier summary retold is named as itself, not as a summary of one.
            summary = untrusted(SUMMARY_OF + source.replace(SUMMARY_OF, ""), summary)
        through = max(e.id for e in entries)
        data = {"summary": summary, "through_id": through, "entries": len(entries)}
        await self._sessions.append(session_id, [NewEntry("compaction", data)])
        logger.info(
            "session {}: compacted {} entries (through id {})", session_id, len(entries), through
        )
        return True


def _middle_user(entries: Sequence[Entry]) -> int:
    """Index of the user message nearest the middle of `entries` (0 when there is none but
    the first), so the kept half starts at a user message."""
    users = [i for i, e in enumerate(entries) if i > 0 and e.data.get("role") == "user"]
    return min(users, key=lambda i: abs(i - len(entries) / 2), default=0)


def _transcript(previous: str | None, entries: Sequence[Entry]) -> str:
    lines = [f"Previous summary:\n{previous}\n"] if previous else []
    lines.append("Conversation:")
    for entry in entries:
        message = render(entry)
        role = message.get("role", "?")
        content = message.get("content") or ""
        if role == "tool":
            content = str(content)[:RESULT_PREVIEW]
        lines.append(f"{role}: {content}")
        for call in message.get("tool_calls") or ():
            function = call.get("function", {})
            arguments = str(function.get("arguments", ""))[:RESULT_PREVIEW]
            lines.append(f"{role} called {function.get('name')}({arguments})")
    return "\n".join(lines)


def shrink_tool_results(messages: Sequence[Message], limit: int = 2_000) -> list[Message]:
    """Messages with every tool result cut to `limit` characters (an overflow's last resort)."""
    out: list[Message] = []
    for message in messages:
        content = message.get("content")
        if message.get("role") == "tool" and isinstance(content, str) and len(content) > limit:
            cut = len(content) - limit
            text = f"{content[:limit]}\n[{cut} characters cut to fit the context window]"
            out.append({**message, "content": text})
        else:
            out.append(message)
    return out
