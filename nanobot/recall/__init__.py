"""Memory search's own vocabulary and pure parts: words as both backends index them, what
of an entry is searched, the hits and their ranking, and snippets. The store keeps the
index (`nanobot.store.search`); the tools and commands present what it finds.

This package must not import `nanobot.store` or `nanobot.tools`: both import it."""

from nanobot.recall.hits import (
    DEFAULT_LIMIT,
    EVERYTHING,
    MAX_LIMIT,
    Found,
    Hit,
    Scope,
    Search,
    SessionSearch,
)
from nanobot.recall.ranking import Candidate, ranked
from nanobot.recall.snippets import snippet
from nanobot.recall.spoken import Said, said
from nanobot.recall.words import INDEXED_CHARS, QueryError, Term, index_text, terms

__all__ = [
    "DEFAULT_LIMIT",
    "EVERYTHING",
    "INDEXED_CHARS",
    "MAX_LIMIT",
    "Candidate",
    "Found",
    "Hit",
    "QueryError",
    "Said",
    "Scope",
    "Search",
    "SessionSearch",
    "Term",
    "index_text",
    "ranked",
    "said",
    "snippet",
    "terms",
]
