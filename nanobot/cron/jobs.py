"""Managing jobs: validation on the way in, one place for the CLI and the agent's tool.

Everything that creates or changes a job goes through `Jobs`, so a bad schedule is refused
with a clear message before anything is stored, whoever asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from nanobot.cron.job_store import JobStore
from nanobot.cron.models import Job, JobRun, Schedule, ScheduleError, parse_at, parse_every
from nanobot.cron.schedule import next_run, parse_cron, system_zone, validate


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule as a person writes it: exactly one of `every`, `cron`, `at`."""

    every: str | None = None
    cron: str | None = None
    at: str | None = None
    tz: str | None = None

    def build(self, default_zone: str, now: datetime) -> Schedule:
        """The validated schedule. Raises ScheduleError with a clear message."""
        given = [name for name in ("every", "cron", "at") if getattr(self, name)]
        if len(given) != 1:
            raise ScheduleError("give exactly one of --every, --cron or --at")
        zone = self.tz or default_zone
        schedule: Schedule
        if self.every:
            if self.tz:
                raise ScheduleError("--tz applies to --cron and --at, not to --every")
            schedule = parse_every(self.every, anchor=now)
        elif self.cron:
            schedule = parse_cron(self.cron, zone)
        else:
            assert self.at is not None
            schedule = parse_at(self.at, zone)
        validate(schedule, now)
        return schedule


class Jobs:
    """Add, list, remove, enable and disable jobs, owner-scoped where an owner is given."""

    def __init__(
        self,
        store: JobStore,
        default_zone: str | None = None,
        *,
        channels: Mapping[str, bool] | None = None,
    ) -> None:
        """`channels` maps each channel a job can deliver to onto whether it is enabled; a
        job for any other is refused. None checks nothing (the caller has: the agent's tool
        only ever names the chat it talks in)."""
        self._store = store
        self._zone = default_zone or system_zone()
        self._channels = channels

    @property
    def default_zone(self) -> str:
        return self._zone

    async def add(
        self,
        name: str,
        message: str,
        spec: ScheduleSpec,
        *,
        channel: str | None = None,
        to: str | None = None,
        owner: str | None = None,
        created_by: str | None = None,
    ) -> Job:
        """Validate and store a job, made by the person `created_by` (it runs as them).
        Raises ScheduleError (nothing is stored then)."""
        if not message.strip():
            raise ScheduleError("a job needs a message: what should nanobot do when it runs?")
        if (channel is None) != (to is None):
            raise ScheduleError("give both --channel and --to, or neither")
        if channel is not None:
            self._check_channel(channel)
        now = datetime.now(UTC)
        schedule = spec.build(self._zone, now)
        first = next_run(schedule, now)
        assert first is not None, "validate() refuses schedules with no future run"
        return await self._store.add(
            name=name.strip() or message.strip()[:40],
            message=message,
            schedule=schedule,
            next_run=first,
            channel=channel,
            to=to,
            owner=owner,
            created_by=created_by,
        )

    def _check_channel(self, channel: str) -> None:
        if self._channels is None:
            return
        if channel not in self._channels:
            known = " or ".join(sorted(self._channels))
            raise ScheduleError(f"unknown channel {channel!r}: a job can deliver to {known}")
        if not self._channels[channel]:
            raise ScheduleError(
                f"channel {channel!r} is not enabled, so the job's answers could not be"
                f" delivered: set channels.{channel}.enabled (and its token) in the config,"
                " or leave out --channel and --to"
            )

    async def all(self, owner: str | None = None) -> list[Job]:
        return await self._store.list(owner, include_disabled=True)

    async def get(self, job_id: str, owner: str | None = None) -> Job | None:
        return await self._store.get(job_id, owner)

    async def remove(self, job_id: str, owner: str | None = None) -> bool:
        return await self._store.remove(job_id, owner)

    async def enable(self, job_id: str, owner: str | None = None) -> bool:
        """Enable a job from now on. Raises ScheduleError when it has no future run."""
        job = await self._store.get(job_id, owner)
        if job is None:
            return False
        upcoming = next_run(job.schedule, datetime.now(UTC))
        if upcoming is None:
            raise ScheduleError(f"job {job_id} has no future run (its 'at' time has passed)")
        return await self._store.set_enabled(job_id, True, next_run=upcoming, owner=owner)

    async def disable(self, job_id: str, owner: str | None = None) -> bool:
        return await self._store.set_enabled(job_id, False, owner=owner)

    async def run_now(self, job_id: str) -> datetime | None:
        """Make the job due now and return that time (None: there is no such job). A running
        gateway picks it up within seconds; its regular schedule carries on afterwards."""
        job = await self._store.get(job_id)
        if job is None:
            return None
        now = datetime.now(UTC)
        if job.enabled:
            moved = await self._store.update_next_run(job_id, now)
        else:
            moved = await self._store.set_enabled(job_id, True, next_run=now)
        return now if moved else None

    async def runs(self, job_id: str, limit: int = 10) -> list[JobRun]:
        return await self._store.runs(job_id, limit)
