"""The `nanobot` command line: arguments in, calls into `nanobot.app` out.

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
    from nanobot.config import Config

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
    typer.echo(f"nanobot: {message}", err=True)
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
    from nanobot import app as nanobot_app
    from nanobot.config import config_path
    from nanobot.errors import ConfigError

    path = config_path(ctx.obj)
    answers: dict[str, str] = {}
    if not non_interactive and sys.stdin.isatty() and not path.exists():
        answers = _ask_onboarding_questions()
    try:
        lines = nanobot_app.onboard(path, answers)
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
def status(ctx: typer.Context) -> None:
    """Show the config file, directories, model, channels and store figures (no secrets)."""
    from nanobot import app as nanobot_app
    from nanobot.config import config_path
    from nanobot.errors import StoreError

    config = _config(ctx)
    try:
        rows = nanobot_app.status(config, config_path(ctx.obj))
    except StoreError as exc:
        _fail(str(exc))
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
    from nanobot import app as nanobot_app
    from nanobot.errors import NanobotError

    config = _config(ctx)
    try:
        if message is None:
            nanobot_app.chat(config, session, verbose=verbose)
        else:
            typer.echo(nanobot_app.ask(config, message, session, verbose=verbose))
    except NanobotError as exc:
        _fail(nanobot_app.describe_error(exc))


@app.command()
def gateway(ctx: typer.Context) -> None:
    """Run the long-lived service: channels, the agent loop and schedules."""
    from nanobot import app as nanobot_app
    from nanobot.errors import NanobotError

    config = _config(ctx)
    try:
        code = nanobot_app.serve(config)
    except NanobotError as exc:
        _fail(nanobot_app.describe_error(exc))
    raise typer.Exit(code)


pairing_app = typer.Typer(
    help="Approve or deny people who asked to talk to nanobot, and revoke access.",
    no_args_is_help=True,
)
app.add_typer(pairing_app, name="pairing")


def _pairing(ctx: typer.Context, action: str, *args: str) -> None:
    from nanobot import app as nanobot_app
    from nanobot.errors import NanobotError

    config = _config(ctx)
    try:
        lines, ok = nanobot_app.pairing(config, action, *args)
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


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    finally:
        # litellm leaves hundreds of thousands of objects behind; a final collection over
        # them made `agent -m` spend about a second exiting after its reply was printed.
        gc.freeze()
