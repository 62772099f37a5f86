"""`nanobot taint`: the files the taint ledger marks as holding content from outside."""

from __future__ import annotations

from nanobot import log
from nanobot.config import Config
from nanobot.manage._command import config_zone, on_store, table, when
from nanobot.store import Database
from nanobot.store.taint import TaintStore


def taint(config: Config, action: str, *paths: str) -> tuple[list[str], bool]:
    """Run a `nanobot taint` action: `list` the files the taint ledger marks, or `clear`
    PATH… (workspace-relative, as listed: you vouch for what they hold now). Returns the
    lines to print and whether it succeeded."""
    log.configure(config, quiet=True)
    zone = config_zone(config)

    async def work(db: Database) -> tuple[list[str], bool]:
        store = TaintStore(db)
        if action == "clear":
            await store.clear(paths)
            return [f"Cleared {len(paths)} path(s): their content counts as yours now."], True
        marks = await store.all()
        if not marks:
            return ["No file is marked as holding content from outside."], True
        rows = [("PATH", "MARKED", "SESSION", "WHERE FROM")]
        for mark in marks:
            marked = when(mark.marked_at, zone)
            source = log.printable(mark.source)
            rows.append((log.printable(mark.path), marked, mark.session_key or "-", source))
        return table(rows), True

    return on_store(config, work)
