"""`memory_search` and `memory_get`: what was said in past conversations (every session,
including what compaction took out of the context) and what the memory files hold, found
by words, ranked, and read back with its surroundings.

`MemoryRecall` does the work and writes the answer; the tools, the `/search` command and
`nanobot memory search` all show what it writes. What a call may read is its `Scope`: a
private chat's turn searches every session, a group's turn only that group's own
conversation (what its members saw there), and the memory files in both.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from pathlib import Path
from typing import Final

from pydantic import Field

from nanobot.recall import (
    DEFAULT_LIMIT,
    EVERYTHING,
    MAX_LIMIT,
    Hit,
    QueryError,
    Scope,
    Search,
    SessionSearch,
    snippet,
    terms,
)
from nanobot.tools._memory_files import FileHit, lines_around, scan
from nanobot.tools.base import Tool, ToolContext, ToolError, ToolParams, tool_context

MAX_CHARS: Final = 4000
"""The most an answer of either tool holds."""
SNIPPET_CHARS: Final = 200
_AROUND: Final = 3  # entries before and after the one `memory_get` shows
_ENTRY_CHARS: Final = 600  # of each entry around it
_REF: Final = re.compile(r"entry:(\d{1,18})|(memory/[^/\\:]+\.md):(\d{1,7})")


def scope_of(context: ToolContext) -> Scope:
    """What a turn may search: what its context says (a person's own sessions, when people
    are kept apart); else everything from a private chat, and a group's own session only."""
    if context.scope is not None:
        return context.scope
    return EVERYTHING if context.private else Scope(frozenset({context.session_key}))


def files_of(context: ToolContext) -> Path | None:
    """Whose memory files a turn searches: its person's folder, when it runs as one."""
    return context.root


@dataclass(frozen=True, slots=True)
class _Shown:
    score: float
    line: str


class MemoryRecall:
    """Searches the sessions' index (`sessions`) and the memory files of `workspace`, and
    writes the answers (at most `MAX_CHARS`). Dates without a time are days in `timezone`
    (UTC when None). Raises `ToolError` for a bad query, date, limit or reference, saying
    which; `StoreError` when the store fails."""

    def __init__(
        self, sessions: SessionSearch, workspace: Path, timezone: tzinfo | None = None
    ) -> None:
        self._sessions = sessions
        self._workspace = workspace
        self._zone = timezone or UTC

    async def search(
        self,
        query: str,
        *,
        since: str | None = None,
        until: str | None = None,
        limit: int | None = None,
        scope: Scope = EVERYTHING,
        files: Path | None = None,
    ) -> str:
        """The hits for `query` from `since` until `until` (inclusive days), best first;
        the memory files are those of `files` (default: the workspace's)."""
        count = DEFAULT_LIMIT if limit is None else limit
        if not 1 <= count <= MAX_LIMIT:
            raise ToolError(f"limit must be between 1 and {MAX_LIMIT} (got {count})")
        try:
            found_terms = terms(query)
        except QueryError as exc:
            raise ToolError(str(exc)) from None
        start, end = self._moment(since, "since"), self._moment(until, "until", end=True)
        if start is not None and end is not None and start >= end:
            raise ToolError(f"since ({since}) must come before until ({until})")
        search = Search(found_terms, start, end, count, scope)
        found = await self._sessions.search(search)
        now = datetime.now(UTC)
        root = files if files is not None else self._workspace
        hits = await asyncio.to_thread(scan, root, found_terms, now)
        hits = [f for f in hits if _within(f.modified, start, end)]
        shown = [_Shown(hit.score, self._hit_line(hit, search)) for hit in found.hits]
        shown += [_Shown(f.score, self._file_line(f, search)) for f in hits]
        shown.sort(key=lambda s: s.score, reverse=True)
        return _answer(query, shown[:count], found.complete, more=len(shown) > count)

    async def get(self, ref: str, *, scope: Scope = EVERYTHING, files: Path | None = None) -> str:
        """The entry or memory-file line `ref` names (as a search shows it), with what is
        around it; memory files are those of `files` (default: the workspace's)."""
        match = _REF.fullmatch(ref.strip())
        if match is None:
            raise ToolError(
                f"{ref!r} is not a reference memory_search gives: entry:<number> or "
                "memory/<file>.md:<line>"
            )
        if match.group(1) is not None:
            return await self._entry(int(match.group(1)), scope)
        path, line = match.group(2), int(match.group(3))
        root = files if files is not None else self._workspace
        lines = await asyncio.to_thread(lines_around, root, path, line, 8)
        if lines is None:
            raise ToolError(f"there is no memory file {path}")
        if not lines:
            raise ToolError(f"{path} has no line {line}")
        text = "\n".join(f"{'>' if n == line else ' '}{n:5}  {t}" for n, t in lines)
        return _bounded(f"{path}, lines {lines[0][0]}-{lines[-1][0]}:\n{text}")

    async def _entry(self, entry_id: int, scope: Scope) -> str:
        entries = await self._sessions.around(entry_id, before=_AROUND, after=_AROUND, scope=scope)
        if not entries:
            raise ToolError(f"there is no entry {entry_id} that can be read here")
        parts = [f"Session {entries[0].session_key}, around entry {entry_id}:"]
        for hit in entries:
            limit = 2 * _ENTRY_CHARS if hit.entry_id == entry_id else _ENTRY_CHARS
            text = hit.said.text if len(hit.said.text) <= limit else hit.said.text[:limit] + "…"
            mark = ">>" if hit.entry_id == entry_id else "  "
            parts.append(f"{mark} [{self._when(hit.created_at)}] {_who(hit)}: {text}")
        return _bounded("\n".join(parts))

    def _hit_line(self, hit: Hit, search: Search) -> str:
        text = snippet(hit.said.text, search.terms, SNIPPET_CHARS)
        return f"{self._when(hit.created_at)} · {hit.session_key} · {_who(hit)}: {text} [{hit.ref}]"

    def _file_line(self, hit: FileHit, search: Search) -> str:
        text = snippet(hit.text, search.terms, SNIPPET_CHARS)
        return f"{self._when(hit.modified)} · {hit.path} line {hit.line}: {text} [{hit.ref}]"

    def _when(self, moment: datetime) -> str:
        return moment.astimezone(self._zone).strftime("%Y-%m-%d %H:%M")

    def _moment(self, value: str | None, name: str, *, end: bool = False) -> datetime | None:
        if value is None or not value.strip():
            return None
        text = value.strip()
        try:
            if len(text) == 10:
                day = date.fromisoformat(text)
                moment = datetime.combine(day + timedelta(days=1 if end else 0), time())
            else:
                moment = datetime.fromisoformat(text)
        except ValueError:
            raise ToolError(
                f"{name} must be a date (2026-01-31) or a time (2026-01-31T09:00), not {value!r}"
            ) from None
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=self._zone)


