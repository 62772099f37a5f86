"""Durations as people write them, one syntax for the config file and `nanobot cron`.

A number with a unit, `d`, `h`, `m` or `s`, each at most once and in that order, optionally
separated by spaces: `30s`, `10m`, `2h`, `1d`, `1h30m`, `1h 30m`, `1.5h`.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Final

_UNITS: Final = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SYNTAX: Final = re.compile(
    r"(?:(?P<d>\d+(?:\.\d+)?)d)?\s*(?:(?P<h>\d+(?:\.\d+)?)h)?\s*"
    r"(?:(?P<m>\d+(?:\.\d+)?)m)?\s*(?:(?P<s>\d+(?:\.\d+)?)s)?"
)


class DurationError(ValueError):
    """The text is not a duration; the message quotes it and shows the syntax."""


def parse_duration(text: str) -> timedelta:
    """The duration `text` means. Raises `DurationError` for anything else (a bare number, an
    unknown unit, units out of order or repeated, a negative or infinite amount)."""
    cleaned = text.strip()
    match = _SYNTAX.fullmatch(cleaned)
    if not cleaned or match is None or not any(match.groupdict().values()):
        raise DurationError(
            f"{text!r} is not a duration: use a number and a unit (s, m, h, d),"
            " e.g. '30s', '10m' or '1h30m'"
        )
    seconds = sum(float(value) * _UNITS[unit] for unit, value in match.groupdict().items() if value)
    if not math.isfinite(seconds) or seconds > timedelta.max.total_seconds():
        raise DurationError(f"{text!r} is not a duration: it is too long")
    return timedelta(seconds=seconds)
