"""Sizes as people write them in the config file: a number and a unit, `512MB`, `1GB`,
`1.5 GB`, `64KiB`.

Units are binary, as memory and most tools count them (systemd's `MemoryMax=1G`, Docker's
`--memory 1g`): 1 KB = 1 KiB = 1024 bytes, MB = 1024 KB, GB = 1024 MB, TB = 1024 GB. `B` is
bytes. The case of the unit does not matter; a bare number is refused, since "1024" could
mean bytes or megabytes.
"""

from __future__ import annotations

import math
import re
from typing import Final

_UNITS: Final = {"b": 0, "k": 1, "m": 2, "g": 3, "t": 4}
_SYNTAX: Final = re.compile(r"(?P<amount>\d+(?:\.\d+)?)\s*(?P<unit>b|[kmgt](?:i?b)?)", re.I)


class SizeError(ValueError):
    """The text is not a size; the message quotes it and shows the syntax."""


def parse_size(text: str) -> int:
    """The number of bytes `text` means (rounded down to a whole byte). Raises `SizeError`
    for anything else: a bare number, an unknown unit, a negative or infinite amount."""
    match = _SYNTAX.fullmatch(text.strip())
    if match is None:
        raise SizeError(
            f"{text!r} is not a size: use a number and a unit (B, KB, MB, GB, TB; 1 KB = "
            "1024 bytes), e.g. '512MB' or '1GB'"
        )
    amount = float(match["amount"]) * 1024 ** _UNITS[match["unit"][0].lower()]
    if not math.isfinite(amount) or amount >= 2**63:
        raise SizeError(f"{text!r} is not a size: it is too large")
    return int(amount)


def format_size(size: int) -> str:
    """`size` bytes the way `parse_size` reads them back, in the largest unit that keeps
    it readable: 1073741824 -> "1 GB", 1536 * 2**20 -> "1.5 GB", 100 -> "100 B"."""
    for unit in ("TB", "GB", "MB", "KB"):
        scale = 1024 ** _UNITS[unit[0].lower()]
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} B"
