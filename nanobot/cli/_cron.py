"""`nanobot cron`: the scheduled jobs, listed, added, changed and run from the command line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from nanobot.cli._command import config_of, fail

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from nanobot.cron.jobs import Jobs

cron_app = typer.Typer(
    help="Scheduled jobs: each run is an agent turn; its answer can go to a chat.",
    no_args_is_help=True,
)


def _cron(ctx: typer.Context, work: Callable[[Jobs], Awaitable[list[str]]]) -> None:
    from nanobot import manage
    from nanobot.errors import NanobotError

    config = config_of(ctx)
    try:
        lines = manage.cron(config, work)
    except NanobotError as exc:
        fail(str(exc))
    for line in lines:
        typer.echo(line)


@cron_app.command("list")
def cron_list(ctx: typer.Context) -> None:
    """Every job: id, name, schedule, time zone, next run (in its zone), and how the last run
    went: its status and whether its answer was delivered."""
    from nanobot import manage

    async def work(jobs: Jobs) -> list[str]:
        listed = await jobs.all()
        last = {job.id: runs[0] for job in listed if (runs := await jobs.runs(job.id, 1))}
        return manage.job_lines(listed, jobs.default_zone, last)

    _cron(ctx, work)


@cron_app.command("runs")
def cron_runs(
    ctx: typer.Context,
    job_id: Annotated[
        str, typer.Argument(help="The job's id (nanobot cron list).", metavar="JOB_ID")
    ],
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, help="How many runs.", metavar="N")
    ] = 20,
) -> None:
    """A job's latest runs, newest first: when each was due and started, how its turn ended,
    and whether its answer reached the chat (pending, delivered, or not delivered and why)."""
    from nanobot import manage
    from nanobot.errors import NanobotError

    async def work(jobs: Jobs) -> list[str]:
        job = await jobs.get(job_id)
        if job is None:
            raise NanobotError(f"no job {job_id} (see nanobot cron list)")
        return manage.run_lines(job, await jobs.runs(job_id, limit), jobs.default_zone)

    _cron(ctx, work)


@cron_app.command("add")
def cron_add(
    ctx: typer.Context,
    *,
    name: Annotated[str, typer.Option("--name", help="A short name.", metavar="TEXT")],
    message: Annotated[
        str, typer.Option("--message", help="What nanobot does at each run.", metavar="TEXT")
    ],
    every: Annotated[
        str | None, typer.Option("--every", help="Interval: 30s, 10m, 2h, 1d.", metavar="TEXT")
    ] = None,
    cron: Annotated[
        str | None,
        typer.Option("--cron", help="5-field cron expression: '0 9 * * 1-5'.", metavar="TEXT"),
    ] = None,
    at: Annotated[
        str | None,
        typer.Option("--at", help="One time, ISO 8601: 2026-12-01T09:00+01:00.", metavar="TEXT"),
    ] = None,
    tz: Annotated[
        str | None,
        typer.Option("--tz", help="IANA zone for --cron/--at (default: config).", metavar="TEXT"),
    ] = None,
    channel: Annotated[
        str | None,
        typer.Option("--channel", help="Deliver the answer on: telegram, discord.", metavar="TEXT"),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="The chat id to deliver to; @<user id> for that user's private chat, where"
            " they approve the job's calls that ask.",
            metavar="TEXT",
        ),
    ] = None,
) -> None:
    """Add a job. Exactly one of --every, --cron or --at."""
    from nanobot import manage
    from nanobot.cron.jobs import ScheduleSpec

    async def work(jobs: Jobs) -> list[str]:
        spec = ScheduleSpec(every, cron, at, tz)
        job = await jobs.add(name, message, spec, channel=channel, to=to)
        return [manage.added_line(job, jobs.default_zone)]

    _cron(ctx, work)


def _job_action(ctx: typer.Context, job_id: str, action: str, done: str) -> None:
    from nanobot.errors import NanobotError

    async def work(jobs: Jobs) -> list[str]:
        if not await getattr(jobs, action)(job_id):
            raise NanobotError(f"no job {job_id} (see nanobot cron list)")
        return [f"{done} job {job_id}."]

    _cron(ctx, work)


JobId = Annotated[str, typer.Argument(help="The job's id (nanobot cron list).")]


@cron_app.command("remove")
def cron_remove(ctx: typer.Context, job_id: JobId) -> None:
    """Delete a job and its history."""
    _job_action(ctx, job_id, "remove", "Removed")


@cron_app.command("enable")
def cron_enable(ctx: typer.Context, job_id: JobId) -> None:
    """Enable a job from now on."""
    _job_action(ctx, job_id, "enable", "Enabled")


@cron_app.command("disable")
def cron_disable(ctx: typer.Context, job_id: JobId) -> None:
    """Stop a job from running (it is kept)."""
    _job_action(ctx, job_id, "disable", "Disabled")


@cron_app.command("run")
def cron_run(ctx: typer.Context, job_id: JobId) -> None:
    """Run a job now: a running gateway starts it within two seconds; with none running, it
    runs when one starts."""
    from nanobot import manage

    gateway = manage.gateway_pid(config_of(ctx).data_dir)

    async def work(jobs: Jobs) -> list[str]:
        return await manage.run_job(jobs, job_id, gateway)

    _cron(ctx, work)
