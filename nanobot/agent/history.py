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
from dataclasses import dataclass

from nanobot.providers.base import Message
from nanobot.store import Entry, SessionStore

PAGE = 200
INTERRUPTED = "Interrupted by a restart; not run again."
TOKEN_CACHE_SIZE = 50_000

CountTokens = Callable[[Sequence[Message]], int]


@dataclass(frozen=True, slots=True)
class Window:
    """What the model gets from a session's history.

    `summary` is the newest compaction summary covering entries up to `summarised_through`
    (an entry id, 0 when none). `first_id` is the id of the first entry in `messages`.
    `beyond` is how many tokens of older, unsummarised messages did not fit (counted only up
    to the scan limit given to `load`): the material for the next compaction.
    """

    messages: tuple[Message, ...]
    entries: tuple[Entry, ...]
    tokens: int
    summary: str | None = None
    summarised_through: int = 0
    first_id: int = 0
    beyond: int = 0


class History:
    """Builds windows for sessions, remembering the token count of every entry it has seen."""

    def __init__(self, sessions: SessionStore, count_tokens: CountTokens) -> None:
        self._sessions = sessions
        self._count = count_tokens
        self._tokens: OrderedDict[int, int] = OrderedDict()

    def tokens(self, entry: Entry) -> int:
        cached = self._tokens.get(entry.id)
        if cached is None:
            cached = self._count([render(entry)])
            self._tokens[entry.id] = cached
            if len(self._tokens) > TOKEN_CACHE_SIZE:
                self._tokens.popitem(last=False)
        return cached

    async def load(self, session_id: int, budget: int, *, scan_beyond: int = 0) -> Window:
        """The window of `session_id` within `budget` tokens.

        The newest user message and what follows it are always included, even over budget
        (the runner's overflow handling then compacts). `scan_beyond` bounds how many tokens
        past the window are counted into `Window.beyond`.
        """
        kept: list[Entry] = []
        used = 0
        beyond = 0
        summary: Entry | None = None
        through = 0
        full = False
        seen_user = False
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
                    if beyond >= scan_beyond:
                        page = []
                        break
                    continue
                used += cost
                kept.append(entry)
                seen_user = seen_user or _is_user(entry)
            if len(page) < PAGE:
                break
            before = page[0].id
        kept.reverse()
        start = next((i for i, e in enumerate(kept) if _is_user(e)), len(kept))
        dropped = sum(self.tokens(e) for e in kept[:start])
        kept = kept[start:]
        return Window(
            messages=tuple(repair(render(e) for e in kept)),
            entries=tuple(kept),
            tokens=used - dropped,
            summary=str(summary.data.get("summary", "")) if summary is not None else None,
            summarised_through=through,
            first_id=kept[0].id if kept else 0,
            beyond=beyond + dropped,
        )


def render(entry: Entry) -> Message:
    """The model message for an entry."""
    if entry.kind == "message":
        return entry.data
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
