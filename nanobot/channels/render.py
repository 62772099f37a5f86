"""Reply text for chat platforms: Markdown rendered for Telegram, and split to size.

Telegram gets HTML (`telegram_html`) split into messages of at most 4096 characters as
Telegram counts them (`split_telegram`, measured by `visible_length`); a chunk Telegram still
refuses goes out as `plain_text` instead. Discord renders Markdown itself, so its text is only
split (`split_discord`), with code fences closed and reopened across parts.

Every function here is pure and never raises on any text; only a limit too small to make
progress is refused with `ValueError`.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from nanobot.channels._markdown import to_telegram_html

TELEGRAM_LIMIT = 4096
DISCORD_LIMIT = 2000

# A soft break (paragraph, line, space) is taken in the last fifth of a piece first, so pieces
# stay close to full; then anywhere in it; a hard split is the fallback.
_SOFT_WINDOW = 0.8
_SEPARATORS = ("\n\n", "\n", " ")

# Tags and entities are indivisible; the rest is text. Both patterns try the same
# alternatives at each position, so `plain_text` sees exactly what `_atoms` sees.
_MARKUP_PATTERN = r"<[^<>]*>|&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[a-zA-Z][a-zA-Z0-9]*);"
_MARKUP = re.compile(_MARKUP_PATTERN)
_TAG = re.compile(r"<[^<>]*>")
_ATOM = re.compile(_MARKUP_PATTERN + r"|[^<&]+|[<&]")
_TAG_NAME = re.compile(r"</?\s*([a-zA-Z][\w-]*)")
_FENCE_OPEN = re.compile(r"[ \t]*(`{3,})([^`]*)")
_FENCE_CLOSE = re.compile(r"[ \t]*(`{3,})[ \t]*")
_RUN = re.compile(r"[ \t]*(`{3,})")
_CLEAN, _UGLY, _NEVER = 0, 1, 2

_Cut = Callable[[int], bool]


def telegram_html(markdown: str) -> str:
    """Markdown as Telegram HTML (parse_mode HTML); "" for blank input.

    Text is escaped (`a < b`, `AT&T`, a literal `<b>` all arrive as written), emphasis that
    does not parse as Markdown keeps its asterisks, and only tags Telegram accepts appear.
    """
    if not markdown.strip():
        return ""
    return to_telegram_html(markdown)


@dataclass(frozen=True, slots=True)
class _Atom:
    """One indivisible piece of HTML: a tag, an entity, or one character."""

    source: str
    kind: Literal["open", "close", "void", "text"]
    text: str  # what the reader sees: "" for a tag
    width: int  # `text` in UTF-16 code units, as Telegram counts
    name: str = ""


def _utf16(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _atoms(markup: str) -> list[_Atom]:
    atoms = []
    for match in _ATOM.finditer(markup):
        piece = match.group()
        if piece[0] == "<" and len(piece) > 1:
            atoms.append(_tag(piece))
        elif piece[0] == "&" and len(piece) > 1:
            text = html.unescape(piece)
            atoms.append(_Atom(piece, "text", text, _utf16(text)))
        else:
            # A run of plain text, one atom per character: any of them may end a chunk.
            atoms.extend(_Atom(char, "text", char, 2 if char > "\uffff" else 1) for char in piece)
    return atoms


def _tag(piece: str) -> _Atom:
    name = _TAG_NAME.match(piece)
    if name is None or piece.endswith("/>"):  # a comment, a doctype, <br/>: no nesting
        return _Atom(piece, "void", "", 0)
    kind: Literal["open", "close"] = "close" if piece[1] == "/" else "open"
    return _Atom(piece, kind, "", 0, name.group(1).lower())


def _decode(match: re.Match[str]) -> str:
    piece = match.group()
    return "" if piece[0] == "<" else html.unescape(piece)


def visible_length(markup: str) -> int:
    """The length Telegram counts for `markup` sent with parse_mode HTML.

    That is the visible text (tags removed, entities decoded) in UTF-16 code units, so an
    emoji counts 2.
    """
    return _utf16(plain_text(markup))


def plain_text(markup: str) -> str:
    """The visible text of Telegram HTML: tags removed, entities decoded."""
    return _MARKUP.sub(_decode, markup)


def split_telegram(markup: str, limit: int = TELEGRAM_LIMIT) -> list[str]:
    """Split Telegram HTML into chunks of at most `limit` visible UTF-16 units each.

    Each chunk is valid HTML on its own: splits never fall inside a tag or an entity, and tags
    open at a split are closed at the end of one chunk and reopened, attributes and all, at the
    start of the next (so a code block stays a code block in both). A split prefers a paragraph
    break, then a line break, then a space, each in the last fifth of the chunk, then any of
    them anywhere in it, else falls anywhere; the separator it uses is dropped. Chunks with no
    visible text besides whitespace are left out, so the chunks' `plain_text`, joined with
    whitespace, is exactly the whole's. Blank input gives []. Raises ValueError if `limit` < 2.
    """
    _check(limit, 2)
    if visible_length(markup) <= limit:
        # One chunk: what the general path below gives, without an atom per character
        # (most replies fit, and for them that was most of the rendering's cost).
        if not plain_text(markup).strip():
            return []
        tags = [_tag(tag) for tag in _TAG.findall(markup)]
        return [markup + "".join(f"</{atom.name}>" for atom in reversed(_nest([], tags)))]
    return _split_atoms(markup, limit)


def _split_atoms(markup: str, limit: int) -> list[str]:
    """`split_telegram` for any length, atom by atom."""
    atoms = _atoms(markup)
    units = [atom.text for atom in atoms]
    widths = [atom.width for atom in atoms]

    def allowed(cut: int) -> bool:
        # A chunk never ends just after an opening tag nor begins with a closing one: that
        # would leave an empty element behind.
        return (cut == 0 or atoms[cut - 1].kind != "open") and (
            cut == len(atoms) or atoms[cut].kind != "close"
        )

    chunks = []
    stack: list[_Atom] = []
    start = 0
    while start < len(atoms):
        end, resume = _cut(units, widths, start, limit, allowed=allowed)
        body = atoms[start:end]
        after = _nest(stack, body)
        if any(unit.strip() for unit in units[start:end]):
            opening = "".join(atom.source for atom in stack)
            closing = "".join(f"</{atom.name}>" for atom in reversed(after))
            chunks.append(opening + "".join(atom.source for atom in body) + closing)
        stack, start = after, resume
        while start < len(atoms) and atoms[start].kind == "close":  # already closed above
            stack = _nest(stack, [atoms[start]])
            start += 1
    return chunks


def _nest(stack: list[_Atom], atoms: Sequence[_Atom]) -> list[_Atom]:
    """The open tags after `atoms`, given those open before; a stray closing tag is ignored."""
    result = list(stack)
    for atom in atoms:
        if atom.kind == "open":
            result.append(atom)
        elif atom.kind == "close":
            for index in range(len(result) - 1, -1, -1):
                if result[index].name == atom.name:
                    del result[index]
                    break
    return result


def split_plain(text: str, limit: int = TELEGRAM_LIMIT) -> list[str]:
    """Split plain text like `split_telegram`, by UTF-16 length: each piece ≤ `limit`.

    A surrogate pair is never split; blank pieces are left out. Raises ValueError if
    `limit` < 2.
    """
    _check(limit, 2)
    units = list(text)
    widths = [_utf16(char) for char in units]
    pieces = []
    start = 0
    while start < len(units):
        end, resume = _cut(units, widths, start, limit, allowed=lambda cut: True)
        if text[start:end].strip():
            pieces.append(text[start:end])
        start = resume
    return pieces


def _cut(
    units: Sequence[str],
    widths: Sequence[int],
    start: int,
    budget: int,
    *,
    allowed: _Cut,
    lenient: _Cut | None = None,
) -> tuple[int, int]:
    """Where the piece beginning at `start` ends, as (end, resume).

    The piece is `units[start:end]`, the next begins at `resume`, and what lies between is the
    dropped separator. Soft breaks and then hard splits are taken where `allowed`; failing those, a
    hard split where `lenient`; failing that, at the budget. The piece's width is at most
    `budget` unless a single unit is wider.
    """
    reach = [0]  # reach[k] = width of units[start : start + k]
    stop = start
    while stop < len(units) and reach[-1] + widths[stop] <= budget:
        reach.append(reach[-1] + widths[stop])
        stop += 1
    if stop == len(units):
        return stop, stop
    # A break in the last fifth first (pieces stay near the budget), then one anywhere: a
    # word is cut only when the piece holds no break at all (a chunk refused as too long and
    # split again is short, and its last fifth often has no space).
    for floor in (max(1, int(budget * _SOFT_WINDOW)), 1):
        for separator in _SEPARATORS:
            size = len(separator)
            for cut in range(stop, start, -1):
                if reach[cut - start] < floor:
                    break
                if "".join(units[cut : cut + size]) == separator and allowed(cut):
                    return cut, cut + size
    for permitted in (allowed, lenient or allowed):
        for cut in range(stop, start, -1):
            if reach[cut - start] > 0 and permitted(cut):
                return cut, cut
    end = max(stop, start + 1)
    return end, end


@dataclass(frozen=True, slots=True)
class _Fence:
    """An open ``` code fence: the marker that closes it and the line that reopens it."""

    marker: str
    info: str

    def reopen(self, limit: int) -> str:
        # A long info string would eat the part it reopens; the language word is what counts.
        line = f"{self.marker}{self.info}\n"
        return line if len(line) <= limit // 4 else f"{self.marker}\n"

    def close(self, body: str) -> str:
        return self.marker if body.endswith("\n") else f"\n{self.marker}"


def _fences(text: str) -> tuple[list[_Fence | None], list[_Fence | None], list[int]]:
    """What cutting `text` at each position 0..len(text) would do to code fences.

    Three lists: the fence a part ending there leaves open (as a reader of that part sees
    it), the fence the next part must reopen, and how good a cut there is (`_CLEAN`;
    `_UGLY`: balanced but odd, such as an empty block; `_NEVER`: would unbalance a part).
    """
    size = len(text) + 1
    ends: list[_Fence | None] = [None] * size
    starts: list[_Fence | None] = [None] * size
    rank = [_CLEAN] * size
    fence: _Fence | None = None
    start = 0
    for line in text.split("\n"):
        end = start + len(line)
        after = _after_line(fence, line)
        ends[start + 1 : end + 1] = _heads(fence, line)
        # The rest of a cut line never starts with ```, so it leaves the state as it was.
        starts[start + 1 : end + 1] = [after] * len(line)
        if end + 1 < size:
            ends[end + 1] = starts[end + 1] = after
        _rank_line(rank, line, start, opens=fence is None and after is not None)
        if fence is not None and after is None:  # a cut just before a closing line empties
            _demote(rank, start - 1, start + 1, _UGLY)  # the block reopened after it
        fence, start = after, end + 1
    return ends, starts, rank


