"""Moments as the state database keeps them: ISO 8601 text in UTC with microseconds always,
so that the text sorts in time order."""

from __future__ import annotations

from datetime import UTC, datetime


def wall_clock() -> datetime:
    return datetime.now(UTC)


def to_text(moment: datetime) -> str:
    """`moment` as stored. Raises ValueError for a naive datetime: the store keeps aware
    times only."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"naive datetime {moment.isoformat()}: the store needs aware times")
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def from_text(text: str) -> datetime:
    return datetime.fromisoformat(text)


def now_text() -> str:
    return to_text(wall_clock())
