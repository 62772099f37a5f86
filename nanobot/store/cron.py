"""Cron jobs and their run history, shared by the running gateway and `nanobot cron …`.

Both processes write the same tables, each in short transactions, so neither overwrites the
other. Every change to a job also bumps a counter (`version()`) in the same transaction; the
gateway compares it every second or so and reloads its schedule when it moved. (SQLite's
`PRAGMA data_version` would also notice other processes' commits, but to any table, the busy
session tables included, and never the process's own; the counter changes exactly when a job
does, whoever changed it.)

A run's `delivery` is not written here: the outbox keeps it, as its reply is queued,
confirmed or given up (`nanobot.store.journal`).

Times are stored as UTC ISO 8601 strings of fixed width, so they compare as text. The store
checks nothing about schedules: callers validate them and compute `next_run`
(`nanobot.cron.schedule`). A job is enabled exactly when it has a next run.
"""

from __future__ import annotations

import builtins
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Final

from nanobot.cron.models import Job, JobRun, RunStatus, Schedule
from nanobot.errors import StoreError
from nanobot.store._cron_rows import encode_schedule, job_of, run_of
from nanobot.store._times import from_text, to_text, wall_clock
from nanobot.store.database import Database, SqlValue
from nanobot.store.wakeups import CRON_CHANGED

HISTORY_LIMIT: Final = 50
"""Runs kept per job; older ones are dropped as new ones are recorded."""

INTERRUPTED_ERROR: Final = "nanobot stopped before the run finished"

_FINAL_STATUSES: Final = frozenset({"ok", "error", "interrupted", "skipped"})
_ID_ATTEMPTS: Final = 5


