"""`nanobot memory search`: the memory search from the command line, with the same answer
`memory_search` gives the model."""

from __future__ import annotations

import asyncio
import zoneinfo

from nanobot import log
from nanobot.config import Config
from nanobot.recall import EVERYTHING, Scope
from nanobot.store import Database
from nanobot.store.search import SearchIndex
from nanobot.tools.memory_search import MemoryRecall


async def _search(config: Config, query: str, limit: int | None, session: str | None) -> str:
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    zone = zoneinfo.ZoneInfo(config.timezone) if config.timezone else None
    scope = EVERYTHING if session is None else Scope(frozenset({session}))
    async with await Database.open(config.store_target) as db:
        recall = MemoryRecall(SearchIndex(db), config.workspace_path, zone)
        return await recall.search(query, limit=limit, scope=scope)


def memory_search(
    config: Config, query: str, *, limit: int | None = None, session: str | None = None
) -> list[str]:
    """The hits for `query` in every session (or only `session`, a session key) and the
    memory files, as lines to print.

    Raises:
        ToolError: the query or the limit was refused (it says why).
        NanobotError: the store failed.
    """
    log.configure(config, quiet=True)
    return asyncio.run(_search(config, query, limit, session)).splitlines()
