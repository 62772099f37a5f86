"""A wall clock a test moves by hand, for the stores that stamp and judge times."""

from __future__ import annotations

from datetime import datetime


class Clock:
    """The store's clock, moved by the test (`time`): recorded times are exact."""

    def __init__(self, start: datetime) -> None:
        self.time = start

    def __call__(self) -> datetime:
        return self.time
