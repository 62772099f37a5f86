"""The history window: as much recent conversation as fits the model, read from the tail.

A session is an append-only list of entries. The model sees the newest messages that fit in
the token budget, starting at a user message (so an assistant's tool calls are never
separated from their results), preceded by the newest compaction summary when one covers
what came before. Only the tail is read: a session with 10,000 entries costs what its
window costs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from nanobot.agent.images import without_images
from nanobot.providers.base import Message
from nanobot.store import Entry, SessionStore

PAGE = 200
INTERRUPTED = (
    "Interrupted by a restart before its result was recorded: it may have run in part or in "
    "whole (check its effects before repeating it); it was not run again."
)
TOKEN_CACHE_SIZE = 50_000
WINDOW_CACHE_SIZE = 256  # sessions whose last window is kept for the next turn

CountTokens = Callable[[Sequence[Message]], int]


@dataclass(frozen=True, slots=True)
class Window:
    """What the model gets from a session's history.

    `summary` is the newest compaction summary covering entries up to `summarised_through`
    (an entry id, 0 when none). `first_id` is the id of the first entry in `messages`.
    `tokens` counts the summary and the messages. `beyond` is more than 0 when older,
    unsummarised messages did not fit: there is material for the next compaction.
    """

    messages: tuple[Message, ...]
    entries: tuple[Entry, ...]
    tokens: int
    summary: str | None = None
    summarised_through: int = 0
    first_id: int = 0
    beyond: int = 0


class History:
    """Builds windows for sessions.

    It remembers the token count of every entry it has seen and the last window of recently
    used sessions, so a turn reads only the entries added since the previous one.
    """

    def __init__(self, sessions: SessionStore, count_tokens: CountTokens) -> None:
        self._sessions = sessions
        self._count = count_tokens
        self._tokens: OrderedDict[int, int] = OrderedDict()
        self._windows: OrderedDict[int, tuple[Window, int, int]] = OrderedDict()

    def forget(self) -> None:
        """Drop every count and window remembered (the counts changed: made exact)."""
        self._tokens.clear()
        self._windows.clear()

    def tokens(self, entry: Entry) -> int:
        cached = self._tokens.get(entry.id)
        if cached is None:
            cached = self._count([render(entry)])
            self._tokens[entry.id] = cached
            if len(self._tokens) > TOKEN_CACHE_SIZE:
                self._tokens.popitem(last=False)
        return cached

    async def load(self, session_id: int, budget: int) -> Window:
        """The window of `session_id` within `budget` tokens.

        The newest user message and what follows it are always included, even over budget
        (the runner's overflow handling then compacts).
        """
        remembered = self._windows.get(session_id)
        window = None
        if remembered is not None and remembered[1] >= budget:
            window = await self._extend(session_id, budget, remembered[0], remembered[2])
        if window is None:
            window = await self._read(session_id, budget)
        last_id = window.entries[-1].id if window.entries else 0
        self._windows[session_id] = (window, budget, last_id)
        self._windows.move_to_end(session_id)
        if len(self._windows) > WINDOW_CACHE_SIZE:
            self._windows.popitem(last=False)
        return window

    async def _extend(
        self, session_id: int, budget: int, previous: Window, last_id: int
    ) -> Window | None:
        """`previous` plus what was appended since, trimmed to `budget`; None to re-read."""
        added = await self._sessions.since(session_id, last_id, PAGE)
        if len(added) == PAGE or any(e.kind != "message" for e in added):
            return None  # much was added elsewhere, or a compaction: read afresh
        entries = [*previous.entries, *added]
        used = previous.tokens + sum(self.tokens(e) for e in added)
        return self._trim(entries, used, budget, previous, added=len(added))

    def _trim(
        self, entries: list[Entry], used: int, budget: int, previous: Window, *, added: int
    ) -> Window:
        """Drop entries from the front until the window fits and starts at a user message.

        `added` is how many entries at the end are new since `previous`; when `previous`
        needed no repair, its messages are reused and only the new entries are rendered.
        """
        # From the end: the newest user message is near it, and the window may be long.
        last_user = next((i for i in range(len(entries) - 1, -1, -1) if _is_user(entries[i])), 0)
        start, beyond = 0, previous.beyond
        while start < last_user and (used > budget or not _is_user(entries[start])):
            cost = self.tokens(entries[start])
            used, beyond, start = used - cost, beyond + cost, start + 1
        kept = entries[start:]
        old = len(entries) - added
        if len(previous.messages) == old == len(previous.entries) and start <= old:
            fresh = repair(render(e) for e in entries[old:])
            messages = (*previous.messages[start:], *fresh)
        else:
            messages = tuple(repair(render(e) for e in kept))
        return replace(
            previous,
            messages=messages,
            entries=tuple(kept),
            tokens=used,
            first_id=kept[0].id if kept else 0,
            beyond=beyond,
        )

    async def _read(self, session_id: int, budget: int) -> Window:
        kept: list[Entry] = []
        used = beyond = through = 0
        summary: Entry | None = None
        full = seen_user = False
        before: int | None = None
        while True:
            page = await self._sessions.tail(session_id, PAGE, before_id=before)
            for entry in reversed(page):
                if entry.id <= through:
                    page = []
                    break
                if entry.kind == "compaction":
                    if summary is None:
                        summary = entry
                        through = int(entry.data.get("through_id", 0))
                        used += self.tokens(entry)
                    continue
                cost = self.tokens(entry)
                if full or (used + cost > budget and seen_user):
                    full = True
                    beyond += cost
                    page = []
                    break
                used += cost
                kept.append(entry)
                seen_user = seen_user or _is_user(entry)
            if len(page) < PAGE:
                break
            before = page[0].id
        kept.reverse()
        empty = Window(
            messages=(),
            entries=(),
            tokens=0,
            summary=str(summary.data.get("summary", "")) if summary is not None else None,
            summarised_through=through,
        )
        return self._trim(kept, used, budget, replace(empty, beyond=beyond), added=len(kept))


def render(entry: Entry) -> Message:
    """The model message for an entry."""
    if entry.kind == "message":
        return without_images(entry.data)
    if entry.kind == "compaction":
        return summary_message(str(entry.data.get("summary", "")))
    source = entry.data.get("source", "system")
    return {"role": "user", "content": f"[note from {source}]\n{entry.data.get('text', '')}"}


def summary_message(summary: str) -> Message:
    return {
        "role": "system",
        "content": f"Summary of the earlier part of this conversation:\n{summary}",
    }


def repair(messages: Iterable[Message]) -> list[Message]:
    """Give every assistant tool call a result, so the model accepts the history.

    A call whose result was never stored (the process died mid-tool) gets INTERRUPTED.
    """
    out: list[Message] = []
    owed: list[dict[str, object]] = []
    for message in messages:
        if owed and message.get("role") != "tool":
            out.extend(_interrupted(owed))
            owed = []
        if message.get("role") == "tool":
            owed = [c for c in owed if c.get("id") != message.get("tool_call_id")]
        out.append(message)
        if message.get("role") == "assistant" and message.get("tool_calls"):
            owed = list(message["tool_calls"])
    out.extend(_interrupted(owed))
    return out


def _interrupted(calls: Sequence[dict[str, object]]) -> list[Message]:
    return [
        {
            "role": "tool",
            "tool_call_id": call.get("id"),
            "name": _function_name(call),
            "content": INTERRUPTED,
        }
        for call in calls
    ]


def _function_name(call: dict[str, object]) -> str:
    function = call.get("function")
    return str(function.get("name", "")) if isinstance(function, dict) else ""


def _is_user(entry: Entry) -> bool:
    return entry.kind == "message" and entry.data.get("role") == "user"
