"""What every command shares: its config, loaded from the `--config` the context carries, and
how it ends on an error (the message on stderr, redacted, and the exit code)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from nanobot.config import Config


def fail(message: str, code: int = 1) -> NoReturn:
    """Say `message` on stderr (secrets redacted) and exit with `code`."""
    from nanobot.log import redact

    typer.echo(f"nanobot: {redact(message)}", err=True)
    raise typer.Exit(code)


def config_of(ctx: typer.Context) -> Config:
    """The loaded config; a bad one exits with code 2 and the reason."""
    from nanobot.config import load
    from nanobot.errors import ConfigError

    try:
        return load(ctx.obj)
    except ConfigError as exc:
        fail(str(exc), code=2)
