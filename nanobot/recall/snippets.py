"""The piece of a text a hit shows: a window around the best match, the matches marked."""

from __future__ import annotations

import re
from typing import Final

from nanobot.recall.words import INDEXED_CHARS, Term, words

MARK: Final = "**"
_BLANKS: Final = re.compile(r"\s+")


def matches(text: str, terms: tuple[Term, ...]) -> list[tuple[int, int]]:
    """Where in `text` each of `terms` occurs (start, end), in order, not overlapping; the
    whole query as one phrase counts as a single match where it occurs."""
    found = list(words(text[:INDEXED_CHARS]))
    folded = [word.folded for word in found]
    phrases = [tuple(w for term in terms for w in term), *terms] if len(terms) > 1 else [*terms]
    spans: list[tuple[int, int]] = []
    taken = [False] * len(found)
    for phrase in phrases:
        size = len(phrase)
        for i in range(len(found) - size + 1):
            if folded[i : i + size] == list(phrase) and not any(taken[i : i + size]):
                taken[i : i + size] = [True] * size
                spans.append((found[i].start, found[i + size - 1].end))
    return sorted(spans)


def snippet(text: str, terms: tuple[Term, ...], width: int = 200) -> str:
    """About `width` characters of `text` on one line, around its first match (its start
    when nothing matches), each match within it marked `**like this**`; `…` where cut."""
    spans = matches(text, terms)
    first = spans[0][0] if spans else 0
    start = max(0, first - width // 3)
    if start:  # begin at a word
        space = text.rfind(" ", max(0, start - 20), first)
        start = space + 1 if space >= 0 else start
    end = min(len(text), start + width)
    pieces, at = [], start
    for s, e in spans:
        if s < start or e > end:
            continue
        pieces += [text[at:s], MARK, text[s:e], MARK]
        at = e
    pieces.append(text[at:end])
    shown = _BLANKS.sub(" ", "".join(pieces)).strip()
    return ("…" if start else "") + shown + ("…" if end < len(text) else "")
