"""What the management commands share: running their work on the store, and the way they
print tables, times and names chosen by others."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from zoneinfo import ZoneInfo

from nanobot import log
from nanobot.config import Config
from nanobot.store import Database


def on_store(
    config: Config, work: Callable[[Database], Awaitable[tuple[list[str], bool]]]
) -> tuple[list[str], bool]:
    """Run `work` on the state database (created if missing); its lines and success."""

    async def run() -> tuple[list[str], bool]:
        config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        async with await Database.open(config.store_target) as db:
            return await work(db)

    return asyncio.run(run())


def config_zone(config: Config) -> ZoneInfo | None:
    """The zone times are shown in: the config's `timezone`, else the machine's."""
    return ZoneInfo(config.timezone) if config.timezone else None


def when(moment: datetime, zone: ZoneInfo | None) -> str:
    """A moment as a listing shows it: to the minute, in `zone` (None: the machine's)."""
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z")


def table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """`rows` (the header first) as lines of left-aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def shown(name: str | None, missing: str = "?") -> str:
    """A chat user's display name, chosen by them: escaped so it cannot move the cursor or
    pose as another line of the listing."""
    return log.printable(name) if name else missing
