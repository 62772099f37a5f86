"""People kept apart: who a message is from, and the folder that person's turns work in.

A *person* is named by a platform user id, `channel:user_id` (`telegram:123`); `nanobot
people link` makes several ids one person (the ids linked to a person map to it). With
`people.isolation: person` each person has a folder of their own, `people/<folder>/` under the
workspace, holding their `USER.md`, `memory/`, the files they were sent (`inbox/`) and what
their turns write: the file tools, `exec`, the memory search and the system prompt of a turn
see only the folder of the person the turn runs as. The shared prompt files (`AGENTS.md`,
`SOUL.md`, `TOOLS.md`, `skills/`) stay in the workspace, read-only to those turns. With
`shared`, everyone works in the whole workspace, as before there were people.

This module is pure: the links come from the store, read once at start (see `nanobot.app`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from nanobot.workspace import Workspace, bundled

Isolation = Literal["shared", "person"]
ISOLATIONS: Final[tuple[Isolation, ...]] = ("shared", "person")

PEOPLE_DIR: Final = "people"
"""The workspace folder that holds each person's folder."""
NOBODY: Final = "nobody"
"""The folder of turns that run as no one (no sender, and no `people.owner`): it holds
nobody's files. No person's folder has this name (each holds a `-`)."""
PERSONAL_FILES: Final = ("USER.md", "memory/MEMORY.md")
"""What a new person's folder starts with, from the workspace template."""
SHARED_FILES: Final = ("AGENTS.md", "SOUL.md", "TOOLS.md", "HEARTBEAT.md", "skills")
"""What stays shared in the workspace and is shown read-only to each person's turns."""


def person_id(channel: str, user_id: str) -> str:
    """The platform id of a user: `telegram:123`."""
    return f"{channel}:{user_id}"


def folder_name(person: str) -> str:
    """The name of `person`'s folder: letters and digits kept, the first `:` as `-`, every
    other byte as `_XX` (hex). One name per person and no two alike; nothing in it a shell,
    a path or a `..` could use (`telegram:123` → `telegram-123`)."""
    channel, _, user = person.partition(":")

    def encoded(text: str) -> str:
        return "".join(
            c if c.isascii() and c.isalnum() else "".join(f"_{b:02x}" for b in c.encode())
            for c in text
        )

    return f"{encoded(channel)}-{encoded(user)}"


@dataclass(frozen=True, slots=True)
class People:
    """Who is who, and where each person's turns work.

    `links` maps a platform id to the person it was linked to (`nanobot people link`);
    `owner` is the person the heartbeat (and a turn with no sender) runs as.
    """

    workspace: Path
    isolation: Isolation = "shared"
    owner: str | None = None
    links: Mapping[str, str] = field(default_factory=dict)

    @property
    def apart(self) -> bool:
        """Whether each person has a folder of their own (`isolation: person`)."""
        return self.isolation == "person"

    def person(self, channel: str, user_id: str | None) -> str | None:
        """The person `user_id` of `channel` is (after links); None without a user id. A
        `user_id` that is a whole person id already (`telegram:123`: a cron job's maker;
        platforms' own ids hold no `:`) is taken as it is."""
        if not user_id:
            return None
        found = user_id if ":" in user_id else person_id(channel, user_id)
        return self.links.get(found, found)

    def resolve(self, person: str) -> str:
        """`person` after links (an id linked to another names that one)."""
        return self.links.get(person, person)

    def acting(self, person: str | None) -> str | None:
        """Whom a turn of `person` runs as: them, or the owner when there is no one."""
        return person if person is not None else self.owner and self.resolve(self.owner)

    def root(self, person: str | None) -> Path:
        """The folder a turn of `person` works in: the workspace when people share it, else
        `people/<folder>/` (the owner's when `person` is None; `people/nobody/` without an
        owner)."""
        if not self.apart:
            return self.workspace
        who = self.acting(person)
        name = folder_name(who) if who is not None else NOBODY
        return self.workspace / PEOPLE_DIR / name

    def prepare(self, person: str | None) -> Path:
        """`root(person)`, made when missing with the template's `USER.md` and memory.

        Blocking (run it in a thread). Written through `Workspace.put_new`, so a symlink
        planted at `people/` or at the folder is never followed out of the workspace.

        Raises:
            OSError: the folder could not be made (a symlink on the way, a full disk).
        """
        root = self.root(person)
        if root == self.workspace:
            return root
        confined = Workspace(self.workspace)
        relative = root.relative_to(self.workspace)
        os.close(confined.open_dir(relative, create=True, follow=False))
        template = bundled("workspace_template")
        for name in PERSONAL_FILES:
            source = template / name
            target = relative / name
            if source.is_file():
                confined.put_new(target.parent, target.name, source.read_bytes())
        return root


def shared_mode(configured: Isolation | None, *, has_sessions: bool) -> Isolation:
    """The isolation in force: what the config says; without the key, `person` for a new
    install (a store with no session yet) and `shared` for one that already holds
    conversations, which keeps working as it did until its owner moves (see the README)."""
    if configured is not None:
        return configured
    return "shared" if has_sessions else "person"
