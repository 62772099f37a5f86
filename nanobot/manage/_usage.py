"""`nanobot usage`: the usage ledger, summed by day, model, person, chat or source, as a
table, JSON or CSV. Reads while the gateway runs, on either store."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import zoneinfo
from collections.abc import Sequence
from datetime import UTC, date, datetime, time, tzinfo
from typing import Any, Final, Literal

from nanobot import log
from nanobot.config import Config
from nanobot.durations import parse_duration
from nanobot.errors import NanobotError
from nanobot.store import Database, UsageLedger, UsageTotals
from nanobot.store.usage import Grouping, UsageLine

Format = Literal["table", "json", "csv"]
DEFAULT_SINCE: Final = "30d"
UNKNOWN: Final = "price unknown"
_HEADER: Final = ("turns", "prompt", "completion", "cached", "cost_usd")


def since_moment(text: str, zone: tzinfo, now: datetime | None = None) -> datetime:
    """When `--since TEXT` starts: a duration back from now (`7d`, `12h`) or a date
    (`2026-11-01`, from its midnight in `zone`).

    Raises:
        NanobotError: it is neither.
    """
    try:
        day = date.fromisoformat(text.strip())
    except ValueError:
        pass
    else:
        return datetime.combine(day, time(0), zone)
    try:
        back = parse_duration(text.strip())
    except ValueError as exc:
        raise NanobotError(
            f"--since {text!r}: give a duration back from now (7d, 12h) or a date "
            f"(2026-11-01): {exc}"
        ) from None
    return (now or datetime.now(UTC)) - back


def _by_local_day(lines: Sequence[UsageLine], zone: tzinfo) -> list[UsageLine]:
    """Hourly UTC groups summed into the days of `zone`."""
    days: dict[str, UsageTotals] = {}
    for line in lines:
        moment = datetime.fromisoformat(line.key + ":00:00+00:00").astimezone(zone)
        key = moment.date().isoformat()
        days[key] = _plus(days.get(key, UsageTotals()), line.totals)
    return [UsageLine(key, days[key]) for key in sorted(days)]


def _plus(a: UsageTotals, b: UsageTotals) -> UsageTotals:
    return UsageTotals(
        a.runs + b.runs,
        a.prompt_tokens + b.prompt_tokens,
        a.completion_tokens + b.completion_tokens,
        a.cost + b.cost,
        a.cached_tokens + b.cached_tokens,
        a.unpriced + b.unpriced,
    )


def cost_cell(totals: UsageTotals) -> str:
    """A cost as shown: never 0 where a price was unknown."""
    if totals.unpriced and totals.unpriced == totals.runs:
        return UNKNOWN
    figure = f"{totals.cost:.4f}"
    return f"{figure} + {UNKNOWN}" if totals.unpriced else figure


async def _report(config: Config, by: Grouping, since: datetime) -> list[UsageLine]:
    async with await Database.open(config.store_target, check=None) as db:
        ledger = UsageLedger(db)
        if by != "day":
            return await ledger.report(by, since)
        zone = zoneinfo.ZoneInfo(config.timezone) if config.timezone else UTC
        return _by_local_day(await ledger.report("hour", since), zone)


def usage_report(
    config: Config, *, since: str = DEFAULT_SINCE, by: Grouping = "day", fmt: Format = "table"
) -> list[str]:
    """The usage since `since` (see `since_moment`), grouped `by`, with totals, as lines
    to print.

    Raises:
        NanobotError: `since` is not understood, or the store failed.
    """
    log.configure(config, quiet=True)
    zone = zoneinfo.ZoneInfo(config.timezone) if config.timezone else UTC
    start = since_moment(since, zone)
    if not config.shared_store and not config.state_db_path.exists():
        lines: list[UsageLine] = []
    else:
        lines = asyncio.run(_report(config, by, start))
    total = UsageTotals()
    for line in lines:
        total = _plus(total, line.totals)
    return render(lines, total, by=by, since=start, fmt=fmt)


def render(
    lines: Sequence[UsageLine],
    total: UsageTotals,
    *,
    by: Grouping,
    since: datetime,
    fmt: Format,
) -> list[str]:
    """`lines` and `total` in `fmt`."""
    if fmt == "json":
        data = {
            "since": since.isoformat(),
            "by": by,
            "rows": [{by: line.key or None, **_json(line.totals)} for line in lines],
            "total": _json(total),
        }
        return [json.dumps(data, indent=2)]
    rows = [[line.key or "(none)", *_cells(line.totals)] for line in lines]
    rows.append(["total", *_cells(total)])
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([by, *_HEADER])
        writer.writerows(rows)
        return out.getvalue().splitlines()
    table = [[by, *_HEADER], *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    head = f"Usage since {since:%Y-%m-%d %H:%M %Z}".rstrip()
    return [head] + [
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in table
    ]


def _cells(totals: UsageTotals) -> list[str]:
    return [
        str(totals.runs),
        str(totals.prompt_tokens),
        str(totals.completion_tokens),
        str(totals.cached_tokens),
        cost_cell(totals),
    ]


def _json(totals: UsageTotals) -> dict[str, Any]:
    known = not (totals.unpriced and totals.unpriced == totals.runs)
    return {
        "turns": totals.runs,
        "prompt_tokens": totals.prompt_tokens,
        "completion_tokens": totals.completion_tokens,
        "cached_tokens": totals.cached_tokens,
        "cost_usd": round(totals.cost, 6) if known else None,
        "unpriced_turns": totals.unpriced,
    }
