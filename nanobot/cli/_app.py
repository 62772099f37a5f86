"""The `nanobot` command line: arguments in, calls into `nanobot.launch` and `nanobot.manage` out.

Kept light on purpose: `nanobot --help`, `status` and `onboard` must not import litellm or
the chat libraries, so everything heavy is imported inside the command that needs it.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from nanobot import __version__
from nanobot.cli._command import config_of, fail
from nanobot.cli._cron import cron_app
from nanobot.cli._manage import approvals_app, pairing_app, taint_app
from nanobot.cli._mcp import mcp_app
from nanobot.cli._memory import memory_app
from nanobot.cli._people import people_app
from nanobot.cli._usage import usage

app = typer.Typer(
    name="nanobot",
    help="nanobot: a personal AI assistant that lives in your chats.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command, as in most CLIs
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
        fail(str(exc), code=2)
    for line in lines:
        typer.echo(line)


def _ask_onboarding_questions() -> dict[str, str]:
    from nanobot.config.agent import base_advice, model_advice

    typer.echo("A few questions; press Enter to keep the default.")
    model = _ask_until_valid("Model (<provider>/<model>)", "openai/gpt-4o-mini", model_advice)
    api_base = _ask_until_valid("OpenAI-compatible endpoint, if any", "", base_advice)
    api_key = typer.prompt("API key", default="", hide_input=True, show_default=False)
    return {"model": model, "api_base": api_base, "api_key": api_key}


def _ask_until_valid(
    question: str, default: str, advice: Callable[[str], tuple[str, str] | None]
) -> str:
    """Ask until the answer passes the config's own check (an empty answer is no answer):
    a wrong one is said, and asked again with what it most likely meant as the default, so
    that the config written is one the gateway then starts with."""
    while True:
        answer: str = typer.prompt(question, default=default, show_default=bool(default))
        problem = advice(answer) if answer.strip() else None
        if problem is None:
            return answer.strip()
        typer.echo(f"  {problem[0]}")
        default = problem[1]


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
            help="Only say whether the gateway of this data dir runs: exit 0 while it holds "
            "the data dir's lock and beats in the state database (its last beat at most "
            "three beats old: 45 s alone, cluster.lease_seconds in a cluster), else 1 "
            "(for HEALTHCHECK).",
        ),
    ] = False,
) -> None:
    """Show the config file, directories, model, channels, the running gateway, exec's
    sandbox and store figures (no secrets). Exits 1 when the state database is damaged,
    saying how to restore it."""
    from nanobot import manage
    from nanobot.config import config_path
    from nanobot.errors import StoreError

    config = config_of(ctx)
    if check:
        try:
            line, alive = manage.health(config)
        except StoreError as exc:
            fail(str(exc))
        typer.echo(line)
        raise typer.Exit(0 if alive else 1)
    from nanobot.app import describe_limits, describe_sandbox

    try:
        rows = manage.status(config, config_path(ctx.obj), check_db=check_db)
    except StoreError as exc:
        fail(str(exc))
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
        typer.Option(
            "--message", "-m", help="Send one message, print the reply and exit.", metavar="TEXT"
        ),
    ] = None,
    session: Annotated[
        str,
        typer.Option(
            "--session", "-s", help="Session to talk in; reuse it to continue.", metavar="TEXT"
        ),
    ] = "cli:default",
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show info logs on stderr.")
    ] = False,
) -> None:
    """Talk to the agent from the terminal: one message with -m, else an interactive chat."""
    from nanobot import launch
    from nanobot.errors import ConfigError, NanobotError

    if message is not None and not message.strip():  # a model call for nothing
        fail("-m needs a message: it is empty", code=2)
    config = config_of(ctx)
    try:
        if message is None:
            launch.chat(config, session, verbose=verbose)
        else:
            typer.echo(launch.ask(config, message, session, verbose=verbose))
    except NanobotError as exc:
        fail(launch.describe_error(exc), code=2 if isinstance(exc, ConfigError) else 1)


@app.command()
def gateway(ctx: typer.Context) -> None:
    """Run the long-lived service: channels, the agent loop and schedules."""
    from nanobot import launch
    from nanobot.errors import ConfigError, NanobotError

    config = config_of(ctx)
    try:
        code = launch.serve(config)
    except NanobotError as exc:
        fail(launch.describe_error(exc), code=2 if isinstance(exc, ConfigError) else 1)
    raise typer.Exit(code)


app.add_typer(pairing_app, name="pairing")
app.add_typer(approvals_app, name="approvals")
app.add_typer(taint_app, name="taint")
app.add_typer(cron_app, name="cron")
app.add_typer(mcp_app, name="mcp")
app.add_typer(memory_app, name="memory")
app.command("usage")(usage)
app.add_typer(people_app, name="people")


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    finally:
        # litellm leaves hundreds of thousands of objects behind; a final collection over
        # them made `agent -m` spend about a second exiting after its reply was printed.
        gc.freeze()
