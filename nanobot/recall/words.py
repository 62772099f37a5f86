"""Words as the memory search sees them, the same on both backends.

Text is cut into words by one rule, here, before either database sees it: a word is a run
of letters and digits, folded (case and diacritics: "Café" is "cafe"), and in scripts written
without spaces (Chinese, Japanese, Korean, Thai, …) every character is a word of its own.
The database gets those words separated by single spaces (`index_text`), so SQLite's FTS5
(`unicode61`) and PostgreSQL's `to_tsvector('simple', …)` both index exactly these words.
A query's term is a phrase of its words (`Term`): "喜欢" is the phrase 喜 欢, found inside
"我喜欢猫" however short; "e-mail" is the phrase e mail. Nothing else of a query reaches the
database: its quotes, stars, colons, parentheses and operators are not words.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from nanobot.errors import NanobotError

MAX_QUERY_CHARS: Final = 500
MAX_TERMS: Final = 16
INDEXED_CHARS: Final = 100_000
"""Of a longer text only the start is indexed (PostgreSQL keeps word positions up to 16,383)."""

# Scripts written without spaces between words: each character is a word of its own.
_UNSPACED: Final = re.compile(
    "["
    "\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3100-\u312f\u31a0-\u31bf"  # Bopomofo
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\U00020000-\U0003134f"  # CJK extensions
    "]"
)
# A run of letters, digits and the marks on them (no underscore: "snake_case" is two words).
_RUN: Final = re.compile(r"(?:[^\W_]|[\u0300-\u036f])+")
_FOLDED_WORD: Final = re.compile(r"[^\W_]+")
# ASCII text lower-cased: everything but letters and digits separates words.
_ASCII_SEPARATORS: Final = str.maketrans(
    {chr(c): " " for c in range(128) if not chr(c).isalnum() or chr(c).isupper()}
)


class QueryError(NanobotError):
    """A query that cannot be searched for (no words in it, or too long); the message says
    why, for the person or model that wrote it."""


@dataclass(frozen=True, slots=True)
class Word:
    """A word of a text: where it is (`start`, `end`, in the text as given) and its folded
    form (what is indexed and matched)."""

    start: int
    end: int
    folded: str


Term = tuple[str, ...]
"""One term of a query: the folded words of one of its blank-separated parts, matched as a
phrase (those words, adjacent, in order)."""


def fold(text: str) -> str:
    """`text` without case and diacritics ("Ça" → "ca", "Straße" → "strasse")."""
    decomposed = unicodedata.normalize("NFKD", text)
    bare = "".join(c for c in decomposed if not unicodedata.combining(c))
    return unicodedata.normalize("NFC", bare).casefold()


def words(text: str) -> Iterator[Word]:
    """The words of `text`, in order, with their places in it."""
    for run in _RUN.finditer(text):
        start, piece = run.start(), run.group()
        at = 0
        for char in _UNSPACED.finditer(piece):
            if char.start() > at:
                yield from _folded(start + at, piece[at : char.start()])
            yield from _folded(start + char.start(), char.group())
            at = char.end()
        if at < len(piece):
            yield from _folded(start + at, piece[at:])


def _folded(start: int, piece: str) -> Iterator[Word]:
    # Folding can split a word (NFKD of "ﬁ" is "fi": still one word) or empty it (a lone
    # mark); every word the database sees is a run of letters and digits.
    for part in _FOLDED_WORD.finditer(fold(piece)):
        yield Word(start, start + len(piece), part.group())


def index_text(text: str) -> str:
    """What the database indexes for `text`: its folded words, one space between each."""
    text = text[:INDEXED_CHARS]
    if text.isascii():  # most text, a hundred times faster: nothing to fold but case
        return " ".join(text.lower().translate(_ASCII_SEPARATORS).split())
    return " ".join(word.folded for word in words(text))


def terms(query: str) -> tuple[Term, ...]:
    """The terms of `query`: each blank-separated part's words, as a phrase; a part in
    double quotes ("exact words") is one phrase.

    Raises:
        QueryError: the query is longer than `MAX_QUERY_CHARS`, or holds no word at all.
    """
    if len(query) > MAX_QUERY_CHARS:
        raise QueryError(
            f"the query is too long ({len(query)} characters, at most {MAX_QUERY_CHARS})"
        )
    found: list[Term] = []
    for quoted, bare in re.findall(r'"([^"]*)"|(\S+)', query):
        term = tuple(word.folded for word in words(quoted or bare))
        if term and term not in found:
            found.append(term)
    if not found:
        raise QueryError("the query has no words to search for (letters or digits)")
    return tuple(found[:MAX_TERMS])
