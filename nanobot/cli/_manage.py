"""`nanobot pairing`, `nanobot approvals` and `nanobot taint`: each action runs one
`nanobot.manage` command and prints its lines."""

from __future__ import annotations

from typing import Annotated

import typer

from nanobot.cli._command import config_of, fail

pairing_app = typer.Typer(
    help="Approve or deny people who asked to talk to nanobot, and revoke access.",
    no_args_is_help=True,
)


def _pairing(ctx: typer.Context, action: str, *args: str) -> None:
    _manage(ctx, "pairing", action, *args)


def _manage(ctx: typer.Context, command: str, action: str, *args: str) -> None:
    """Run `manage.<command>(config, action, *args)`: print its lines, exit 1 when it says
    the action failed."""
    from nanobot import manage
    from nanobot.errors import NanobotError

    config = config_of(ctx)
    try:
        lines, ok = getattr(manage, command)(config, action, *args)
    except NanobotError as exc:
        fail(str(exc))
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
    ctx: typer.Context,
    code: Annotated[str, typer.Argument(help="The 8-character code.", metavar="CODE")],
) -> None:
    """Allow the person who got this pairing code; takes effect at once."""
    _pairing(ctx, "approve", code)


@pairing_app.command("deny")
def pairing_deny(
    ctx: typer.Context,
    code: Annotated[str, typer.Argument(help="The 8-character code.", metavar="CODE")],
) -> None:
    """Drop a pending pairing request."""
    _pairing(ctx, "deny", code)


@pairing_app.command("revoke")
def pairing_revoke(
    ctx: typer.Context,
    user: Annotated[str, typer.Argument(help="The platform user id.", metavar="USER")],
    channel: Annotated[
        str | None,
        typer.Option("--channel", help="Only on this channel (default: all).", metavar="TEXT"),
    ] = None,
) -> None:
    """Take back an approval (users in allow_from are not affected)."""
    _pairing(ctx, "revoke", user, *([channel] if channel else []))


approvals_app = typer.Typer(
    help="Tool calls that ask first (tools.approval): saved rules, waiting requests, the log.",
    no_args_is_help=True,
)


def _approvals(ctx: typer.Context, action: str, *args: str) -> None:
    _manage(ctx, "approvals", action, *args)


@approvals_app.command("rules")
def approvals_rules(ctx: typer.Context) -> None:
    """Saved rules ("always allow"): id, tool, when and by whom, the exact call."""
    _approvals(ctx, "rules")


@approvals_app.command("revoke")
def approvals_revoke(
    ctx: typer.Context,
    rule_id: Annotated[
        str, typer.Argument(help="The rule's id (nanobot approvals rules).", metavar="RULE_ID")
    ],
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
        int,
        typer.Option("--limit", "-n", min=1, help="How many of the latest decisions.", metavar="N"),
    ] = 50,
) -> None:
    """Every decision, oldest first: allowed, denied, expired, cancelled, refused, revoked."""
    _approvals(ctx, "log", str(limit))


taint_app = typer.Typer(
    help="Workspace files holding content from outside (fetched, sent in a chat, written after).",
    no_args_is_help=True,
)


@taint_app.command("list")
def taint_list(ctx: typer.Context) -> None:
    """The files the taint ledger marks: path, when, by which session's turn, where from."""
    _manage(ctx, "taint", "list")


@taint_app.command("clear")
def taint_clear(
    ctx: typer.Context,
    paths: Annotated[
        list[str], typer.Argument(help="Paths as `nanobot taint list` shows them.", metavar="PATHS")
    ],
) -> None:
    """Vouch for files: what they hold now counts as yours (shown as instructions again)."""
    _manage(ctx, "taint", "clear", *paths)
