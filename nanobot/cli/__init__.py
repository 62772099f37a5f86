"""The `nanobot` command line (`_app`): the top-level commands, and the groups of
`pairing`, `approvals`, `taint` (`_manage`), `cron` (`_cron`) and `memory` (`_memory`)."""

from nanobot.cli._app import app, main

__all__ = ["app", "main"]
