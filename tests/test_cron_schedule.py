"""The schedule vocabulary and arithmetic, table-tested; DST days checked against brute force."""

from __future__ import annotations

import functools
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from nanobot.cron import (
    At,
    CatchUp,
    Cron,
    Every,
    Schedule,
    ScheduleError,
    catch_up,
    describe,
    format_interval,
    next_run,
    parse_at,
    parse_cron,
    parse_every,
    system_zone,
    validate,
)
from nanobot.cron.schedule import format_time, realign, zone_of

NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def utc(text: str) -> datetime:
    """An ISO time with an offset, as the UTC instant next_run returns."""
    moment = datetime.fromisoformat(text)
    assert moment.tzinfo is not None
    return moment.astimezone(UTC)


def runs(schedule: Schedule, after: datetime, count: int) -> list[datetime]:
    found: list[datetime] = []
    while len(found) < count:
        following = next_run(schedule, after)
        assert following is not None
        found.append(following)
        after = following
    return found


# --- every ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1),
        ("30s", 30),
        ("90s", 90),
        ("10m", 600),
        ("2h", 7200),
        ("1d", 86400),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("1d2h3m4s", 93784),
        ("1.5h", 5400),
        ("0.5m", 30),
        ("  10m ", 600),
        ("366d", 366 * 86400),
    ],
)
def test_parse_every(text: str, seconds: float) -> None:
    assert parse_every(text) == Every(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "use a number and a unit"),
        ("   ", "use a number and a unit"),
        ("10", "use a number and a unit"),
        ("m", "use a number and a unit"),
        ("10x", "use a number and a unit"),
        ("10M", "use a number and a unit"),
        ("-5m", "use a number and a unit"),
        ("1m1h", "use a number and a unit"),
        ("10m10m", "use a number and a unit"),
        ("1h30", "use a number and a unit"),
        ("every 10m", "use a number and a unit"),
        ("infs", "use a number and a unit"),
        ("0s", "at least 1 second"),
        ("0m", "at least 1 second"),
        ("0.5s", "at least 1 second"),
        ("367d", "at most 366 days"),
    ],
)
def test_parse_every_refuses(text: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message) as caught:
        parse_every(text)
    assert repr(text) in str(caught.value)


def test_parse_every_keeps_the_anchor() -> None:
    assert parse_every("2h", anchor=NOW) == Every(7200, NOW)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1, "1s"), (30, "30s"), (600, "10m"), (5400, "1h30m"), (93784, "1d2h3m4s"), (1.5, "1.5s")],
)
def test_format_interval(seconds: float, text: str) -> None:
    assert format_interval(seconds) == text


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        # No anchor: the grid starts at the Unix epoch, so 10m lands on :00, :10, … UTC.
        (Every(600), "2026-06-15T12:00:00+00:00", "2026-06-15T12:10:00+00:00"),
        (Every(600), "2026-06-15T12:04:59+00:00", "2026-06-15T12:10:00+00:00"),
        (Every(600), "2026-06-15T12:09:59.999999+00:00", "2026-06-15T12:10:00+00:00"),
        (Every(3600), "2026-06-15T14:30:00+02:00", "2026-06-15T13:00:00+00:00"),
        # An anchor fixes the phase, in both directions.
        (Every(7200, utc("2026-06-15T12:17:00+00:00")), "2026-06-15T12:17:00+00:00",
         "2026-06-15T14:17:00+00:00"),
        (Every(7200, utc("2026-06-15T12:17:00+00:00")), "2026-06-16T00:00:00+00:00",
         "2026-06-16T00:17:00+00:00"),
        (Every(7200, utc("2026-06-15T12:17:00+00:00")), "2026-06-15T09:00:00+00:00",
         "2026-06-15T10:17:00+00:00"),
        # A year of 7-second steps later, still exactly on the grid.
        (Every(7, utc("2026-01-01T00:00:00+00:00")), "2027-01-01T00:00:00+00:00",
         "2027-01-01T00:00:01+00:00"),  # 365 d = 7 s × 4505142 + 6 s
        (Every(1.5), "2026-06-15T12:00:00+00:00", "2026-06-15T12:00:01.500000+00:00"),
    ],
)  # fmt: skip
def test_next_every(schedule: Every, after: str, expected: str) -> None:
    result = next_run(schedule, datetime.fromisoformat(after))
    assert result == utc(expected)
    assert result is not None and result.tzinfo is UTC


