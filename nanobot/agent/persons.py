"""Whom a turn runs as, and what that person's turn may see (`nanobot.people`).

`Persons.of` answers for one turn: the person (the sender after links; a cron job's maker;
the heartbeat's owner), their folder (made on first use), the prompt built from it, and what
their memory search may read. It also notes which sessions each person takes part in (once
per person and session in a process), which is what a private chat's search reads, and what
`nanobot people export` and `forget` take. With `people.isolation: shared` a turn still has
its person (for those notes) but works in the whole workspace, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from nanobot.agent.context import ContextBuilder
from nanobot.people import People
from nanobot.recall import Scope
from nanobot.store.people import PeopleStore

_SEEN_MOST = 100_000  # (person, session) pairs remembered as noted; past it, noted again


@dataclass(frozen=True, slots=True)
class Acting:
    """What one turn runs as. `root` and `shared` are None when people share the workspace;
    `scope` is None where the memory search's own rule applies (see `memory_search`)."""

    person: str | None
    context: ContextBuilder
    root: Path | None = None
    shared: Path | None = None
    scope: Scope | None = None

    def key(self, path: str) -> str:
        """A ledger key of the whole workspace (`people/<folder>/USER.md`) as the prompt of
        this turn names the file (`USER.md`)."""
        if self.root is None or self.shared is None:
            return path
        prefix = self.root.relative_to(self.shared).as_posix() + "/"
        return path[len(prefix) :] if path.startswith(prefix) else path


class Persons:
    """Builds each turn's `Acting` from `people` (the config and the links) and `store`.
    `contexts` builds the prompt of a person's folder (one per folder, kept); `shared` is
    the prompt of the whole workspace."""

    def __init__(
        self,
        people: People,
        store: PeopleStore,
        shared: ContextBuilder,
        contexts: Callable[[Path], ContextBuilder],
    ) -> None:
        self.people = people
        self._store = store
        self._shared = shared
        self._contexts = contexts
        self._built: dict[Path, ContextBuilder] = {}
        self._seen: set[tuple[str, str]] = set()

    async def of(
        self, channel: str, user_id: str | None, session_key: str, *, private: bool
    ) -> Acting:
        """Whom a turn of `user_id` on `channel` in `session_key` runs as (see the module).

        Raises:
            StoreError: the store could not be read or written.
            OSError: the person's folder could not be made.
        """
        people = self.people
        person = people.acting(people.person(channel, user_id))
        if person is not None:
            await self._note(person, session_key, private=private)
        if not people.apart:
            return Acting(person, self._shared)
        root = people.root(person)
        context = self._built.get(root)
        if context is None:
            await asyncio.to_thread(people.prepare, person)
            context = self._built[root] = self._contexts(root)
        if not private:
            scope = Scope(frozenset({session_key}))  # a group sees only its own conversation
        elif person is None:
            scope = Scope(frozenset({session_key}))
        else:
            own = await self._store.sessions(person)
            scope = Scope(frozenset({*own, session_key}))
        return Acting(person, context, root, people.workspace, scope)

    async def _note(self, person: str, session_key: str, *, private: bool) -> None:
        if (person, session_key) in self._seen:
            return
        await self._store.seen(person, session_key, private=private)
        if len(self._seen) >= _SEEN_MOST:
            self._seen.clear()
        self._seen.add((person, session_key))
        logger.debug("{} takes part in {}", person, session_key)
