"""When jobs run: pure, timezone-aware schedule arithmetic.

Every function takes aware datetimes and returns aware datetimes in UTC. None of them reads
the clock; the caller passes `now`.

Cron expressions are matched against the wall clock of the schedule's zone. On the two days
a year the clock jumps, nanobot does what Vixie cron does. A job whose minute or hour field
starts with `*` (`*`, `*/n`, as in `*/15 * * * *`, `0 * * * *` or `* 2 * * *`) follows the
clock on the wall; any other job runs at fixed times:

- Spring forward (wall times that do not exist): a fixed-time job, such as `30 2 * * *`,
  runs once at the first instant after the gap (03:00), so a daily job never loses a day. A
  job that follows the clock has no run in the missing hour.
- Fall back (wall times that happen twice): a fixed-time job runs at the first occurrence
  only, never twice. A job that follows the clock runs at both, so an every-15-minutes job
  does not pause for an hour.

Day of month and day of week are croniter's: when both are restricted, either may match, and
a field such as `*/2` counts as restricted (Vixie cron would require both days to match then).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, Literal
from zoneinfo import ZoneInfo

from croniter import CroniterBadCronError, CroniterError, croniter

from nanobot.cron.models import (
    At,
    Cron,
    Every,
    Schedule,
    ScheduleError,
    check_every,
    wall_time,
    zone,
)

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)
_FIELDS: Final = (
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day-of-month", "1-31"),
    ("month", "1-12 or jan-dec"),
    ("day-of-week", "0-6 or sun-sat"),
)
# The most the clock falls back at once: 3 h covers every zone since 1995 (Antarctica/Casey
# still did it in 2023). A search looks at no more than ~6 h of minute matches; this bounds it.
_MAX_FALL_BACK: Final = timedelta(hours=3)
_MAX_WALLS: Final = 3000


def next_run(schedule: Schedule, after: datetime) -> datetime | None:
    """The first time strictly after `after` that `schedule` runs, in UTC; None if never.

    `At` runs at its time if that is after `after`. `Every` runs on its anchored grid. `Cron`
    follows the wall clock of its zone, with the daylight-saving rules in the module doc.
    """
    # In UTC before any arithmetic: Python compares and subtracts two datetimes that share a
    # ZoneInfo by their wall clocks, not as instants.
    after = _utc(after)
    match schedule:
        case At(when):
            return _utc(when) if _utc(when) > after else None
        case Every(seconds, anchor):
            return _next_every(seconds, _EPOCH if anchor is None else _utc(anchor), after)
        case Cron(expr, tz):
            return _next_cron(expr, zone(tz), after)


def validate(schedule: Schedule, now: datetime) -> None:
    """Raise `ScheduleError` unless `schedule` can be stored: a future `at` time, an interval
    within bounds, a five-field cron expression in a known zone that matches some date."""
    now = _utc(now)
    match schedule:
        case At(when):
            if _utc(when) <= now:
                raise ScheduleError(f"'at' time {_show(when)} is in the past")
        case Every():
            check_every(schedule)
        case Cron(expr, tz):
            tzinfo = zone(tz)
            _check_expression(expr)
            if _next_cron(expr, tzinfo, now) is None:
                raise ScheduleError(f"bad cron expression {expr!r}: it matches no date")


def parse_cron(expr: str, tz: str) -> Cron:
    """A `Cron` with its expression's whitespace normalised; raises `ScheduleError` for a bad
    expression or zone (but does not check that it ever matches; `validate` does)."""
    zone(tz)
    cleaned = " ".join(expr.split())
    _check_expression(cleaned)
    return Cron(cleaned, tz)


CatchUpAction = Literal["run", "missed"]


@dataclass(frozen=True, slots=True)
class CatchUp:
    """What to do with a job that is due: run it once now, or record it as missed.

    `next_run` is the job's next time after now (None: nothing left, disable the job).
    Occurrences between the due time and now are skipped, never run in a burst.
    """

    action: CatchUpAction
    next_run: datetime | None


def catch_up(schedule: Schedule, due: datetime, now: datetime, window: timedelta) -> CatchUp:
    """Decide about a job whose stored next run `due` has come (`due <= now`).

    It runs once if it fell due within `window` before `now` (inclusive), counting its most
    recent occurrence, so a job that has fallen due many times while nanobot was down runs
    once if the last of them is recent. Otherwise it is missed. A job that is on time is
    simply "within the window", so this decides every due job, not only after a restart.
    """
    due, now = _utc(due), _utc(now)
    if due > now:
        raise ValueError(f"job is not due yet: {due.isoformat()} > {now.isoformat()}")
    horizon = now - window
    recent = due >= horizon
    if not recent:
        latest = next_run(schedule, horizon - _MICROSECOND)
        recent = latest is not None and latest <= now
    return CatchUp("run" if recent else "missed", next_run(schedule, now))


def realign(schedule: Schedule, scheduled: datetime, now: datetime) -> datetime | None:
    """Where a job stored to run at `scheduled` should run now that the wall clock shows
    `now`, after it jumped; None when it stays.

    An `every` job's next run is never more than one interval after the moment it was
    computed, so one further ahead of `now` was computed while the clock was ahead: it moves
    to the first point of its grid after `now`. Cron expressions and `at` times name times on
    the wall clock, so by definition they follow it wherever it jumps, and never move.
    """
    match schedule:
        case Every(seconds):
            if _utc(scheduled) - _utc(now) > timedelta(seconds=seconds):
                return next_run(schedule, now)
    return None


def zone_of(schedule: Schedule, default: str) -> str:
    """The zone a job's times are shown in: its cron expression's or its `at` time's zone,
    else `default` (the configured one)."""
    match schedule:
        case Cron(_, tz):
            return tz
        case At(_, tz) if tz is not None:
            return tz
    return default


def format_time(moment: datetime, tz: str) -> str:
    """`moment` on the wall clock of zone `tz`, to the minute: `2026-12-01 09:00 CET`."""
    return _utc(moment).astimezone(zone(tz)).strftime("%Y-%m-%d %H:%M %Z")


def describe(schedule: Schedule) -> str:
    """A short human description: `at 2026-12-01T09:00+01:00`, `every 1h30m`,
    `cron '0 9 * * 1-5' (Europe/Berlin)`."""
    match schedule:
        case At(when):
            return f"at {_show(when)}"
        case Every(seconds):
            return f"every {format_interval(seconds)}"
        case Cron(expr, tz):
            return f"cron {expr!r} ({tz})"


def format_interval(seconds: float) -> str:
    """`5400` → `1h30m`; the inverse of `parse_every` for whole seconds."""
    rest = round(seconds)
    if rest != seconds or rest <= 0:
        return f"{seconds:g}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def system_zone() -> str:
    """The IANA name of this machine's time zone (from `TZ` or /etc/localtime), else "UTC".

    Not pure: it reads the environment and the file system. Call it once, at start-up, when
    the configuration names no `timezone`.
    """
    candidates = [os.environ.get("TZ", "").removeprefix(":")]
    localtime = Path("/etc/localtime")
    if localtime.is_symlink():
        target = str(localtime.resolve())
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    timezone_file = Path("/etc/timezone")
    if timezone_file.is_file():
        candidates.append(timezone_file.read_text(encoding="utf-8").strip())
    for name in candidates:
        if not name:
            continue
        try:
            zone(name)
        except ScheduleError:
            continue
        return name
    return "UTC"


def _next_every(seconds: float, anchor: datetime, after: datetime) -> datetime:
    # Whole microseconds, so a grid never drifts with float error however far it runs.
    step = max(1, round(seconds * 1_000_000))
    elapsed = (after - anchor) // _MICROSECOND
    steps = elapsed // step + 1
    return anchor + steps * step * _MICROSECOND


def _next_cron(expr: str, tz: ZoneInfo, after: datetime) -> datetime | None:
    # croniter walks the wall clock (naive times, no DST); each wall time is then mapped to
    # the instants it means. (croniter's own handling of aware times runs fixed-hour jobs
    # twice in a repeated hour and drops runs in Lord Howe's half-hour fall-back.) After a
    # fall-back the instants come out of order: the walk must start up to a fall-back's
    # length before `after`, and go on that long past the best found.
    fields = expr.split()
    follows_clock = any(field.startswith("*") for field in fields[:2])
    behind = timedelta(0) if _steady(tz, after, after + _MAX_FALL_BACK) else _MAX_FALL_BACK
    start = after.astimezone(tz).replace(tzinfo=None) - behind
    best: datetime | None = None
    stop: datetime | None = None  # the last wall time that could still beat `best`
    try:
        walls = croniter(expr, start - timedelta(minutes=1))
        for _ in range(_MAX_WALLS):
            wall: datetime = walls.get_next(datetime)
            if stop is not None and wall > stop:
                break
            for instant in _instants(wall, tz, follows_clock):
                if instant > after and (best is None or instant < best):
                    best = instant
                    steady = _steady(tz, best - _MAX_FALL_BACK, best)
                    stop = wall if steady else wall + _MAX_FALL_BACK
    except (CroniterError, OverflowError):
        # CroniterBadDateError: no date matches (e.g. `0 0 30 2 *`) within croniter's horizon.
        return best
    return best


def _steady(tz: ZoneInfo, start: datetime, end: datetime) -> bool:
    """Whether the zone keeps one UTC offset from `start` to `end` (a few hours apart).

    Probed every 30 minutes: no zone changes its offset twice within half an hour.
    """
    offset = start.astimezone(tz).utcoffset()
    probe = start
    while probe < end:
        probe = min(probe + timedelta(minutes=30), end)
        if probe.astimezone(tz).utcoffset() != offset:
            return False
    return True


def _instants(wall: datetime, tz: ZoneInfo, follows_clock: bool) -> list[datetime]:
    """The instants a cron match at wall-clock time `wall` runs at (the rules above)."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if first == second:
        return [first]
    if first.astimezone(tz).replace(tzinfo=None) == wall:  # the clock shows it twice
        return [first, second] if follows_clock else [first]
    return [] if follows_clock else [wall_time(wall, tz).astimezone(UTC)]  # skipped


def _check_expression(expr: str) -> None:
    fields = expr.split()
    if len(fields) != len(_FIELDS):
        raise ScheduleError(
            f"bad cron expression {expr!r}: it needs 5 fields"
            f" (minute hour day-of-month month day-of-week), not {len(fields)}"
        )
    for index, (name, allowed) in enumerate(_FIELDS):
        alone = " ".join(field if i == index else "*" for i, field in enumerate(fields))
        if not _parses(alone):
            raise ScheduleError(
                f"bad cron expression {expr!r}: the {name} field {fields[index]!r}"
                f" is not valid ({allowed})"
            )
    if not _parses(expr):
        raise ScheduleError(f"bad cron expression {expr!r}: croniter cannot parse it")


def _parses(expr: str) -> bool:
    try:
        croniter(expr, _EPOCH)
    except (CroniterBadCronError, ValueError, KeyError, IndexError):
        return False
    return True


def _show(moment: datetime) -> str:
    spec = "minutes" if moment.second == 0 and moment.microsecond == 0 else "seconds"
    return moment.isoformat(timespec=spec)


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"naive datetime {moment.isoformat()}: schedule math needs aware times")
    return moment.astimezone(UTC)