def _after_line(fence: _Fence | None, line: str) -> _Fence | None:
    """The fence open after `line`, given the one open before it."""
    if fence is None:
        opening = _FENCE_OPEN.fullmatch(line)
        return _Fence(opening.group(1), opening.group(2).strip()) if opening else None
    closing = _FENCE_CLOSE.fullmatch(line)
    return None if closing and len(closing.group(1)) >= len(fence.marker) else fence


def _heads(fence: _Fence | None, line: str) -> list[_Fence | None]:
    """The fence open after each head `line[:k]`, k = 1..len(line), as its part reads it.

    A cut can turn a line that starts with ``` into a fence line, or stop it being one.
    """
    lead = _RUN.match(line)
    if lead is None:
        return [fence] * len(line)
    indent, run_end = lead.start(1), lead.end()
    rest = line[run_end:]
    backtick = line.find("`", run_end)
    backtick = len(line) if backtick < 0 else backtick  # a head up to here has no info `
    nonblank = len(line) - len(rest.lstrip(" \t"))  # a head up to here is backticks only
    heads: list[_Fence | None] = []
    for k in range(1, len(line) + 1):
        run = min(k, run_end) - indent
        if fence is None:
            heads.append(_Fence("`" * run, "") if run >= 3 and k <= backtick else None)
        else:
            closes = run >= max(3, len(fence.marker)) and k <= nonblank
            heads.append(None if closes else fence)
    return heads


