"""Scheduled jobs: the vocabulary (`models`) and the pure schedule arithmetic (`schedule`).

This package must not import `nanobot.store`: the store imports the vocabulary from here.
"""

from nanobot.cron.models import (
    At,
    Cron,
    Delivery,
    Every,
    Job,
    JobRun,
    RunStatus,
    Schedule,
    ScheduleError,
    parse_at,
    parse_every,
)
from nanobot.cron.schedule import (
    CatchUp,
    CatchUpAction,
    catch_up,
    describe,
    format_interval,
    next_run,
    parse_cron,
    system_zone,
    validate,
)

__all__ = [
    "At",
    "CatchUp",
    "CatchUpAction",
    "Cron",
    "Delivery",
    "Every",
    "Job",
    "JobRun",
    "RunStatus",
    "Schedule",
    "ScheduleError",
    "catch_up",
    "describe",
    "format_interval",
    "next_run",
    "parse_at",
    "parse_cron",
    "parse_every",
    "system_zone",
    "validate",
]
