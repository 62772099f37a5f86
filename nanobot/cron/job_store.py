"""The port the cron package needs from storage: jobs, their run history, a change counter.

`nanobot.store.cron.CronStore` implements it; the cron package names only this Protocol, so
the store depends on the cron vocabulary and never the other way round.
"""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Protocol

from nanobot.cron.models import Job, JobRun, RunStatus, Schedule


class JobStore(Protocol):
    """Short transactions over jobs and runs. A job is enabled exactly when it has a next
    run; every change to a job, by any process, grows `version()`."""

    async def add(
        self,
        *,
        name: str,
        message: str,
        schedule: Schedule,
        next_run: datetime,
        channel: str | None = None,
        to: str | None = None,
        owner: str | None = None,
        created_by: str | None = None,
    ) -> Job:
        """Store a new, enabled job (its schedule validated, `next_run` computed from it)."""
        ...

    async def get(self, job_id: str, owner: str | None = None) -> Job | None:
        """The job, or None if there is none (or, when `owner` is given, it is not theirs)."""
        ...

    async def list(self, owner: str | None = None, *, include_disabled: bool = False) -> list[Job]:
        """Jobs by next run (disabled ones last); only `owner`'s when given."""
        ...

    async def remove(self, job_id: str, owner: str | None = None) -> bool:
        """Delete the job and its history; False if there was none (or it is not `owner`'s)."""
        ...

    async def set_enabled(
        self,
        job_id: str,
        enabled: bool,
        *,
        next_run: datetime | None = None,
        owner: str | None = None,
    ) -> bool:
        """Enable the job with its `next_run`, or disable it; False if there is no such job."""
        ...

    async def update_next_run(
        self, job_id: str, next_run: datetime | None, *, expected: datetime | None = None
    ) -> bool:
        """Move the job's next run; None disables it. With `expected`, only if the job is
        enabled and its next run is still `expected`. False if nothing moved."""
        ...

    async def due(self, now: datetime) -> builtins.list[Job]:
        """Enabled jobs whose next run is at or before `now`, earliest first."""
        ...

    async def next_due(self) -> datetime | None:
        """The earliest next run of any enabled job, or None if no job is enabled."""
        ...

    async def version(self) -> int:
        """A counter that grows with every change to any job, by any process."""
        ...

    async def start_run(
        self, job_id: str, *, due_at: datetime | None, next_run: datetime | None
    ) -> int | None:
        """Record a run as started and move the job to `next_run`, atomically; the run's id,
        or None when the job no longer falls due at `due_at` (or is gone)."""
        ...

    async def finish_run(self, run_id: int, status: RunStatus, error: str | None = None) -> bool:
        """Record how a started run's turn ended; False if the run is gone or already
        finished. Whether its answer was delivered is recorded apart, by the outbox."""
        ...

    async def record_missed(
        self, job_id: str, due_at: datetime, *, next_run: datetime | None
    ) -> int | None:
        """Record the occurrence `due_at` as missed and move the job on, with the same claim
        on `due_at` as `start_run`."""
        ...

    async def runs(self, job_id: str, limit: int = 20) -> builtins.list[JobRun]:
        """The job's most recent runs, newest first."""
        ...

    async def mark_interrupted_runs(self) -> int:
        """Finish every run still `running` as `interrupted` (left by a stopped process)."""
        ...
