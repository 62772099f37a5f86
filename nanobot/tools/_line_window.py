"""A window of a text file's lines, within a size budget: what `read_file` shows of a file.
Pure over a binary stream; the tool opens the file and says what was shown."""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO


@dataclass(frozen=True, slots=True)
class Window:
    """Lines `first`..`last` of a file of `total` lines, as `text`."""

    text: str
    first: int
    last: int  # 0 when nothing was shown
    total: int
    cut_line: bool  # the last line shown was longer than the budget and was cut


def read_window(f: BinaryIO, start: int, end: int | None, max_lines: int, budget: int) -> Window:
    """Lines `start`..`end` of `f`, as many as fit in `max_lines` and `budget` characters.

    Reads the whole file to count its lines, but holds at most one bounded line at a time.
    """
    parts: list[str] = []
    used = last = total = 0
    full = cut_line = False
    for lineno, (raw, longer) in enumerate(_bounded_lines(f, budget * 4), 1):
        total = lineno
        if full or lineno < start or (end is not None and lineno > end):
            continue
        text = codecs.getincrementaldecoder("utf-8")().decode(raw, final=not longer)
        cut = longer
        if used + len(text) > budget or len(parts) == max_lines:
            if parts:
                full = True
                continue
            text, cut = text[:budget], True  # a single line larger than the whole budget
        parts.append(text)
        used += len(text)
        last, cut_line = lineno, cut
        full = cut
    return Window("".join(parts), start, last, total, cut_line)


def _bounded_lines(f: BinaryIO, limit: int) -> Iterator[tuple[bytes, bool]]:
    """Each line of `f`, at most `limit` bytes of it, and whether the line was longer."""
    while raw := f.readline(limit):
        longer = False
        if len(raw) == limit and not raw.endswith(b"\n"):
            # Skip the rest of this line without holding it in memory.
            while rest := f.readline(limit):
                longer = True
                if rest.endswith(b"\n"):
                    break
        yield raw, longer