class CronStore:
    """Jobs, their run history, and the change counter. All methods are short transactions."""

    def __init__(self, db: Database, clock: Callable[[], datetime] | None = None) -> None:
        """`clock` gives the times recorded (created, started, ended); the wall clock by
        default."""
        self._db = db
        self._clock = clock or wall_clock

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
        """Store a new, enabled job with a fresh 8-hex-digit id and return it.

        `schedule` must already be validated and `next_run` computed from it.
        """
        async with self._db.transaction():
            for _ in range(_ID_ATTEMPTS):
                row = await self._db.fetchone(
                    "INSERT INTO cron_jobs (id, name, message, schedule, enabled, channel,"
                    " chat_id, owner, created_at, next_run, created_by)"
                    " VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (id) DO NOTHING RETURNING *",
                    (
                        secrets.token_hex(4),
                        name,
                        message,
                        encode_schedule(schedule),
                        channel,
                        to,
                        owner,
                        self._now(),
                        to_text(next_run),
                        created_by,
                    ),
                )
                if row is not None:
                    await self._bump()
                    return job_of(row)
        raise StoreError(f"{self._db.name}: could not find a free cron job id")

    async def get(self, job_id: str, owner: str | None = None) -> Job | None:
        """The job, or None if there is none (or, when `owner` is given, it is not theirs)."""
        owned, mine = _owned(owner)
        row = await self._db.fetchone(
            f"SELECT * FROM cron_jobs WHERE id = ? {owned}", (job_id, *mine)
        )
        return None if row is None else job_of(row)

    async def list(self, owner: str | None = None, *, include_disabled: bool = False) -> list[Job]:
        """Jobs by next run (disabled ones last), then creation; only `owner`'s when given."""
        enabled = "" if include_disabled else "AND enabled = 1"
        owned, mine = _owned(owner)
        rows = await self._db.fetchall(
            f"SELECT * FROM cron_jobs WHERE 1 = 1 {owned} {enabled}"
            " ORDER BY next_run IS NULL, next_run, created_at, id",
            mine,
        )
        return [job_of(row) for row in rows]

    async def remove(self, job_id: str, owner: str | None = None) -> bool:
        """Delete the job and its history; False if there was none (or it is not `owner`'s)."""
        owned, mine = _owned(owner)
        async with self._db.transaction():
            changed = await self._db.execute(
                f"DELETE FROM cron_jobs WHERE id = ? {owned}", (job_id, *mine)
            )
            if changed:
                await self._bump()
        return changed > 0

    async def set_enabled(
        self,
        job_id: str,
        enabled: bool,
        *,
        next_run: datetime | None = None,
        owner: str | None = None,
    ) -> bool:
        """Enable the job with its `next_run` (required then), or disable it (clearing its
        next run). False if there is no such job (or it is not `owner`'s)."""
        if enabled and next_run is None:
            raise ValueError("enabling a cron job needs its next run")
        return await self._update(job_id, _NEXT, _next(next_run if enabled else None), owner)

    async def update_next_run(
        self, job_id: str, next_run: datetime | None, *, expected: datetime | None = None
    ) -> bool:
        """Move the job's next run; None disables it. With `expected`, only an enabled job
        whose next run is still `expected` moves (a change made meanwhile wins). False if
        nothing moved."""
        if expected is None:
            return await self._update(job_id, _NEXT, _next(next_run))
        return await self._update(
            job_id,
            _NEXT,
            _next(next_run),
            where="AND enabled = 1 AND next_run = ?",
            where_params=(to_text(expected),),
        )

    async def due(self, now: datetime) -> builtins.list[Job]:
        """Enabled jobs whose next run is at or before `now`, earliest first."""
        rows = await self._db.fetchall(
            "SELECT * FROM cron_jobs WHERE enabled = 1 AND next_run <= ? ORDER BY next_run, id",
            (to_text(now),),
        )
        return [job_of(row) for row in rows]

    async def next_due(self) -> datetime | None:
        """The earliest next run of any enabled job, or None if no job is enabled."""
        row = await self._db.fetchone("SELECT min(next_run) FROM cron_jobs WHERE enabled = 1")
        return None if row is None or row[0] is None else from_text(row[0])

    async def version(self) -> int:
        """A counter that grows with every change to any job, by any process."""
        row = await self._db.fetchone("SELECT version FROM cron_state WHERE id = 1")
        return 0 if row is None else int(row[0])

    async def start_run(
        self, job_id: str, *, due_at: datetime | None, next_run: datetime | None
    ) -> int | None:
        """Record a run as started and move the job to `next_run`, atomically; the run's id.

        `next_run` None disables the job (a one-shot that has now run). With `due_at`, the
        run claims that occurrence: None is returned, and nothing written, if the job's next
        run is no longer `due_at` (it was changed, disabled or removed meanwhile). With
        `due_at` None (a run by hand) only a removed job returns None. Because the job moves
        on before the run starts, a crash mid-run leaves an `interrupted` run, never a rerun.
        """
        started = self._now()
        async with self._db.transaction():
            if not await self._claim(job_id, due_at, next_run, "running", started):
                return None
            return await self._insert_run(job_id, due_at, "running", started, None)

    async def finish_run(
        self,
        run_id: int,
        status: RunStatus,
        error: str | None = None,
    ) -> bool:
        """Record how a started run's turn ended (`ok`, `error`, `interrupted`, or `skipped`
        over a budget) on it and its job. Its answer's delivery is the outbox's to record,
        before or after this.

        A run marked `interrupted` at start-up may still end: its turn was journaled and
        resumed, and how it ended replaces the mark. False if the run is gone (its job was
        removed while it ran) or already ended otherwise.
        """
        if status not in _FINAL_STATUSES:
            raise ValueError(f"a run cannot finish as {status!r}")
        async with self._db.transaction():
            row = await self._db.fetchone(
                "UPDATE cron_runs SET status = ?, ended_at = ?, error = ?"
                " WHERE id = ? AND status IN ('running', 'interrupted')"
                " RETURNING job_id, started_at",
                (status, self._now(), _truncate(error), run_id),
            )
            if row is None:
                return False
            await self._db.execute(
                "UPDATE cron_jobs SET last_status = ? WHERE id = ? AND last_run = ?",
                (status, row["job_id"], row["started_at"]),
            )
            await self._bump()
        return True

    async def record_missed(
        self, job_id: str, due_at: datetime, *, next_run: datetime | None
    ) -> int | None:
        """Record that the occurrence `due_at` was missed and move the job to `next_run`
        (None disables it), atomically, with the same claim on `due_at` as `start_run`."""
        recorded = self._now()
        async with self._db.transaction():
            if not await self._claim(job_id, due_at, next_run, "missed", recorded):
                return None
            return await self._insert_run(job_id, due_at, "missed", recorded, recorded)

    async def runs(self, job_id: str, limit: int = 20) -> builtins.list[JobRun]:
        """The job's most recent runs, newest first."""
        rows = await self._db.fetchall(
            "SELECT * FROM cron_runs WHERE job_id = ? ORDER BY id DESC LIMIT ?", (job_id, limit)
        )
        return [run_of(row) for row in rows]

    async def mark_interrupted_runs(self) -> int:
        """Finish every run still `running` as `interrupted`; how many there were.

        Call it at start-up, before any run starts: such runs were left by a process that
        stopped or crashed mid-run.
        """
        async with self._db.transaction():
            rows = await self._db.fetchall(
                "UPDATE cron_runs SET status = 'interrupted', ended_at = ?, error = ?"
                " WHERE status = 'running' RETURNING job_id, started_at",
                (self._now(), INTERRUPTED_ERROR),
            )
            for row in rows:
                await self._db.execute(
                    "UPDATE cron_jobs SET last_status = 'interrupted'"
                    " WHERE id = ? AND last_run = ?",
                    (row["job_id"], row["started_at"]),
                )
            if rows:
                await self._bump()
        return len(rows)

    async def _claim(
        self,
        job_id: str,
        due_at: datetime | None,
        next_run: datetime | None,
        status: RunStatus,
        started_at: str,
    ) -> bool:
        claim = "" if due_at is None else "AND enabled = 1 AND next_run = ?"
        return await self._update(
            job_id,
            f"{_NEXT}, last_status = ?, last_run = ?",
            (*_next(next_run), status, started_at),
            where=claim,
            where_params=() if due_at is None else (to_text(due_at),),
        )

    async def _insert_run(
        self,
        job_id: str,
        due_at: datetime | None,
        status: RunStatus,
        started_at: str,
        ended_at: str | None,
    ) -> int:
        row = await self._db.fetchone(
            "INSERT INTO cron_runs (job_id, due_at, started_at, ended_at, status)"
            " VALUES (?, ?, ?, ?, ?) RETURNING id",
            (job_id, None if due_at is None else to_text(due_at), started_at, ended_at, status),
        )
        assert row is not None
        # Keep the newest HISTORY_LIMIT runs of this job.
        await self._db.execute(
            "DELETE FROM cron_runs WHERE job_id = ? AND id <= (SELECT id FROM cron_runs"
            " WHERE job_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
            (job_id, job_id, HISTORY_LIMIT),
        )
        return int(row["id"])

    async def _update(
        self,
        job_id: str,
        assignments: str,
        params: tuple[SqlValue, ...],
        owner: str | None = None,
        *,
        where: str = "",
        where_params: tuple[SqlValue, ...] = (),
    ) -> bool:
        """Change one job (bumping the version if it changed); whether it did."""
        owned, mine = _owned(owner)
        async with self._db.transaction():
            changed = await self._db.execute(
                f"UPDATE cron_jobs SET {assignments} WHERE id = ? {owned} {where}",
                (*params, job_id, *mine, *where_params),
            )
            if changed:
                await self._bump()
        return changed > 0

    def _now(self) -> str:
        return to_text(self._clock())

    async def _bump(self) -> None:
        await self._db.execute("UPDATE cron_state SET version = version + 1 WHERE id = 1")
        if self._db.dialect.name == "postgresql":
            # Said on commit, to every member of a cluster: the one scheduling looks now.
            await self._db.execute("SELECT pg_notify(?, '')", (CRON_CHANGED,))


def _owned(owner: str | None) -> tuple[str, tuple[SqlValue, ...]]:
    """A condition and its parameter scoping a statement to `owner`'s jobs (all when None)."""
    return ("", ()) if owner is None else ("AND owner = ?", (owner,))


_NEXT: Final = "enabled = ?, next_run = ?"


def _next(next_run: datetime | None) -> tuple[int, str | None]:
    """Values for `_NEXT`: a job is enabled exactly when it has a next run."""
    return (0, None) if next_run is None else (1, to_text(next_run))


def _truncate(error: str | None) -> str | None:
    return None if error is None else error[:2000]
