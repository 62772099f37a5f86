"""`nanobot usage`: what nanobot spent, from the usage ledger."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from nanobot.cli._command import config_of, fail

By = Literal["day", "model", "person", "chat", "source"]


def usage(
    ctx: typer.Context,
    since: Annotated[
        str,
        typer.Option(
            "--since",
            help="From when: a duration back from now (7d, 12h) or a date (2026-11-01, from "
            "its midnight in the configured timezone).",
            metavar="WHEN",
        ),
    ] = "30d",
    by: Annotated[
        By,
        typer.Option(
            "--by",
            help="Group by day (in the configured timezone), model, person (platform user "
            "id), chat (session key) or source (chat, cron, heartbeat, task).",
        ),
    ] = "day",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV.")] = False,
) -> None:
    """Tokens (prompt, completion, cached where the provider says), cost in USD and turns,
    grouped, with totals. A model with no known price shows "price unknown", never 0.
    Reads while the gateway runs, on SQLite and PostgreSQL."""
    from nanobot import manage
    from nanobot.errors import NanobotError

    if as_json and as_csv:
        fail("--json and --csv: choose one")
    config = config_of(ctx)
    fmt: Literal["table", "json", "csv"] = "json" if as_json else "csv" if as_csv else "table"
    try:
        lines = manage.usage_report(config, since=since, by=by, fmt=fmt)
    except NanobotError as exc:
        fail(str(exc))
    for line in lines:
        typer.echo(line)
