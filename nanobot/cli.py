"""The `nanobot` command line: arguments in, calls into `nanobot.launch` and `nanobot.manage` out.

Kept light on purpose: `nanobot --help`, `status` and `onboard` must not import litellm or
the chat libraries, so everything heavy is imported inside the command that needs it.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from nanobot import __version__

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from nanobot.config import Config
    from nanobot.cron.jobs import Jobs

app = typer.Typer(
    name="nanobot",
    help="nanobot: a personal AI assistant that lives in your chats.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="Config file. Default: $NANOBOT_CONFIG, else ~/.nanobot/config.yaml.",
        show_default=False,
    ),
]


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"nanobot {__version__}")
        raise typer.Exit


@app.callback()
def _main(
    ctx: typer.Context,
    config: ConfigOption = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    ctx.obj = config


def _fail(message: str, code: int = 1) -> NoReturn:
    from nanobot.log import redact

    typer.echo(f"nanobot: {redact(message)}", err=True)
    raise typer.Exit(code)


def _config(ctx: typer.Context) -> Config:
    """The loaded config; a bad one exits with code 2 and the reason."""
    from nanobot.config import load
    from nanobot.errors import ConfigError

    try:
        return load(ctx.obj)
    except ConfigError as exc:
        _fail(str(exc), code=2)


@app.command()
def onboard(
    ctx: typer.Context,
    non_interactive: Annotated[
        bool, typer.Option("--non-interactive", help="Ask nothing; write the defaults.")
    ] = False,
) -> None:
    """Create the config file and the workspace. Never overwrites an existing file."""
    from nanobot import manage
    from nanobot.config import config_path
    from nanobot.errors import ConfigError

    path = config_path(ctx.obj)
    answers: dict[str, str] = {}
    if not non_interactive and sys.stdin.isatty() and not path.exists():
        answers = _ask_onboarding_questions()
    try:
        lines = manage.onboard(path, answers)
    except ConfigError as exc:
        _fail(str(exc), code=2)
    for line in lines:
        typer.echo(line)


def _ask_onboarding_questions() -> dict[str, str]:
    typer.echo("A few questions; press Enter to keep the default.")
    model = typer.prompt("Model (any litellm id)", default="openai/gpt-4o-mini")
    api_base = typer.prompt("OpenAI-compatible endpoint, if any", default="", show_default=False)
    api_key = typer.prompt("API key", default="", hide_input=True, show_default=False)
    return {"model": model, "api_base": api_base, "api_key": api_key}


@app.command()
def status(
    ctx: typer.Context,
    check_db: Annotated[
        bool,
        typer.Option(
            "--check-db",
            help="Run SQLite's full integrity check of the state database (not only the quick "
            "one); exit 1 with what it found when it is damaged.",
        ),
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Only say whether a gateway runs on this data dir: exit 0 when one recorded "
            "its beat in the state database in the last 45 s, else 1 (for HEALTHCHECK).",
        ),
    ] = False,
) -> None:
    """Show the config file, directories, model, channels, the running gateway, exec's
    sandbox and store figures (no secrets). Exits 1 when the state database is damaged,
    saying how to restore it."""
    from nanobot import manage
    from nanobot.config import config_path
    from nanobot.errors import StoreError

    config = _config(ctx)
    if check:
        try:
            line, alive = manage.health(config)
        except StoreError as exc:
            _fail(str(exc))
        typer.echo(line)
        raise typer.Exit(0 if alive else 1)
    from nanobot.app import describe_limits, describe_sandbox

    try:
        rows = manage.status(config, config_path(ctx.obj), check_db=check_db)
    except StoreError as exc:
        _fail(str(exc))
    rows.append(("sandbox", describe_sandbox(config)))
    rows.append(("limits", describe_limits(config)))
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        typer.echo(f"{label:<{width}}  {value}")


@app.command()
def agent(
    ctx: typer.Context,
    message: Annotated[
        str | None,
        typer.Option("--message", "-m", help="Send one message, print the reply and exit."),
    ] = None,
    session: Annotated[
        str, typer.Option("--session", "-s", help="Session to talk in; reuse it to continue.")
    ] = "cli:default",
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show info logs on stderr.")
    ] = False,
) -> None:
    """Talk to the agent from the terminal: one message with -m, else an interactive chat."""
    from nanobot import launch
    from nanobot.errors import ConfigError, NanobotError

    config = _config(ctx)
    try:
        if message is None:
            launch.chat(config, session, verbose=verbose)
        else:
            typer.echo(launch.ask(config, message, session, verbose=verbose))
    except NanobotError as exc:
        _fail(launch.describe_error(exc), code=2 if isinstance(exc, ConfigError) else 1)


@app.command()
def gateway(ctx: typer.Context) -> None:
    """Run the long-lived service: channels, the agent loop and schedules."""
    from nanobot import launch
    from nanobot.errors import ConfigError, NanobotError

    config = _config(ctx)
    try:
        code = launch.serve(config)
    except NanobotError as exc:
        _fail(launch.describe_error(exc), code=2 if isinstance(exc, ConfigError) else 1)
    raise typer.Exit(code)


pairing_app = typer.Typer(
    help="Approve or deny people who asked to talk to nanobot, and revoke access.",
    no_args_is_help=True,
)
app.add_typer(pairing_app, name="pairing")


def _pairing(ctx: typer.Context, action: str, *args: str) -> None:
    _manage(ctx, "pairing", action, *args)


def _manage(ctx: typer.Context, command: str, action: str, *args: str) -> None:
    """Run `manage.<command>(config, action, *args)`: print its lines, exit 1 when it says
    the action failed."""
    from nanobot import manage
    from nanobot.errors import NanobotError

    config = _config(ctx)
    try:
        lines, ok = getattr(manage, command)(config, action, *args)
    except NanobotError as exc:
        _fail(str(exc))
    for line in lines:
        typer.echo(line)
    if not ok:
        raise typer.Exit(1)


@pairing_app.command("list")
def pairing_list(ctx: typer.Context) -> None:
    """Pending pairing requests and approved users."""
    _pairing(ctx, "list")


@pairing_app.command("approve")
def pairing_approve(
    ctx: typer.Context, code: Annotated[str, typer.Argument(help="The 8-character code.")]
) -> None:
    """Allow the person who got this pairing code; takes effect at once."""
    _pairing(ctx, "approve", code)


@pairing_app.command("deny")
def pairing_deny(
    ctx: typer.Context, code: Annotated[str, typer.Argument(help="The 8-character code.")]
) -> None:
    """Drop a pending pairing request."""
    _pairing(ctx, "deny", code)


@pairing_app.command("revoke")
def pairing_revoke(
    ctx: typer.Context,
    user: Annotated[str, typer.Argument(help="The platform user id.")],
    channel: Annotated[
        str | None, typer.Option("--channel", help="Only on this channel (default: all).")
    ] = None,
) -> None:
    """Take back an approval (users in allow_from are not affected)."""
    _pairing(ctx, "revoke", user, *([channel] if channel else []))


approvals_app = typer.Typer(
    help="Tool calls that ask first (tools.approval): saved rules, waiting requests, the log.",
    no_args_is_help=True,
)
app.add_typer(approvals_app, name="approvals")


def _approvals(ctx: typer.Context, action: str, *args: str) -> None:
    _manage(ctx, "approvals", action, *args)


@approvals_app.command("rules")
def approvals_rules(ctx: typer.Context) -> None:
    """Saved rules ("always allow"): id, tool, when and by whom, the exact call."""
    _approvals(ctx, "rules")


@approvals_app.command("revoke")
def approvals_revoke(
    ctx: typer.Context,
    rule_id: Annotated[str, typer.Argument(help="The rule's id (nanobot approvals rules).")],
) -> None:
    """Delete a saved rule: that call asks again, from now on."""
    _approvals(ctx, "revoke", rule_id)


@approvals_app.command("pending")
def approvals_pending(ctx: typer.Context) -> None:
    """Requests waiting for a decision: id, tool, the chats asked, until when, the call."""
    _approvals(ctx, "pending")


@approvals_app.command("log")
def approvals_log(
    ctx: typer.Context,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, help="How many of the latest decisions.")
    ] = 50,
) -> None:
    """Every decision, oldest first: allowed, denied, expired, cancelled, refused, revoked."""
    _approvals(ctx, "log", str(limit))


taint_app = typer.Typer(
    help="Workspace files holding content from outside (fetched, sent in a chat, written after).",
    no_args_is_help=True,
)
app.add_typer(taint_app, name="taint")


@taint_app.command("list")
def taint_list(ctx: typer.Context) -> None:
    """The files the taint ledger marks: path, when, by which session's turn, where from."""
    _manage(ctx, "taint", "list")


