"""`?` placeholders, as the stores write them, in PostgreSQL's numbered form (`$1`, `$2`, …)."""

from __future__ import annotations

from functools import lru_cache
from typing import Final

_CACHED: Final = 1024  # distinct statements: the stores have a few hundred


@lru_cache(maxsize=_CACHED)
def numbered(sql: str) -> str:
    """`sql` with each `?` outside string literals, quoted identifiers and comments replaced
    by `$1`, `$2`, … in order. Raises ValueError if a literal, identifier or comment is left
    open (the statement would fail anyway, with a less clear message)."""
    out: list[str] = []
    count = 0
    i, end = 0, len(sql)
    while i < end:
        char = sql[i]
        if char == "?":
            count += 1
            out.append(f"${count}")
            i += 1
            continue
        close = _closing(sql, i)
        if close is None:
            out.append(char)
            i += 1
            continue
        stop = sql.find(close, i + 1 if close != "*/" else i + 2)
        if stop < 0:
            if close == "\n":  # a comment that runs to the end
                out.append(sql[i:])
                break
            raise ValueError(f"unterminated {_NAMES[close]} in SQL: {sql[i : i + 40]!r}")
        # A doubled quote inside a literal ends it and starts another at once: the same text.
        out.append(sql[i : stop + len(close)])
        i = stop + len(close)
    return "".join(out)


_NAMES: Final = {"'": "string literal", '"': "quoted identifier", "*/": "comment"}


def _closing(sql: str, i: int) -> str | None:
    """What ends the literal, identifier or comment that starts at `sql[i]`, if one does."""
    char = sql[i]
    if char in "'\"":
        return char
    pair = sql[i : i + 2]
    if pair == "--":
        return "\n"
    if pair == "/*":
        return "*/"
    return None
