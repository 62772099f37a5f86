"""`nanobot memory search`: the memory search from the command line, with the same answer
`memory_search` gives the model: over everything, or (`--user`) as one person's private
chat would search."""

from __future__ import annotations

import asyncio
import zoneinfo
from pathlib import Path

from nanobot import log
from nanobot.config import Config
from nanobot.errors import NanobotError
from nanobot.people import People, shared_mode
from nanobot.recall import EVERYTHING, Scope
from nanobot.store import Database
from nanobot.store.people import PeopleStore, checked_id
from nanobot.store.search import SearchIndex
from nanobot.tools.memory_search import MemoryRecall


async def _as_person(
    config: Config, db: Database, user: str, session: str | None
) -> tuple[Scope, Path] | str:
    """What `user`'s private chat searches (see `agent.persons`): with people kept apart,
    the sessions they took part in and their folder's memory files; with `shared`, every
    session and the workspace's. Or the line to print when there is nothing to search.

    Raises:
        PersonError: `user` is not a person's id.
        NanobotError: `session` is not one of theirs.
    """
    store = PeopleStore(db)
    has_sessions = await db.fetchone("SELECT 1 FROM sessions LIMIT 1") is not None
    isolation = shared_mode(config.people.isolation, has_sessions=has_sessions)
    people = People(config.workspace_path, isolation, config.people.owner, await store.links())
    person = people.resolve(checked_id(user))
    if not people.apart:
        only = EVERYTHING if session is None else Scope(frozenset({session}))
        return only, config.workspace_path
    theirs = set(await store.sessions(person))
    if session is not None:
        if session not in theirs:
            raise NanobotError(f"{person} took no part in {session}: nothing of it is theirs")
        theirs = {session}
    if not theirs:
        return f"{person} has taken part in no conversation yet (nanobot people list)"
    return Scope(frozenset(theirs)), people.root(person)


async def _search(
    config: Config, query: str, limit: int | None, session: str | None, user: str | None
) -> str:
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    zone = zoneinfo.ZoneInfo(config.timezone) if config.timezone else None
    async with await Database.open(config.store_target) as db:
        recall = MemoryRecall(SearchIndex(db), config.workspace_path, zone)
        if user is None:
            scope = EVERYTHING if session is None else Scope(frozenset({session}))
            return await recall.search(query, limit=limit, scope=scope)
        found = await _as_person(config, db, user, session)
        if isinstance(found, str):
            return found
        scope, files = found
        return await recall.search(query, limit=limit, scope=scope, files=files)


def memory_search(
    config: Config,
    query: str,
    *,
    limit: int | None = None,
    session: str | None = None,
    user: str | None = None,
) -> list[str]:
    """The hits for `query` in every session (or only `session`, a session key) and the
    memory files, as lines to print; with `user` (a person's id, `telegram:123`), what that
    person's private chat would find: their sessions and memory files only, where people are
    kept apart (`people.isolation: person`).

    Raises:
        ToolError: the query or the limit was refused (it says why).
        PersonError: `user` is not a person's id.
        NanobotError: the store failed, or `session` is not one of `user`'s.
    """
    log.configure(config, quiet=True)
    return asyncio.run(_search(config, query, limit, session, user)).splitlines()