def test_every_ignores_dst() -> None:
    # Elapsed time, not wall time: an hourly job runs 3 times across Berlin's 3-hour
    # fall-back night (01:00 to 03:00 on the wall, 02:xx twice).
    start = datetime(2026, 10, 25, 1, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    walls = [t.astimezone(ZoneInfo("Europe/Berlin")).isoformat() for t in
             runs(Every(3600, start), start, 3)]  # fmt: skip
    assert walls == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]


# --- at ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tz", "expected"),
    [
        ("2026-12-01T09:00+01:00", None, "2026-12-01T08:00:00+00:00"),
        ("2026-12-01T09:00:30-05:00", None, "2026-12-01T14:00:30+00:00"),
        ("2026-12-01T09:00Z", None, "2026-12-01T09:00:00+00:00"),
        ("2026-12-01 09:00+05:30", None, "2026-12-01T03:30:00+00:00"),
        # An explicit offset wins over the zone.
        ("2026-12-01T09:00+01:00", "America/New_York", "2026-12-01T08:00:00+00:00"),
        # A naive time is wall-clock time in the zone, in winter and in summer.
        ("2026-12-01T09:00", "Europe/Berlin", "2026-12-01T08:00:00+00:00"),
        ("2026-07-01T09:00", "Europe/Berlin", "2026-07-01T07:00:00+00:00"),
        ("2026-07-01T09:00", "Asia/Kolkata", "2026-07-01T03:30:00+00:00"),
        ("2026-07-01", "UTC", "2026-07-01T00:00:00+00:00"),
        # 02:30 does not exist in Berlin on 29 March: the first instant after the gap.
        ("2026-03-29T02:30", "Europe/Berlin", "2026-03-29T03:00:00+02:00"),
        ("2026-03-08T02:30", "America/New_York", "2026-03-08T03:00:00-04:00"),
        ("2026-10-04T02:10", "Australia/Lord_Howe", "2026-10-04T02:30:00+11:00"),
        # 02:30 happens twice on 25 October: the first time.
        ("2026-10-25T02:30", "Europe/Berlin", "2026-10-25T02:30:00+02:00"),
        ("2026-11-01T01:30", "America/New_York", "2026-11-01T01:30:00-04:00"),
    ],
)
def test_parse_at(text: str, tz: str | None, expected: str) -> None:
    at = parse_at(text, tz)
    assert at.when == utc(expected)
    assert next_run(at, datetime(2026, 1, 1, tzinfo=UTC)) == utc(expected)


def test_parse_at_keeps_the_wall_clock_offset() -> None:
    at = parse_at("2026-10-25T02:30", BERLIN)  # the first 02:30 that day
    assert at.when.isoformat() == "2026-10-25T02:30:00+02:00"
    assert at.when == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    assert describe(at) == "at 2026-10-25T02:30+02:00"


