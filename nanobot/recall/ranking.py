"""How found entries are ordered: their relevance as the database scores it, made relative
to the best candidate's, weighed by recency and raised for an exact phrase. Pure, so that
the two backends (bm25, ts_rank) rank alike and a later semantic ranking can be fused in."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

from nanobot.recall.hits import Hit
from nanobot.recall.words import Term, index_text

HALF_LIFE_DAYS: Final = 30.0
"""How much age counts: a hit this old keeps 75% of its score, a very old one 50%."""
PHRASE_BOOST: Final = 1.5
"""A hit holding the whole query as written, word after word, over one holding its words apart."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """An entry a backend found, with its raw relevance (higher is better, any scale)."""

    hit: Hit
    relevance: float


def recency(age_days: float) -> float:
    """The weight of a hit `age_days` old: 1 now, 0.75 at `HALF_LIFE_DAYS`, towards 0.5."""
    return 0.5 + 0.5 * float(0.5 ** (max(age_days, 0.0) / HALF_LIFE_DAYS))


def has_phrase(text: str, terms: tuple[Term, ...]) -> bool:
    """Whether `text` holds all of `terms`' words adjacent and in order (for several terms)."""
    if len(terms) < 2:
        return False
    phrase = " ".join(word for term in terms for word in term)
    return f" {phrase} " in f" {index_text(text)} "


def ranked(
    candidates: Iterable[Candidate], terms: tuple[Term, ...], now: datetime, limit: int
) -> list[Hit]:
    """The best `limit` of `candidates` (each entry once), scored, best first; ties go to the
    newer entry."""
    unique = {c.hit.entry_id: c for c in candidates}
    best = max((c.relevance for c in unique.values()), default=0.0)
    scored = []
    for candidate in unique.values():
        hit = candidate.hit
        relevance = candidate.relevance / best if best > 0 else 1.0
        age = (now - hit.created_at).total_seconds() / 86_400
        boost = PHRASE_BOOST if has_phrase(hit.said.text, terms) else 1.0
        scored.append(replace(hit, score=relevance * recency(age) * boost))
    scored.sort(key=lambda hit: (hit.score, hit.entry_id), reverse=True)
    return scored[:limit]
