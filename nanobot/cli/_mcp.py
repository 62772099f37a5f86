"""`nanobot mcp`: the configured MCP servers, and trying one out."""

from __future__ import annotations

from typing import Annotated

import typer

from nanobot.cli._command import config_of, fail

mcp_app = typer.Typer(
    help="The MCP servers whose tools the model gets (mcp.servers in the config).",
    no_args_is_help=True,
)


@mcp_app.command("list")
def mcp_list(ctx: typer.Context) -> None:
    """Each server, its transport and, while a gateway runs on this data dir, its state
    (running, starting, failed and why, disabled) and its tools with their approval policy.
    Exits 1 when the running gateway reports a server failed."""
    from nanobot import manage

    lines, ok = manage.mcp_list(config_of(ctx))
    for line in lines:
        typer.echo(line)
    if not ok:
        raise typer.Exit(1)


@mcp_app.command("test")
def mcp_test(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The server's name in mcp.servers.", metavar="NAME")],
) -> None:
    """Start one server as the gateway would (in the sandbox, with its own environment),
    list its tools with their approval policy, and stop it. Exits 1 with the reason when it
    does not start, 2 when no server has that name."""
    import asyncio

    from nanobot import log
    from nanobot.app import test_server
    from nanobot.errors import ConfigError

    config = config_of(ctx)
    # The client's warnings ("starting it again in 1 s") are the gateway's story; here the
    # lines below say how it went, the server's stderr included.
    log.configure(config, quiet=True, reported=("nanobot.mcp.connection",))
    try:
        lines, ok = asyncio.run(test_server(config, name))
    except ConfigError as exc:
        fail(str(exc), code=2)
    for line in lines:
        typer.echo(line)
    if not ok:
        raise typer.Exit(1)