def _within(moment: datetime, start: datetime | None, end: datetime | None) -> bool:
    return (start is None or moment >= start) and (end is None or moment < end)


def _who(hit: Hit) -> str:
    return f"{hit.said.role} ({hit.said.sender})" if hit.said.sender else hit.said.role


def _answer(query: str, shown: list[_Shown], complete: bool, *, more: bool) -> str:
    note = "" if complete else " (older conversations are still being indexed: some may be missing)"
    if not shown:
        return f"Nothing found for {query!r}{note}."
    head = f"Found for {query!r}{note}; memory_get with the [reference] shows more:"
    lines, size, left = [head], len(head), 0
    for number, item in enumerate(shown, start=1):
        line = f"{number}. {item.line}"
        if size + len(line) + 1 > MAX_CHARS - 60:
            left = len(shown) - number + 1
            break
        lines.append(line)
        size += len(line) + 1
    if left or more:
        lines.append("(more hits not shown: narrow the query, or use since/until)")
    return "\n".join(lines)


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 1] + "…"


class MemorySearchParams(ToolParams):
    query: str = Field(
        description='Words to look for (all of them; "quoted words" as an exact phrase).'
    )
    since: str | None = Field(None, description="Only from this date on, e.g. 2026-01-31.")
    until: str | None = Field(None, description="Only until this date (inclusive).")
    limit: int | None = Field(
        None, description=f"How many hits at most (default {DEFAULT_LIMIT}, at most {MAX_LIMIT})."
    )


class MemorySearchTool(Tool[MemorySearchParams]):
    name = "memory_search"
    description = (
        "Search past conversations (all of them, including what no longer fits in your "
        "context) and the memory files for words. Returns ranked hits with date, chat, who "
        "said it and a snippet; memory_get reads a hit's surroundings."
    )
    params = MemorySearchParams

    def __init__(self, recall: MemoryRecall) -> None:
        self._recall = recall

    async def run(self, args: MemorySearchParams) -> str:
        context = tool_context()
        return await self._recall.search(
            args.query,
            since=args.since,
            until=args.until,
            limit=args.limit,
            scope=scope_of(context),
            files=files_of(context),
        )


class MemoryGetParams(ToolParams):
    ref: str = Field(description="A reference memory_search gave, e.g. entry:42.")


class MemoryGetTool(Tool[MemoryGetParams]):
    name = "memory_get"
    description = (
        "Read what memory_search found, with what was said around it: pass the hit's [reference]."
    )
    params = MemoryGetParams

    def __init__(self, recall: MemoryRecall) -> None:
        self._recall = recall

    async def run(self, args: MemoryGetParams) -> str:
        context = tool_context()
        return await self._recall.get(args.ref, scope=scope_of(context), files=files_of(context))
