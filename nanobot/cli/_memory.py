"""`nanobot memory`: the memory search from the command line."""

from __future__ import annotations

from typing import Annotated

import typer

from nanobot.cli._command import config_of, fail

memory_app = typer.Typer(
    help="The memory: search past conversations and the memory files.", no_args_is_help=True
)


@memory_app.command("search")
def memory_search(
    ctx: typer.Context,
    text: Annotated[str, typer.Argument(help='Words to look for ("quoted" for a phrase).')],
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit", "-n", help="How many hits at most (default 10, at most 50).", metavar="N"
        ),
    ] = None,
    session: Annotated[
        str | None,
        typer.Option(
            "--session", help="Only this session (its key, e.g. telegram:12345).", metavar="KEY"
        ),
    ] = None,
    user: Annotated[
        str | None,
        typer.Option(
            "--user",
            help="Search as this person's private chat would (their id, e.g. telegram:12345): "
            "with people.isolation: person only the chats and groups they took part in and "
            "their own memory files.",
            metavar="ID",
        ),
    ] = None,
) -> None:
    """Find TEXT in every conversation (what compaction took out of the context too) and in
    memory/*.md: ranked hits with date, session, who said it and a snippet, the same as the
    agent's memory_search tool."""
    from nanobot import manage
    from nanobot.errors import NanobotError

    config = config_of(ctx)
    try:
        lines = manage.memory_search(config, text, limit=limit, session=session, user=user)
    except NanobotError as exc:
        fail(str(exc))
    for line in lines:
        typer.echo(line)