def _rank_line(rank: list[int], line: str, start: int, *, opens: bool) -> None:
    """Demote the cuts in and around `line`, which begins at `start` and may open a fence."""
    end = start + len(line)
    if _RUN.match(line):
        _demote(rank, start + 1, end, _UGLY)
    if opens:  # a cut right after an opening line leaves an empty block behind
        _demote(rank, end, end + 2, _UGLY)
    for run in _RUN.finditer(line):  # the next part would start with a fence line
        _demote(rank, start + max(run.start(), 1), start + run.end() - 2, _NEVER)


def _demote(rank: list[int], first: int, stop: int, value: int) -> None:
    for cut in range(max(0, first), min(stop, len(rank))):
        rank[cut] = max(rank[cut], value)


def split_discord(markdown: str, limit: int = DISCORD_LIMIT) -> list[str]:
    """Split Markdown into parts of at most `limit` characters (Discord counts `len`).

    Splits prefer a paragraph break, then a line break, then a space (in the last fifth of a
    part, then anywhere in it), else fall anywhere; the separator used is dropped. A part that
    ends inside a ``` fence closes it, and the next part reopens it with the same info string,
    so every part's fences balance (fences are backtick lines, as models write them). Blank
    parts are left out; blank input gives []. Raises ValueError if `limit` < 64.
    """
    _check(limit, 64)
    text = markdown.replace("\r\n", "\n")
    ends, starts, rank = _fences(text)
    units = list(text)
    widths = [1] * len(units)
    parts = []
    start = 0
    while start < len(units):
        fence = starts[start]
        opening = fence.reopen(limit) if fence else ""
        # Keep room to close whichever fence may be open where this part ends.
        window = ends[start : start + limit + 1]
        closing = max((len(f.marker) + 1 for f in window if f is not None), default=0)
        budget = limit - len(opening) - closing
        end, resume = _cut(
            units,
            widths,
            start,
            budget,
            allowed=lambda cut: rank[cut] == _CLEAN,
            lenient=lambda cut: rank[cut] <= _UGLY,
        )
        body = text[start:end]
        # `ends` reads the cut line from its start; a part that begins mid-line and holds no
        # line break reads only the rest of one line, which never is a fence line.
        whole_line = start == 0 or text[start - 1] == "\n" or "\n" in body
        left_open = ends[end] if whole_line else fence
        if body.strip():
            parts.append(opening + body + (left_open.close(body) if left_open else ""))
        start = resume
    return parts


def _check(limit: int, minimum: int) -> None:
    if limit < minimum:
        raise ValueError(f"limit must be at least {minimum}, got {limit}")
