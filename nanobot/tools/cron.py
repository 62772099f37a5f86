"""The `cron` tool: the agent schedules, lists and removes jobs for the chat it talks in.

Jobs made here belong to the chat (its session key): a chat neither sees nor removes another
chat's jobs, and a job's result is delivered to the chat that made it. A private chat is
named for its user there (`ChatRef.direct`): the same chat, which also says, on every
platform, who approves the job's calls when nobody is talking.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal, Protocol

from pydantic import Field

from nanobot.bus.events import ChatRef
from nanobot.cron.jobs import ScheduleSpec
from nanobot.cron.models import Job, ScheduleError
from nanobot.cron.schedule import describe, format_time, zone_of
from nanobot.tools.base import Tool, ToolContext, ToolError, ToolParams, tool_context


class JobsPort(Protocol):
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
    ) -> Job: ...

    async def all(self, owner: str | None = None) -> list[Job]: ...

    async def remove(self, job_id: str, owner: str | None = None) -> bool: ...

    @property
    def default_zone(self) -> str:
        """The zone times of jobs without their own are shown in."""
        ...


class CronParams(ToolParams):
    action: Literal["add", "list", "remove"] = Field(description="What to do.")
    message: str | None = Field(
        None, description="add: what to do each time it runs, written as a request to yourself."
    )
    name: str | None = Field(None, description="add: a short name for the job.")
    every: str | None = Field(None, description="add: an interval such as 30m, 2h, 1d.")
    cron: str | None = Field(None, description="add: a 5-field cron expression, e.g. 0 9 * * 1-5.")
    at: str | None = Field(None, description="add: one time, ISO 8601, e.g. 2026-12-01T09:00.")
    tz: str | None = Field(None, description="add: IANA time zone for cron/at, e.g. Europe/Berlin.")
    job_id: str | None = Field(None, description="remove: the job's id.")


class CronTool(Tool[CronParams]):
    name = "cron"
    description = (
        "Schedule reminders and recurring tasks for this chat: add (with exactly one of every, "
        "cron or at), list, or remove jobs. Each run is a turn of yours with the job's message; "
        "its answer is sent to this chat."
    )
    params = CronParams

    def __init__(self, jobs: JobsPort, *, deliverable: Collection[str]) -> None:
        self._jobs = jobs
        self._deliverable = frozenset(deliverable)

    async def run(self, args: CronParams) -> str:
        context = tool_context()
        owner = context.session_key
        if args.action == "list":
            jobs = await self._jobs.all(owner)
            if not jobs:
                return "This chat has no scheduled jobs."
            return "\n".join(_line(job, self._jobs.default_zone) for job in jobs)
        if args.action == "remove":
            if not args.job_id:
                raise ToolError("remove needs job_id (see the list action)")
            if not await self._jobs.remove(args.job_id, owner):
                raise ToolError(f"this chat has no job {args.job_id}")
            return f"Removed job {args.job_id}."
        if not args.message:
            raise ToolError("add needs a message: what should happen each time the job runs")
        deliver = context.channel in self._deliverable
        try:
            job = await self._jobs.add(
                args.name or "",
                args.message,
                ScheduleSpec(args.every, args.cron, args.at, args.tz),
                channel=context.channel if deliver else None,
                to=_delivery_chat(context) if deliver else None,
                owner=owner,
                created_by=_maker(context),
            )
        except ScheduleError as exc:
            raise ToolError(str(exc)) from None
        added = f"Scheduled job {job.id}: {_line(job, self._jobs.default_zone)}"
        if not deliver:
            added += (
                f". Its answers are not sent anywhere: jobs cannot deliver to {context.channel}"
            )
        return added


def _maker(context: ToolContext) -> str | None:
    """The person a job made in `context` runs as: the turn's own."""
    if context.person is not None:
        return context.person
    return f"{context.channel}:{context.sender_id}" if context.sender_id else None


def _delivery_chat(context: ToolContext) -> str:
    """The chat id a job made in `context`'s chat delivers to: a private chat as its user's
    (`@<user id>`; a Discord DM's own id does not say whose it is), any other as it is."""
    if context.private and context.sender_id:
        return ChatRef.direct(context.channel, context.sender_id).chat_id
    return context.chat_id


def _line(job: Job, default_zone: str) -> str:
    upcoming = "disabled"
    if job.next_run:
        upcoming = format_time(job.next_run, zone_of(job.schedule, default_zone))
    return (
        f"{job.id} {job.name!r}: {describe(job.schedule)}, next {upcoming}, message {job.message!r}"
    )
