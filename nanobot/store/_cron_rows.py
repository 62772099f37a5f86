"""Cron jobs and their runs as rows: a schedule as the JSON of its column, and rows read
back as `Job` and `JobRun`, refusing values this code does not know (`StoreError`)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Final, cast, get_args

from nanobot.cron.models import At, Cron, Delivery, Every, Job, JobRun, RunStatus, Schedule
from nanobot.errors import StoreError
from nanobot.store._times import from_text
from nanobot.store.database import Row

_STATUSES: Final = frozenset(get_args(RunStatus))
_DELIVERIES: Final = frozenset(get_args(Delivery))


def encode_schedule(schedule: Schedule) -> str:
    """A schedule as the JSON of its `schedule` column."""
    data: dict[str, Any]
    match schedule:
        case At(when, tz):
            data = {"kind": "at", "when": when.isoformat()}
            if tz is not None:
                data["tz"] = tz
        case Every(seconds, anchor):
            data = {
                "kind": "every",
                "seconds": seconds,
                "anchor": None if anchor is None else anchor.isoformat(),
            }
        case Cron(expr, tz):
            data = {"kind": "cron", "expr": expr, "tz": tz}
    return json.dumps(data, separators=(",", ":"))


def decode_schedule(text: str) -> Schedule:
    """The schedule `encode_schedule` wrote; StoreError if it cannot be read."""
    try:
        data = json.loads(text)
        match data["kind"]:
            case "at":
                tz = data.get("tz")
                return At(datetime.fromisoformat(data["when"]), None if tz is None else str(tz))
            case "every":
                anchor = data.get("anchor")
                return Every(
                    float(data["seconds"]),
                    None if anchor is None else datetime.fromisoformat(anchor),
                )
            case "cron":
                return Cron(str(data["expr"]), str(data["tz"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"unreadable cron schedule {text!r}: {exc}") from exc
    raise StoreError(f"unreadable cron schedule {text!r}: unknown kind")


def job_of(row: Row) -> Job:
    """A `cron_jobs` row as a Job; StoreError if a value in it is unknown."""
    return Job(
        id=row["id"],
        name=row["name"],
        message=row["message"],
        schedule=decode_schedule(row["schedule"]),
        enabled=bool(row["enabled"]),
        channel=row["channel"],
        to=row["chat_id"],
        owner=row["owner"],
        created_at=from_text(row["created_at"]),
        next_run=_parse_optional(row["next_run"]),
        last_run=_parse_optional(row["last_run"]),
        last_status=_status(row["last_status"]) if row["last_status"] is not None else None,
        created_by=row["created_by"],
    )


def run_of(row: Row) -> JobRun:
    """A `cron_runs` row as a JobRun; StoreError if a value in it is unknown."""
    return JobRun(
        id=row["id"],
        job_id=row["job_id"],
        due_at=_parse_optional(row["due_at"]),
        started_at=from_text(row["started_at"]),
        ended_at=_parse_optional(row["ended_at"]),
        status=_status(row["status"]),
        error=row["error"],
        delivery=_delivery(row["delivery"]),
        delivery_error=row["delivery_error"],
    )


def _status(text: str) -> RunStatus:
    if text not in _STATUSES:
        raise StoreError(f"unknown cron run status {text!r}")
    return cast(RunStatus, text)


def _delivery(text: str | None) -> Delivery | None:
    if text is not None and text not in _DELIVERIES:
        raise StoreError(f"unknown cron run delivery {text!r}")
    return cast(Delivery | None, text)


def _parse_optional(text: str | None) -> datetime | None:
    return None if text is None else from_text(text)