@pytest.mark.parametrize(
    ("text", "tz", "message"),
    [
        ("tomorrow", None, "bad 'at' time 'tomorrow': use ISO 8601"),
        ("2026-13-01T09:00+01:00", None, "bad 'at' time"),
        ("", "UTC", "bad 'at' time"),
        ("2026-12-01T09:00", None, "'at' time '2026-12-01T09:00' has no UTC offset"),
        ("2026-12-01T09:00", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
    ],
)
def test_parse_at_refuses(text: str, tz: str | None, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        parse_at(text, tz)


@pytest.mark.parametrize(
    ("when", "after", "expected"),
    [
        ("2026-12-01T09:00+01:00", "2026-12-01T07:59:59+00:00", "2026-12-01T08:00:00+00:00"),
        ("2026-12-01T09:00+01:00", "2026-12-01T08:00:00+00:00", None),
        ("2026-12-01T09:00+01:00", "2026-12-02T00:00:00+00:00", None),
    ],
)
def test_next_at(when: str, after: str, expected: str | None) -> None:
    result = next_run(At(datetime.fromisoformat(when)), datetime.fromisoformat(after))
    assert result == (None if expected is None else utc(expected))


def test_naive_times_are_refused() -> None:
    with pytest.raises(ScheduleError, match="has no time zone"):
        At(datetime(2026, 12, 1, 9, 0))  # noqa: DTZ001
    with pytest.raises(ScheduleError, match="has no time zone"):
        Every(60, datetime(2026, 12, 1, 9, 0))  # noqa: DTZ001
    with pytest.raises(ValueError, match="naive"):
        next_run(Every(60), datetime(2026, 12, 1, 9, 0))  # noqa: DTZ001


# --- cron ----------------------------------------------------------------------------------

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
LORD_HOWE = "Australia/Lord_Howe"  # moves by 30 minutes: 02:00 → 02:30 and 02:00 → 01:30


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [
        # Plain days.
        ("0 9 * * *", "UTC", "2026-06-15T08:59:59.999999+00:00",
         ["2026-06-15T09:00+00:00", "2026-06-16T09:00+00:00"]),
        ("0 9 * * *", "UTC", "2026-06-15T09:00:00+00:00", ["2026-06-16T09:00+00:00"]),
        ("0 9 * * *", "UTC", "2026-06-15T09:00:00.5+00:00", ["2026-06-16T09:00+00:00"]),
        ("0 9 * * 1-5", BERLIN, "2026-03-06T10:00+01:00",  # a Friday
         ["2026-03-09T09:00+01:00", "2026-03-10T09:00+01:00"]),
        ("0 9 * * mon-fri", BERLIN, "2026-03-06T08:00+01:00",
         ["2026-03-06T09:00+01:00", "2026-03-09T09:00+01:00"]),
        ("0 9 * * 1-5", "Asia/Kolkata", "2026-03-06T10:00+05:30",
         ["2026-03-09T09:00+05:30", "2026-03-10T09:00+05:30"]),
        ("30 18 * * *", "Asia/Kolkata", "2026-06-15T12:00+00:00",
         ["2026-06-15T18:30+05:30", "2026-06-16T18:30+05:30"]),
        ("0 9 * * *", NEW_YORK, "2026-06-15T12:00+00:00",
         ["2026-06-15T09:00-04:00", "2026-06-16T09:00-04:00"]),
        ("*/15 * * * *", "UTC", "2026-06-15T12:07+00:00",
         ["2026-06-15T12:15+00:00", "2026-06-15T12:30+00:00"]),
        # Month ends and leap days.
        ("0 0 31 * *", "UTC", "2026-01-31T00:00+00:00",
         ["2026-03-31T00:00+00:00", "2026-05-31T00:00+00:00", "2026-07-31T00:00+00:00",
          "2026-08-31T00:00+00:00"]),
        ("0 0 29 2 *", BERLIN, "2026-01-01T00:00+01:00", ["2028-02-29T00:00+01:00"]),
        ("0 12 1 1 *", "UTC", "2026-12-31T23:59+00:00", ["2027-01-01T12:00+00:00"]),
        # Spring forward, Berlin 29 March 2026: 02:00 CET becomes 03:00 CEST.
        ("30 2 * * *", BERLIN, "2026-03-27T12:00+01:00",
         ["2026-03-28T02:30+01:00", "2026-03-29T03:00+02:00", "2026-03-30T02:30+02:00"]),
        ("0 2 * * *", BERLIN, "2026-03-28T12:00+01:00",
         ["2026-03-29T03:00+02:00", "2026-03-30T02:00+02:00"]),
        # A `*` in the minute field follows the clock too: nothing in the missing hour.
        ("*/15 2 * * *", BERLIN, "2026-03-29T00:00+01:00",
         ["2026-03-30T02:00+02:00", "2026-03-30T02:15+02:00"]),
        ("* 2 * * *", BERLIN, "2026-03-29T01:58+01:00",
         ["2026-03-30T02:00+02:00", "2026-03-30T02:01+02:00"]),
        ("0 3 * * *", BERLIN, "2026-03-29T00:00+01:00",
         ["2026-03-29T03:00+02:00", "2026-03-30T03:00+02:00"]),
        ("30 * * * *", BERLIN, "2026-03-29T01:00+01:00",
         ["2026-03-29T01:30+01:00", "2026-03-29T03:30+02:00"]),
        ("10,50 * * * *", BERLIN, "2026-03-29T01:00+01:00",
         ["2026-03-29T01:10+01:00", "2026-03-29T01:50+01:00", "2026-03-29T03:10+02:00"]),
        ("*/30 * * * *", BERLIN, "2026-03-29T00:45+01:00",
         ["2026-03-29T01:00+01:00", "2026-03-29T01:30+01:00", "2026-03-29T03:00+02:00",
          "2026-03-29T03:30+02:00"]),
        # Fall back, Berlin 25 October 2026: 03:00 CEST becomes 02:00 CET.
        ("30 2 * * *", BERLIN, "2026-10-23T12:00+02:00",
         ["2026-10-24T02:30+02:00", "2026-10-25T02:30+02:00", "2026-10-26T02:30+01:00"]),
        ("*/30 * * * *", BERLIN, "2026-10-25T01:45+02:00",
         ["2026-10-25T02:00+02:00", "2026-10-25T02:30+02:00", "2026-10-25T02:00+01:00",
          "2026-10-25T02:30+01:00", "2026-10-25T03:00+01:00"]),
        ("0 */2 * * *", BERLIN, "2026-10-25T01:00+02:00",
         ["2026-10-25T02:00+02:00", "2026-10-25T02:00+01:00", "2026-10-25T04:00+01:00"]),
        # Starting inside the second 02:xx: a fixed-time job already ran in the first.
        ("50 2 * * *", BERLIN, "2026-10-25T02:40+01:00", ["2026-10-26T02:50+01:00"]),
        ("10 2 * * *", BERLIN, "2026-10-25T02:05+01:00", ["2026-10-26T02:10+01:00"]),
        ("*/20 * * * *", BERLIN, "2026-10-25T02:40+01:00", ["2026-10-25T03:00+01:00"]),
        ("*/20 * * * *", BERLIN, "2026-10-25T02:45+02:00",
         ["2026-10-25T02:00+01:00", "2026-10-25T02:20+01:00"]),
        # New York, 8 March 2026 (02:00 EST → 03:00 EDT) and 1 November (02:00 EDT → 01:00 EST).
        ("30 2 * * *", NEW_YORK, "2026-03-07T12:00-05:00",
         ["2026-03-08T03:00-04:00", "2026-03-09T02:30-04:00"]),
        ("0 2 * * *", NEW_YORK, "2026-03-07T12:00-05:00",
         ["2026-03-08T03:00-04:00", "2026-03-09T02:00-04:00"]),
        ("30 1 * * *", NEW_YORK, "2026-10-31T12:00-04:00",
         ["2026-11-01T01:30-04:00", "2026-11-02T01:30-05:00"]),
        ("*/30 1 * * *", NEW_YORK, "2026-11-01T00:59-04:00",
         ["2026-11-01T01:00-04:00", "2026-11-01T01:30-04:00", "2026-11-01T01:00-05:00",
          "2026-11-01T01:30-05:00", "2026-11-02T01:00-05:00"]),
        ("0 * * * *", NEW_YORK, "2026-10-31T23:30-04:00",
         ["2026-11-01T00:00-04:00", "2026-11-01T01:00-04:00", "2026-11-01T01:00-05:00",
          "2026-11-01T02:00-05:00"]),
        ("0 9 * * *", NEW_YORK, "2026-03-07T12:00-05:00",
         ["2026-03-08T09:00-04:00", "2026-03-09T09:00-04:00"]),
        # Lord Howe: half-hour changes. 4 Oct 2026 02:00 → 02:30; 5 Apr 2026 02:00 → 01:30.
        ("15 2 * * *", LORD_HOWE, "2026-10-03T12:00+10:30",
         ["2026-10-04T02:30+11:00", "2026-10-05T02:15+11:00"]),
        ("45 1 * * *", LORD_HOWE, "2026-04-04T12:00+11:00",
         ["2026-04-05T01:45+11:00", "2026-04-06T01:45+10:30"]),
        ("*/20 * * * *", LORD_HOWE, "2026-04-05T01:10+11:00",
         ["2026-04-05T01:20+11:00", "2026-04-05T01:40+11:00", "2026-04-05T01:40+10:30",
          "2026-04-05T02:00+10:30"]),
    ],
)  # fmt: skip
def test_next_cron(expr: str, tz: str, after: str, expected: list[str]) -> None:
    found = runs(Cron(expr, tz), datetime.fromisoformat(after), len(expected))
    assert found == [utc(text) for text in expected]
    assert all(moment.tzinfo is UTC for moment in found)


def test_next_cron_of_an_impossible_date_is_none() -> None:
    assert next_run(Cron("0 0 30 2 *", "UTC"), NOW) is None


# Brute force: walk every UTC minute around each clock change, read the wall clock, and apply
# the rules of nanobot.cron.schedule's docstring directly; next_run must agree everywhere.

TRANSITIONS = [
    (BERLIN, "2026-03-29T01:00+00:00"),
    (BERLIN, "2026-10-25T01:00+00:00"),
    (NEW_YORK, "2026-03-08T07:00+00:00"),
    (NEW_YORK, "2026-11-01T06:00+00:00"),
    (LORD_HOWE, "2026-04-04T15:00+00:00"),
    (LORD_HOWE, "2026-10-03T15:30+00:00"),
    ("Pacific/Chatham", "2026-04-04T14:00+00:00"),  # 03:45 → 02:45
    ("Pacific/Chatham", "2026-09-26T14:00+00:00"),  # 02:45 → 03:45
    ("Antarctica/Troll", "2026-03-29T01:00+00:00"),  # 01:00 → 03:00
    ("Antarctica/Troll", "2026-10-25T01:00+00:00"),  # 03:00 → 01:00
    ("Asia/Kolkata", "2026-03-29T01:00+00:00"),  # no change at all
]
EXPRESSIONS = [
    "30 2 * * *",
    "0 2 * * *",
    "59 1 * * *",
    "45 1 * * *",
    "0 3 * * *",
    "* 2 * * *",
    "*/20 1-3 * * *",
    "*/30 1 * * *",
    "0,30 2 * * *",
    "5 0 * * 0",
    "*/15 * * * *",
    "*/20 * * * *",
    "30 * * * *",
    "10,50 * * * *",
    "0 */2 * * *",
    "15 1,2,3 * * *",
]


@functools.cache
def _fields(expr: str) -> list[list[int | str]]:
    fields: list[list[int | str]] = croniter(expr, NOW).expanded
    return fields


def _matches(expr: str, wall: datetime) -> bool:
    minutes, hours, days, months, weekdays = _fields(expr)
    weekday = (wall.weekday() + 1) % 7  # cron counts from Sunday

    def within(values: list[int | str], value: int) -> bool:
        return values == ["*"] or value in values

    if days != ["*"] and weekdays != ["*"]:  # cron's rule: either day field may match
        day_ok = within(days, wall.day) or within(weekdays, weekday)
    else:
        day_ok = within(days, wall.day) and within(weekdays, weekday)
    return (
        within(minutes, wall.minute)
        and within(hours, wall.hour)
        and within(months, wall.month)
        and day_ok
    )


def brute_force(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    zone = ZoneInfo(tz)
    fixed_time = not any(field.startswith("*") for field in expr.split()[:2])
    found: set[datetime] = set()
    seen: set[datetime] = set()
    previous: datetime | None = None
    moment = start - timedelta(hours=3)
    while moment < end:
        wall = moment.astimezone(zone).replace(tzinfo=None)
        if moment >= start:
            # A wall time seen before is the clock's second pass: fixed-time jobs ran already.
            if _matches(expr, wall) and not (fixed_time and wall in seen):
                found.add(moment)
            # Wall minutes the clock jumped over: fixed-time jobs run once it is past them.
            skipped = previous + MINUTE if previous is not None else wall
            while fixed_time and skipped < wall:
                if _matches(expr, skipped):
                    found.add(moment)
                skipped += MINUTE
        seen.add(wall)
        previous = wall
        moment += MINUTE
    return sorted(found)


@pytest.mark.parametrize("expr", EXPRESSIONS)
@pytest.mark.parametrize(("tz", "change"), TRANSITIONS)
def test_next_cron_agrees_with_brute_force(expr: str, tz: str, change: str) -> None:
    start = utc(change) - timedelta(hours=4)
    end = utc(change) + timedelta(hours=4)
    expected = brute_force(expr, tz, start, end)
    schedule = Cron(expr, tz)

    chain: list[datetime] = []
    after = start - timedelta(microseconds=1)
    while (following := next_run(schedule, after)) is not None and following < end:
        chain.append(following)
        after = following
    assert chain == expected

    after = start
    while after < end - timedelta(hours=1):
        following = next_run(schedule, after)
        assert following is not None
        want = next((t for t in expected if t > after), None)
        if want is not None:
            assert following == want, after.isoformat()
        after += timedelta(minutes=7, seconds=30)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        (
            "61 * * * *",
            "bad cron expression '61 \\* \\* \\* \\*': the minute field '61' is not valid",
        ),
        ("0 24 * * *", "the hour field '24' is not valid \\(0-23\\)"),
        ("0 0 0 * *", "the day-of-month field '0' is not valid"),
        ("0 0 * 13 *", "the month field '13' is not valid"),
        ("0 0 * * 8", "the day-of-week field '8' is not valid"),
        ("*/0 * * * *", "the minute field '\\*/0' is not valid"),
        ("a b c d e", "the minute field 'a' is not valid"),
        ("H * * * *", "the minute field 'H' is not valid"),
        ("* * * *", "it needs 5 fields .* not 4"),
        ("0 0 * * * *", "it needs 5 fields .* not 6"),
        ("@daily", "it needs 5 fields .* not 1"),
        ("", "it needs 5 fields .* not 0"),
        ("0 0 30 2 *", "bad cron expression '0 0 30 2 \\*': it matches no date"),
        ("0 0 31 4,6,9,11 *", "it matches no date"),
    ],
)
def test_validate_refuses_bad_cron(expr: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        validate(Cron(expr, "UTC"), NOW)


@pytest.mark.parametrize(
    "schedule",
    [
        Cron("0 9 * * 1-5", BERLIN),
        Cron("*/5 * * * *", "UTC"),
        Cron("0 0 29 2 *", "Asia/Kolkata"),
        Cron("0 9 * * mon-fri", NEW_YORK),
        Every(1),
        Every(366 * 86400),
        At(NOW + timedelta(seconds=1)),
    ],
)
def test_validate_accepts(schedule: Schedule) -> None:
    validate(schedule, NOW)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (Cron("0 9 * * *", "Mars/Olympus"), "^unknown time zone 'Mars/Olympus'$"),
        (Cron("0 9 * * *", ""), "^unknown time zone ''$"),
        (Cron("0 9 * * *", "../../etc/passwd"), "unknown time zone"),
        (At(datetime(2020, 1, 1, tzinfo=UTC)),
         "^'at' time 2020-01-01T00:00\\+00:00 is in the past$"),
        (At(NOW), "is in the past"),
        (At(datetime.fromisoformat("2026-06-15T13:59:59+02:00")),
         "13:59:59\\+02:00 is in the past"),
        (Every(0.5), "at least 1 second"),
        (Every(0), "at least 1 second"),
        (Every(float("nan")), "at least 1 second"),
        (Every(400 * 86400), "at most 366 days"),
    ],
)  # fmt: skip
def test_validate_refuses(schedule: Schedule, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        validate(schedule, NOW)


def test_parse_cron_normalises_and_checks() -> None:
    assert parse_cron("  0   9 * *\t1-5 ", BERLIN) == Cron("0 9 * * 1-5", BERLIN)
    with pytest.raises(ScheduleError, match="unknown time zone 'Mars/Olympus'"):
        parse_cron("0 9 * * *", "Mars/Olympus")
    with pytest.raises(ScheduleError, match="the hour field '25'"):
        parse_cron("0 25 * * *", "UTC")


@pytest.mark.parametrize(
    ("schedule", "text"),
    [
        (At(datetime.fromisoformat("2026-12-01T09:00+01:00")), "at 2026-12-01T09:00+01:00"),
        (Every(5400), "every 1h30m"),
        (Cron("0 9 * * 1-5", BERLIN), "cron '0 9 * * 1-5' (Europe/Berlin)"),
    ],
)
def test_describe(schedule: Schedule, text: str) -> None:
    assert describe(schedule) == text


# --- catching up ---------------------------------------------------------------------------

HOUR = timedelta(hours=1)
DAILY_9 = Cron("0 9 * * *", "UTC")


@pytest.mark.parametrize(
    ("schedule", "due", "now", "window", "expected"),
    [
        # On time, or a little late: run.
        (Every(600), "12:00", "12:00", HOUR, ("run", "12:10")),
        (Every(600), "12:00", "12:00:03", HOUR, ("run", "12:10")),
        (DAILY_9, "09:00", "09:30", HOUR, ("run", "+1d 09:00")),
        # Exactly at the edge of the window still runs; a microsecond later it is missed.
        (DAILY_9, "09:00", "10:00", HOUR, ("run", "+1d 09:00")),
        (DAILY_9, "09:00", "10:00:00.000001", HOUR, ("missed", "+1d 09:00")),
        (DAILY_9, "09:00", "11:00", HOUR, ("missed", "+1d 09:00")),
        (DAILY_9, "09:00", "11:00", 3 * HOUR, ("run", "+1d 09:00")),
        # Down for hours: an every-10m job's latest occurrence is recent, so it runs once,
        # and the next run is after now, not a burst of the ones in between.
        (Every(600), "09:00", "12:05", HOUR, ("run", "12:10")),
        # Every 4h (00, 04, 08, 12 …): due 04:00, now 09:30, latest 08:00 is 1.5 h old.
        (Every(4 * 3600), "04:00", "09:30", HOUR, ("missed", "12:00")),
        (Every(4 * 3600), "04:00", "09:30", 2 * HOUR, ("run", "12:00")),
        # One-shots never come back.
        (At(datetime(2026, 6, 15, 9, tzinfo=UTC)), "09:00", "09:30", HOUR, ("run", None)),
        (At(datetime(2026, 6, 15, 9, tzinfo=UTC)), "09:00", "12:00", HOUR, ("missed", None)),
        # No window: only exactly on time.
        (Every(600), "12:00", "12:00", timedelta(0), ("run", "12:10")),
        (Every(600), "12:00", "12:00:01", timedelta(0), ("missed", "12:10")),
    ],
)
def test_catch_up(
    schedule: Schedule,
    due: str,
    now: str,
    window: timedelta,
    expected: tuple[str, str | None],
) -> None:
    action, next_at = expected
    decision = catch_up(schedule, _today(due), _today(now), window)
    assert decision.action == action
    assert decision.next_run == (None if next_at is None else _today(next_at))


def _today(text: str) -> datetime:
    day = date(2026, 6, 15)
    if text.startswith("+1d "):
        day, text = day + timedelta(days=1), text.removeprefix("+1d ")
    return datetime.combine(day, time.fromisoformat(text), tzinfo=UTC)


@pytest.mark.parametrize("schedule", [Every(60), Every(3600), DAILY_9, Cron("*/5 * * * *", BERLIN)])
@pytest.mark.parametrize("downtime", [timedelta(0), 10 * MINUTE, HOUR, timedelta(days=3)])
def test_catch_up_never_bursts(schedule: Schedule, downtime: timedelta) -> None:
    due = next_run(schedule, NOW)
    assert due is not None
    now = due + downtime
    decision = catch_up(schedule, due, now, HOUR)
    assert decision.next_run is not None
    assert decision.next_run > now
    # Once moved on, the job is not due again until its next occurrence.
    assert catch_up(schedule, decision.next_run, decision.next_run, HOUR).action == "run"


def test_catch_up_refuses_a_job_not_yet_due() -> None:
    with pytest.raises(ValueError, match="not due yet"):
        catch_up(DAILY_9, NOW + MINUTE, NOW, HOUR)


def test_times_in_one_zone_compare_as_instants() -> None:
    # Python compares two datetimes sharing a ZoneInfo by wall clock: 02:10 on the second pass
    # would look earlier than 02:30 on the first, though it is 40 minutes later.
    berlin = ZoneInfo(BERLIN)
    due = datetime(2026, 10, 25, 2, 30, tzinfo=berlin)
    now = datetime(2026, 10, 25, 2, 10, tzinfo=berlin, fold=1)
    decision = catch_up(Every(3600, due), due, now, HOUR)
    assert decision == CatchUp("run", utc("2026-10-25T02:30+01:00"))
    assert next_run(At(due), now) is None
    with pytest.raises(ScheduleError, match="is in the past"):
        validate(At(due), now)


# --- clock jumps and zones -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "scheduled", "now", "expected"),
    [
        # Hourly on the hour: stored for 16:00 while the clock said 15:00, now it says 10:05.
        (Every(3600), "16:00", "10:05", "11:00"),
        # One interval ahead at most is what a right clock leaves: it stays.
        (Every(3600), "11:05", "10:05", None),
        (Every(3600), "11:00", "10:05", None),
        (Every(3600), "11:05:00.000001", "10:05", "11:00"),
        # The grid keeps its phase (anchored at 09:17).
        (Every(1800, datetime(2026, 6, 15, 9, 17, tzinfo=UTC)), "18:47", "12:00", "12:17"),
        # Due already (the clock jumped forward): catching up is `catch_up`'s business.
        (Every(3600), "09:00", "12:00", None),
        # Wall-clock schedules follow the wall clock wherever it goes.
        (DAILY_9, "+1d 09:00", "08:00", None),
        (At(datetime(2026, 6, 15, 18, tzinfo=UTC)), "18:00", "08:00", None),
    ],
)
def test_realign(schedule: Schedule, scheduled: str, now: str, expected: str | None) -> None:
    moved = realign(schedule, _today(scheduled), _today(now))
    assert moved == (None if expected is None else _today(expected))


