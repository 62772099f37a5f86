"""`next_run` against an independent cron implementation: crondst, built to Vixie cron's rules.

Two full years, zones of many kinds (northern and southern hemisphere, changes at midnight,
half-hour offsets, 30-minute daylight saving at Lord Howe, Ramadan steps, no change at all)
and expressions with steps, lists, ranges and both day fields. The one rule where nanobot
differs by design, croniter's reading of the day fields, is encoded in the comparison: the
oracle gets the expression with `*`-prefixed day fields spelled out.

crondst assumes every clock change is one hour long and happens on the hour; where that does
not hold (Pacific/Chatham at :45, Antarctica/Troll's two hours) it loops or skips runs, so
those zones are checked against the brute force in test_cron_schedule.py instead.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from crondst import CronDst

from nanobot.cron import Cron, next_run

START = datetime(2025, 1, 1, tzinfo=UTC)
END = datetime(2027, 1, 1, tzinfo=UTC)

ZONES = [
    "Europe/Berlin",
    "Europe/London",
    "America/New_York",
    "America/Havana",  # changes at midnight
    "America/St_Johns",  # -03:30
    "America/Santiago",  # southern hemisphere, changes at midnight
    "America/Sao_Paulo",  # no change since 2019
    "Australia/Sydney",
    "Australia/Lord_Howe",  # 30-minute change
    "Pacific/Auckland",
    "Asia/Kolkata",  # +05:30, no change
    "Asia/Tehran",  # no change since 2022
    "Africa/Casablanca",  # steps back for Ramadan
    "UTC",
]
# Up to a few runs a day: compared over the full two years.
SPARSE = [
    "30 2 * * *",
    "0 2 * * *",
    "59 1 * * *",
    "0 0 * * *",
    "15 1,2,3 * * 0",
    "45 0-5/2 1,15 * *",
    "0 1 * * mon-fri",
    "30 1 1 * 0",
    "0 0 */2 * 1",
    "0 12 * * */2",
    "5 4 * 3,4,9,10 *",
    "0 9 29 2 *",
]
# Many runs a day: compared for two days around every clock change, and on two plain days.
DENSE = ["*/20 * * * *", "* 2 * * *", "0 */2 * * *", "*/30 1-3 * * *", "10,50 * * * *"]


def oracle_expression(expr: str) -> str:
    """The expression crondst should get to mean what nanobot means: croniter counts a day
    field such as `*/2` as restricted (either day may match); Vixie cron only a field that
    does not start with `*`."""
    fields = expr.split()
    for index, full in ((2, "1-31"), (4, "0-6")):
        if fields[index].startswith("*/"):
            fields[index] = full + fields[index][1:]
    return " ".join(fields)


def ours(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    found: list[datetime] = []
    after = start
    while (following := next_run(Cron(expr, tz), after)) is not None and following < end:
        found.append(following)
        after = following
    return found


def theirs(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    found: list[datetime] = []
    for moment in CronDst(oracle_expression(expr)).iter(start.astimezone(ZoneInfo(tz))):
        instant = moment.astimezone(UTC)
        if instant >= end:
            break
        found.append(instant)
    return found


def disagreement(expr: str, tz: str, start: datetime, end: datetime) -> str | None:
    """Where the two first differ (a short message, not a diff of thousands of times)."""
    mine, other = ours(expr, tz, start, end), theirs(expr, tz, start, end)
    if mine == other:
        return None
    index = next((i for i, (a, b) in enumerate(zip(mine, other, strict=False)) if a != b), None)
    index = min(len(mine), len(other)) if index is None else index
    shown = [
        [moment.astimezone(ZoneInfo(tz)).isoformat() for moment in times[index : index + 3]]
        for times in (mine, other)
    ]
    return f"from run {index}: ours {shown[0]}, crondst {shown[1]}"


@functools.cache
def changes(tz: str) -> tuple[datetime, ...]:
    """The instants (to the hour) in the two years at which the zone's offset changes."""
    zone, found, moment = ZoneInfo(tz), [], START
    offset = moment.astimezone(zone).utcoffset()
    while moment < END:
        moment += timedelta(hours=1)
        if (now := moment.astimezone(zone).utcoffset()) != offset:
            found.append(moment)
            offset = now
    return tuple(found)


def windows(tz: str) -> Iterator[tuple[datetime, datetime]]:
    for change in changes(tz):
        yield change - timedelta(days=1), change + timedelta(days=1)
    for plain in (datetime(2025, 7, 14, tzinfo=UTC), datetime(2026, 1, 20, tzinfo=UTC)):
        yield plain, plain + timedelta(days=1)


def test_the_table_has_changes_of_every_kind() -> None:
    assert len(changes("Australia/Lord_Howe")) == 4
    assert len(changes("America/Santiago")) == 4
    assert changes("Asia/Kolkata") == changes("UTC") == ()


@pytest.mark.parametrize("expr", SPARSE)
@pytest.mark.parametrize("tz", ZONES)
def test_two_years_agree(expr: str, tz: str) -> None:
    assert disagreement(expr, tz, START, END) is None


@pytest.mark.parametrize("expr", DENSE)
@pytest.mark.parametrize("tz", ZONES)
def test_every_clock_change_agrees(expr: str, tz: str) -> None:
    for start, end in windows(tz):
        assert disagreement(expr, tz, start, end) is None, start.isoformat()


@pytest.mark.parametrize(
    ("expr", "spelled"),
    [
        ("0 0 */2 * 1", "0 0 1-31/2 * 1"),
        ("0 12 * * */2", "0 12 * * 0-6/2"),
        ("*/5 */2 * * *", "*/5 */2 * * *"),  # only the day fields
        ("0 0 * * 1", "0 0 * * 1"),
    ],
)
def test_oracle_expression(expr: str, spelled: str) -> None:
    assert oracle_expression(expr) == spelled
