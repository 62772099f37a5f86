"""The memory search's vocabulary: what is searched (`Search`, within a `Scope`), what is
found (`Hit`, `Found`), and the port the sessions' index is reached through
(`SessionSearch`, kept by the store)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from nanobot.recall.spoken import Said
from nanobot.recall.words import Term

DEFAULT_LIMIT = 10
MAX_LIMIT = 50


@dataclass(frozen=True, slots=True)
class Scope:
    """Which sessions a search may read: those of `keys` (session keys), or every session
    when None. Everything found or read passes through it, so a narrower scope (a person's
    sessions, a group's own) never sees more."""

    keys: frozenset[str] | None = None

    def allows(self, key: str) -> bool:
        return self.keys is None or key in self.keys


EVERYTHING = Scope()


@dataclass(frozen=True, slots=True)
class Search:
    """A search: `terms` (see `words.terms`), each found in every hit (or, when no entry has
    them all, in some); only entries from `since` and before `until` (aware times, either
    open); at most `limit` hits; only sessions `scope` allows."""

    terms: tuple[Term, ...]
    since: datetime | None = None
    until: datetime | None = None
    limit: int = DEFAULT_LIMIT
    scope: Scope = EVERYTHING


@dataclass(frozen=True, slots=True)
class Hit:
    """An entry found: where (`entry_id`, its session's key), when, and what was said.
    `score` orders hits (higher first); its scale means nothing outside one search."""

    entry_id: int
    session_key: str
    created_at: datetime
    said: Said
    score: float = 0.0

    @property
    def ref(self) -> str:
        """What `memory_get` takes to show the entry with its surroundings."""
        return f"entry:{self.entry_id}"


@dataclass(frozen=True, slots=True)
class Found:
    """What a search found, best first. `complete` is False while older entries are still
    being indexed (after an upgrade, see `nanobot.store.search`): some may be missing."""

    hits: tuple[Hit, ...]
    complete: bool = True


class SessionSearch(Protocol):
    """The sessions' full-text index. Both methods raise `StoreError` when the store fails."""

    async def search(self, search: Search) -> Found:
        """The entries that match `search`, ranked (relevance, recency, exact phrases)."""
        ...

    async def around(
        self, entry_id: int, *, before: int, after: int, scope: Scope = EVERYTHING
    ) -> Sequence[Hit] | None:
        """The entry `entry_id` with up to `before` and `after` of its session's indexed
        entries around it, in order; None when there is no such entry or `scope` does not
        allow its session."""
        ...
