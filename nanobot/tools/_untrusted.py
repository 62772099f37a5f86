"""Finding and breaking look-alikes of the untrusted-content markers inside outside text.

`untrusted()` wraps fetched pages and subagent results in `<untrusted_content source=…>` …
`</untrusted_content>`. The text inside must not be able to end the wrapper early, nor open a
second one with a made-up source, in any spelling a model would read as the marker: any case,
spaces, hyphens or line breaks inside the tag, HTML entities and JSON/URL escapes for the
brackets and slash, full-width, mathematical and other compatibility forms (folded by NFKD),
bracket and letter look-alikes from other scripts, and invisible characters (zero-width
spaces, joiners, soft hyphens, combining marks) slipped into the word.

The check runs on a folded copy of the text that remembers where each of its characters came
from; each marker found there has its brackets replaced by square ones in the original, so
`</untrusted_content>` reads `[/untrusted_content]` and everything else is left as it was.
"""

from __future__ import annotations

import html
import re
import unicodedata
from functools import lru_cache

# A marker, in folded text: its head (bracket, optional slash, the name) and, if it has one
# within a tag's length, its closing bracket. The name ends where a letter, digit or
# underscore would make it another word.
_MARKER = re.compile(
    r"(?P<head><\s*(?P<slash>/\s*)?untrusted[\s_\-\u2010-\u2015]*content)(?![a-z0-9_])"
    r"(?:[^<>]{0,300}?(?P<end>>))?"
)

# Spellings of one character that a reader decodes: HTML character references (named ones
# also without their semicolon, as browsers accept), JSON/JavaScript escapes and URL escapes.
_ESCAPE = re.compile(
    r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});?"
    r"|\\u[0-9a-fA-F]{4}|\\x[0-9a-fA-F]{2}|\\/|%[0-9a-fA-F]{2}"
)

# Where folding can change anything: an escape may start, or a character is not ASCII.
_SPECIAL = re.compile(r"[&\\%]|[^\x00-\x7f]")

# Look-alikes NFKD leaves alone: brackets and slashes, and the Cyrillic, Greek, Armenian and
# small-capital letters that pass for the Latin letters of "untrusted_content" (lower case:
# the table is applied after lowering).
_LOOKALIKES = str.maketrans(
    {
        **dict.fromkeys("‹〈⟨˂ᐸ❮⧼〈", "<"),
        **dict.fromkeys("›〉⟩˃ᐳ❯⧽〉", ">"),
        **dict.fromkeys("⁄∕⧸╱", "/"),
        **dict.fromkeys("υսᴜ", "u"),
        **dict.fromkeys("ոɴ", "n"),
        **dict.fromkeys("τтᴛ", "t"),
        **dict.fromkeys("гʀ", "r"),
        **dict.fromkeys("ѕꜱ", "s"),
        **dict.fromkeys("еεҽᴇ", "e"),
        **dict.fromkeys("ԁᴅ", "d"),
        **dict.fromkeys("сϲᴄ", "c"),
        **dict.fromkeys("оοօᴏ", "o"),
    }
)


def defuse(text: str) -> str:
    """`text` with every look-alike of an untrusted-content marker (opening or closing)
    broken: its angle brackets become square ones. Anything else is returned unchanged."""
    folded, starts, ends = _fold(text)
    pieces: list[str] = []
    done = 0
    for match in _MARKER.finditer(folded):
        # max(): one original character can fold into several (an escape, a ligature).
        start = max(done, starts[match.start("head")])
        name = "[/untrusted_content" if match.group("slash") else "[untrusted_content"
        pieces += [text[done:start], name]
        done = max(done, ends[match.end("head") - 1])
        if match.group("end") is not None:
            bracket = match.start("end")
            pieces += [text[done : max(done, starts[bracket])], "]"]
            done = max(done, ends[bracket])
    if not pieces:
        return text
    pieces.append(text[done:])
    return "".join(pieces)


def _fold(text: str) -> tuple[str, list[int], list[int]]:
    """`text` as a lenient reader takes it (escapes decoded, NFKD, invisible characters and
    combining marks dropped, lower case, look-alikes mapped), and for each folded character
    the span of `text` it came from."""
    chars: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    position = 0
    for special in _SPECIAL.finditer(text):
        index = special.start()
        if index < position:  # inside an escape taken already
            continue
        chars.append(text[position:index].lower())  # plain ASCII: only case folds
        starts += range(position, index)
        ends += range(position + 1, index + 1)
        piece, position = _decoded(text, index)
        folded = _fold_piece(piece)
        chars.append(folded)
        starts += [index] * len(folded)
        ends += [position] * len(folded)
    chars.append(text[position:].lower())
    starts += range(position, len(text))
    ends += range(position + 1, len(text) + 1)
    return "".join(chars), starts, ends


def _decoded(text: str, index: int) -> tuple[str, int]:
    """The character(s) at `index`, an escape decoded, and where the next one starts."""
    escape = _ESCAPE.match(text, index)
    if escape is not None:
        raw = escape.group()
        if raw[0] == "&":
            decoded = html.unescape(raw)
        elif raw == "\\/":
            decoded = "/"
        else:
            decoded = chr(int(raw[2:] if raw[0] == "\\" else raw[1:], 16))
        if decoded != raw:
            return decoded, escape.end()
    return text[index], index + 1


@lru_cache(maxsize=4096)
def _fold_piece(piece: str) -> str:
    decomposed = unicodedata.normalize("NFKD", piece)
    visible = "".join(c for c in decomposed if unicodedata.category(c) not in ("Mn", "Cf"))
    return visible.lower().translate(_LOOKALIKES)
