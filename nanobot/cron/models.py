"""The vocabulary of cron: schedules, jobs, runs, and the parsers users type schedules into.

Every datetime here is timezone-aware; constructing a schedule from a naive one raises
`ScheduleError`. Parsing checks the syntax; `nanobot.cron.schedule.validate` checks the rest
(a time in the past, a cron expression that never matches) before a job is stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from nanobot.durations import DurationError, parse_duration
from nanobot.errors import NanobotError


class ScheduleError(NanobotError):
    """A schedule cannot be used: bad syntax, unknown time zone, a time in the past.

    The message names the offending text and says what is wrong, for the user who typed it.
    """


@dataclass(frozen=True, slots=True)
class At:
    """Run once, at `when`. `tz` is the zone the time was given in (None: an explicit offset
    and no zone), so the time is shown as the user wrote it."""

    when: datetime
    tz: str | None = None

    def __post_init__(self) -> None:
        _require_aware(self.when, "'at' time")


@dataclass(frozen=True, slots=True)
class Every:
    """Run every `seconds`, at `anchor + k * seconds` for every integer k.

    The anchor only fixes the phase; None anchors the grid at the Unix epoch, so `every 10m`
    runs at :00, :10, … UTC. A job created "every 2h" from now passes its creation time.
    """

    seconds: float
    anchor: datetime | None = None

    def __post_init__(self) -> None:
        if self.anchor is not None:
            _require_aware(self.anchor, "interval anchor")


@dataclass(frozen=True, slots=True)
class Cron:
    """Run when the five-field cron expression `expr` matches the wall clock in zone `tz`."""

    expr: str
    tz: str


Schedule = At | Every | Cron

RunStatus = Literal["ok", "error", "missed", "running", "interrupted", "skipped"]
"""How a run ended: `running` until it does; `interrupted` when the process stopped first;
`missed` when it fell due too long ago to catch up (it never started); `skipped` when a
budget had no room for its model call (`budget`)."""

Delivery = Literal["pending", "delivered", "failed"]
"""Where a run's answer stands: queued for its chat (`pending`, also across restarts), on
the platform, every part of it (`delivered`), or refused for good or given up (`failed`)."""


@dataclass(frozen=True, slots=True)
class Job:
    """A stored job. `next_run` is None exactly when the job is disabled.

    `channel` and `to` (a chat id) say where the result is delivered, if anywhere; `owner` is
    the session key of the chat that created the job (None for jobs made from the CLI), and
    scopes what the agent's tool lets that chat see and change. `created_by` is the person
    who made it (`nanobot.people`), whom its runs work for: their folder and memory.
    """

    id: str
    name: str
    message: str
    schedule: Schedule
    enabled: bool
    channel: str | None
    to: str | None
    owner: str | None
    created_at: datetime
    next_run: datetime | None
    last_run: datetime | None
    last_status: RunStatus | None
    created_by: str | None = None  # the person (channel:user_id) it runs as; None: the owner


@dataclass(frozen=True, slots=True)
class JobRun:
    """One entry of a job's run history.

    `due_at` is the scheduled time the run was for (None for a run started by hand). A missed
    run has `started_at == ended_at`, the moment it was recorded as missed. `delivery` is
    None when there was nothing to deliver (the job has no chat, or the run no answer);
    `delivery_error` says why a `failed` one was not delivered.
    """

    id: int
    job_id: str
    due_at: datetime | None
    started_at: datetime
    ended_at: datetime | None
    status: RunStatus
    error: str | None
    delivery: Delivery | None = None
    delivery_error: str | None = None

    @property
    def summary(self) -> str:
        """The run in a few words: its status, then where its answer stands, if it has one
        for a chat (`ok, delivered`, `ok, delivery pending`, `ok, not delivered`)."""
        if self.delivery is None:
            return self.status
        return f"{self.status}, {DELIVERY_WORDS[self.delivery]}"


DELIVERY_WORDS: Final[dict[Delivery, str]] = {
    "pending": "delivery pending",
    "delivered": "delivered",
    "failed": "not delivered",
}


MIN_EVERY: Final = 1.0
MAX_EVERY: Final = 366 * 86400.0


def parse_every(text: str, *, anchor: datetime | None = None) -> Every:
    """Parse an interval such as `30s`, `10m`, `2h`, `1d`, `1h30m` or `1.5h`
    (`nanobot.durations`' syntax, as in the config file).

    The interval must be between 1 second and 366 days. Raises `ScheduleError` otherwise.
    """
    try:
        duration = parse_duration(text)
    except DurationError as exc:
        raise ScheduleError(f"bad interval: {exc}") from None
    every = Every(duration.total_seconds(), anchor)
    check_every(every, text)
    return every


def check_every(every: Every, text: str | None = None) -> None:
    """Raise `ScheduleError` unless the interval is between `MIN_EVERY` and `MAX_EVERY`."""
    shown = repr(text) if text is not None else f"of {every.seconds:g} s"
    if not math.isfinite(every.seconds) or every.seconds < MIN_EVERY:
        raise ScheduleError(f"bad interval {shown}: it must be at least 1 second")
    if every.seconds > MAX_EVERY:
        raise ScheduleError(f"bad interval {shown}: it must be at most 366 days")


def parse_at(text: str, tz: str | None = None) -> At:
    """Parse an ISO 8601 time such as `2026-12-01T09:00+01:00` or `2026-12-01 09:00`.

    An explicit offset (or `Z`) wins; a time without one is read as wall-clock time in `tz`
    (the caller passes the job's zone, else the configured default, else the system's). A
    wall time that does not exist there (skipped by a spring-forward change) means the first
    instant after the gap; one that occurs twice means its first occurrence, as for cron
    jobs. The `At` keeps `tz` as its zone. Raises `ScheduleError` for bad syntax, an unknown
    zone, or no offset and no `tz`.
    Whether the time is in the past is `validate`'s business, not the parser's.
    """
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ScheduleError(
            f"bad 'at' time {text!r}: use ISO 8601, e.g. 2026-12-01T09:00+01:00"
        ) from None
    if when.tzinfo is not None and when.utcoffset() is not None:
        if tz is not None:
            zone(tz)
        return At(when, tz)
    if tz is None:
        raise ScheduleError(
            f"'at' time {text!r} has no UTC offset: add one (e.g. +01:00) or give a time zone"
        )
    local = wall_time(when, zone(tz))
    # A fixed offset: a ZoneInfo time in a repeated hour never equals one in another zone.
    return At(local.astimezone(timezone(local.utcoffset() or timedelta(0))), tz)


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name`; raises `ScheduleError` if there is no such zone."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        # ValueError: keys that are not zone names at all, such as '' or '../etc/passwd'.
        raise ScheduleError(f"unknown time zone {name!r}") from None


def wall_time(naive: datetime, tz: ZoneInfo) -> datetime:
    """The instant (in `tz`) a wall-clock reading means: the first occurrence when the clock
    shows it twice, the end of the gap when the clock skips it."""
    local = naive.replace(tzinfo=tz, fold=0)
    back = local.astimezone(UTC).astimezone(tz)
    if back.replace(tzinfo=None) == naive:
        return local
    # A gap: the offsets on either side bracket the transition; find its second.
    low = naive.replace(tzinfo=tz, fold=1).astimezone(UTC)  # before the change
    high = local.astimezone(UTC)  # after it
    before = low.astimezone(tz).utcoffset()
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(tz).utcoffset() == before:
            low = middle
        else:
            high = middle
    return high.replace(microsecond=0).astimezone(tz)


def _require_aware(moment: datetime, what: str) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ScheduleError(f"{what} {moment.isoformat()} has no time zone")
