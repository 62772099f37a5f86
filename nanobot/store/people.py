"""People kept apart, as the store keeps them (`nanobot.people` says what a person is):
platform ids linked into one person (`person_links`), and the sessions each person took part
in (`person_sessions`: their private chats, and the groups they wrote in), which is what their
memory search may read and what `nanobot people export` and `forget` take.

A person's id is a platform id, `channel:user_id`; `link` makes another one the same person.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from nanobot.errors import NanobotError
from nanobot.store._times import to_text, wall_clock
from nanobot.store.database import Database

_ID: Final = re.compile(r"[a-z][a-z0-9_]{0,31}:[^\s:]{1,128}")


class PersonError(NanobotError):
    """A person's id or a link was refused; the message says why."""


def checked_id(person: str) -> str:
    """`person` as the store keeps it (trimmed), once it is a platform id.

    Raises:
        PersonError: it is not `channel:user_id` (`telegram:123`).
    """
    text = person.strip()
    if not _ID.fullmatch(text):
        raise PersonError(
            f"{person!r} is not a person's id: give channel:user_id, e.g. telegram:123456 "
            "(nanobot people list shows them)"
        )
    return text


@dataclass(frozen=True, slots=True)
class PersonSummary:
    """A person as `nanobot people list` shows them: their id, the other ids linked to
    them, and how many private chats and groups they took part in."""

    person: str
    linked: tuple[str, ...]
    private: int
    groups: int


class PeopleStore:
    """The `person_links` and `person_sessions` tables. Every method raises `StoreError`
    when the database fails."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = wall_clock) -> None:
        self._db = db
        self._clock = clock

    async def links(self) -> dict[str, str]:
        """Every linked platform id → the person it is."""
        rows = await self._db.fetchall("SELECT user_key, person FROM person_links")
        return {str(r[0]): str(r[1]) for r in rows}

    async def link(self, person: str, other: str) -> str:
        """Make `other` the same person as `person` (as `person` is after its own links);
        the ids linked to `other` follow it. Returns the person both now are.

        Raises:
            PersonError: an id is malformed, or both are the same person already.
        """
        person, other = checked_id(person), checked_id(other)
        links = await self.links()
        target = links.get(person, person)
        if links.get(other, other) == target:
            raise PersonError(f"{other} and {person} are the same person already")
        at = to_text(self._clock())
        await self._db.atomic(
            [
                ("UPDATE person_links SET person = ? WHERE person = ?", (target, other)),
                (
                    "INSERT INTO person_links (user_key, person, linked_at) VALUES (?, ?, ?)"
                    " ON CONFLICT (user_key) DO UPDATE SET person = excluded.person,"
                    " linked_at = excluded.linked_at",
                    (other, target, at),
                ),
                ("DELETE FROM person_links WHERE user_key = person", ()),
                # The sessions `other` took part in are the person's now.
                (
                    "INSERT INTO person_sessions (person, session_key, private, first_at)"
                    " SELECT ?, session_key, private, first_at FROM person_sessions"
                    " WHERE person = ? ON CONFLICT (person, session_key) DO NOTHING",
                    (target, other),
                ),
                ("DELETE FROM person_sessions WHERE person = ?", (other,)),
            ]
        )
        return target

    async def seen(self, person: str, session_key: str, *, private: bool) -> None:
        """Note that `person` took part in `session_key` (once; later calls change nothing)."""
        await self._db.execute(
            "INSERT INTO person_sessions (person, session_key, private, first_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (person, session_key) DO NOTHING",
            (person, session_key, int(private), to_text(self._clock())),
        )

    async def sessions(self, person: str) -> dict[str, bool]:
        """The session keys `person` took part in → whether it is a private chat."""
        rows = await self._db.fetchall(
            "SELECT session_key, private FROM person_sessions WHERE person = ?"
            " ORDER BY session_key",
            (person,),
        )
        return {str(r[0]): bool(r[1]) for r in rows}

    async def everyone(self) -> list[PersonSummary]:
        """Every person the store knows of (who took part in a session, or has links)."""
        rows = await self._db.fetchall(
            "SELECT person, SUM(private), COUNT(*) - SUM(private) FROM person_sessions"
            " GROUP BY person ORDER BY person"
        )
        counts = {str(r[0]): (int(r[1] or 0), int(r[2] or 0)) for r in rows}
        linked: dict[str, list[str]] = {}
        for user, person in sorted((await self.links()).items()):
            linked.setdefault(person, []).append(user)
        return [
            PersonSummary(p, tuple(linked.get(p, ())), *counts.get(p, (0, 0)))
            for p in sorted({*counts, *linked})
        ]