@taint_app.command("clear")
def taint_clear(
    ctx: typer.Context,
    paths: Annotated[list[str], typer.Argument(help="Paths as `nanobot taint list` shows them.")],
) -> None:
    """Vouch for files: what they hold now counts as yours (shown as instructions again)."""
    _manage(ctx, "taint", "clear", *paths)


cron_app = typer.Typer(
    help="Scheduled jobs: each run is an agent turn; its answer can go to a chat.",
    no_args_is_help=True,
)
app.add_typer(cron_app, name="cron")


def _cron(ctx: typer.Context, work: Callable[[Jobs], Awaitable[list[str]]]) -> None:
    from nanobot import manage
    from nanobot.errors import NanobotError

    config = _config(ctx)
    try:
        lines = manage.cron(config, work)
    except NanobotError as exc:
        _fail(str(exc))
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
    job_id: Annotated[str, typer.Argument(help="The job's id (nanobot cron list).")],
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many runs.")] = 20,
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
    name: Annotated[str, typer.Option("--name", help="A short name.")],
    message: Annotated[str, typer.Option("--message", help="What nanobot does at each run.")],
    every: Annotated[
        str | None, typer.Option("--every", help="Interval: 30s, 10m, 2h, 1d.")
    ] = None,
    cron: Annotated[
        str | None, typer.Option("--cron", help="5-field cron expression: '0 9 * * 1-5'.")
    ] = None,
    at: Annotated[
        str | None, typer.Option("--at", help="One time, ISO 8601: 2026-12-01T09:00+01:00.")
    ] = None,
    tz: Annotated[
        str | None, typer.Option("--tz", help="IANA zone for --cron/--at (default: config).")
    ] = None,
    channel: Annotated[
        str | None, typer.Option("--channel", help="Deliver the answer on: telegram, discord.")
    ] = None,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="The chat id to deliver to; @<user id> for that user's private chat, where"
            " they approve the job's calls that ask.",
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

    gateway = manage.gateway_pid(_config(ctx).data_dir)

    async def work(jobs: Jobs) -> list[str]:
        return await manage.run_job(jobs, job_id, gateway)

    _cron(ctx, work)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    finally:
        # litellm leaves hundreds of thousands of objects behind; a final collection over
        # them made `agent -m` spend about a second exiting after its reply was printed.
        gc.freeze()
