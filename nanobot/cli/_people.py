"""`nanobot people`: the people nanobot knows, kept apart (`people.isolation`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nanobot.cli._command import config_of, fail

people_app = typer.Typer(
    help="The people nanobot talks to: list them, link one person's ids, export or forget "
    "what it holds of someone.",
    no_args_is_help=True,
)

_ID_HELP = "A person's id: channel:user_id, e.g. telegram:123456 (see nanobot people list)."


@people_app.command("list")
def people_list(ctx: typer.Context) -> None:
    """Everyone who has talked to nanobot: their id, the ids linked to them, how many private
    chats and groups, and their folder (with people.isolation: person)."""
    from nanobot import manage
    from nanobot.errors import NanobotError

    try:
        lines = manage.people_list(config_of(ctx))
    except NanobotError as exc:
        fail(str(exc))
    for line in lines:
        typer.echo(line)


@people_app.command("link")
def people_link(
    ctx: typer.Context,
    person: Annotated[str, typer.Argument(help=_ID_HELP)],
    other: Annotated[str, typer.Argument(help="Another id of the same person, e.g. discord:42.")],
) -> None:
    """Make OTHER the same person as PERSON (one person on Telegram and Discord): OTHER's
    turns then use PERSON's folder, memory and search. Takes effect when the gateway starts."""
    from nanobot import manage
    from nanobot.errors import NanobotError

    try:
        typer.echo(manage.people_link(config_of(ctx), person, other))
    except NanobotError as exc:
        fail(str(exc))


@people_app.command("export")
def people_export(
    ctx: typer.Context,
    person: Annotated[str, typer.Argument(help=_ID_HELP)],
    to: Annotated[
        Path | None,
        typer.Option(
            "--to",
            help="The folder to write (default ./nanobot-export-<id>); must be new or empty.",
            metavar="DIR",
        ),
    ] = None,
) -> None:
    """Write what nanobot holds of PERSON into a folder: sessions.jsonl (every entry of their
    private chats and their own messages in groups, one JSON object a line) and files/ (a
    copy of their folder)."""
    from nanobot import manage
    from nanobot.errors import NanobotError

    try:
        lines = manage.people_export(config_of(ctx), person, to)
    except (NanobotError, FileExistsError) as exc:
        fail(str(exc))
    for line in lines:
        typer.echo(line)


@people_app.command("forget")
def people_forget(
    ctx: typer.Context,
    person: Annotated[str, typer.Argument(help=_ID_HELP)],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete everything nanobot holds of PERSON: their private sessions and their own
    messages in groups (with the search index's rows), what they sent and were sent, their
    cron jobs, their links, and their folder. Asks first; recorded in the log. Stop the
    gateway first. Their access (allow_from, pairing) is not changed."""
    from nanobot import manage
    from nanobot.errors import NanobotError

    config = config_of(ctx)
    if not yes and not typer.confirm(
        f"Delete everything nanobot holds of {person}? This cannot be undone", default=False
    ):
        fail("nothing was deleted", code=1)
    try:
        lines = manage.people_forget(config, person)
    except NanobotError as exc:
        fail(str(exc))
    for line in lines:
        typer.echo(line)