def test_realign_never_leaves_an_every_job_more_than_an_interval_ahead() -> None:
    for seconds in (1.5, 60, 3600, 86400 * 7):
        every = Every(seconds, NOW - timedelta(seconds=seconds / 3))
        for ahead in (2, 10, 1000):
            scheduled = NOW + ahead * timedelta(seconds=seconds)
            moved = realign(every, scheduled, NOW)
            assert moved is not None
            assert NOW < moved <= NOW + timedelta(seconds=seconds)
            assert moved == next_run(every, NOW)


def test_times_are_shown_in_the_jobs_zone() -> None:
    winter = datetime(2026, 12, 1, 8, tzinfo=UTC)
    assert zone_of(Cron("0 9 * * *", "America/New_York"), "UTC") == "America/New_York"
    assert zone_of(parse_at("2026-12-01T09:00", "Asia/Kolkata"), "UTC") == "Asia/Kolkata"
    assert zone_of(At(winter), "Europe/Berlin") == "Europe/Berlin"
    assert zone_of(Every(60), "Europe/Berlin") == "Europe/Berlin"
    assert format_time(winter, "Europe/Berlin") == "2026-12-01 09:00 CET"
    assert format_time(NOW, "Europe/Berlin") == "2026-06-15 14:00 CEST"
    assert format_time(winter, "UTC") == "2026-12-01 08:00 UTC"


def test_parse_at_keeps_its_zone() -> None:
    assert parse_at("2026-12-01T09:00", BERLIN).tz == BERLIN
    assert parse_at("2026-12-01T09:00+05:00", BERLIN).tz == BERLIN
    assert parse_at("2026-12-01T09:00+05:00").tz is None
    with pytest.raises(ScheduleError, match="unknown time zone"):
        parse_at("2026-12-01T09:00+05:00", "Mars/Olympus")


def test_system_zone_prefers_tz(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", ":Asia/Kolkata")
    assert system_zone() == "Asia/Kolkata"
    monkeypatch.setenv("TZ", "Mars/Olympus")
    zone = system_zone()
    assert zone != "Mars/Olympus"
    ZoneInfo(zone)
