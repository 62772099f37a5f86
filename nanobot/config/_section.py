"""What every config section shares: the base class and the duration form."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, ConfigDict

from nanobot.durations import parse_duration


class Section(BaseModel):
    """A config section: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def duration(value: object) -> object:
    """A duration in the syntax of nanobot.durations (`10m`, `1h30m`); a plain number is
    seconds, as pydantic reads one."""
    if isinstance(value, str) and value.strip().isdigit():
        return timedelta(seconds=int(value))
    if isinstance(value, str):
        return parse_duration(value)
    return value


def lowered(value: object) -> object:
    """`value` trimmed and in lower case when it is text (a policy word such as `Ask `)."""
    return value.strip().lower() if isinstance(value, str) else value


def positive(value: timedelta) -> timedelta:
    """`value`, a duration that must be longer than zero.

    Raises:
        ValueError: it is zero or negative (pydantic names the key).
    """
    if value <= timedelta(0):
        raise ValueError("must be longer than zero (e.g. 10m)")
    return value
