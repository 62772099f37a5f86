"""`nanobot people`: list the people nanobot knows, link one person's ids, export what it
holds of a person, and forget them."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from loguru import logger

from nanobot import log
from nanobot.config import Config
from nanobot.people import PEOPLE_DIR, People, folder_name
from nanobot.store import Database
from nanobot.store.people import PeopleStore, checked_id
from nanobot.store.person_data import PersonData

T = TypeVar("T")


def _run(config: Config, work: Callable[[Database], Awaitable[T]]) -> T:
    log.configure(config, quiet=True)
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    async def main() -> T:
        async with await Database.open(config.store_target) as db:
            return await work(db)

    return asyncio.run(main())


def _folder(config: Config, person: str) -> Path:
    return config.workspace_path / PEOPLE_DIR / folder_name(person)


def people_list(config: Config) -> list[str]:
    """One line per person: their id, linked ids, chats, and whether they have a folder.

    Raises:
        NanobotError: the store failed.
    """
    found = _run(config, lambda db: PeopleStore(db).everyone())
    if not found:
        return ["nobody yet: people appear here once they have talked to nanobot"]
    lines = []
    for p in found:
        linked = f" (also {', '.join(p.linked)})" if p.linked else ""
        folder = _folder(config, p.person)
        where = f", folder {folder}" if folder.is_dir() else ""
        lines.append(f"{p.person}{linked}: {p.private} private chats, {p.groups} groups{where}")
    return lines


def people_link(config: Config, person: str, other: str) -> str:
    """Make `other` the same person as `person`; the line to print.

    Raises:
        PersonError: an id is malformed or they are one person already.
        NanobotError: the store failed.
    """
    target = _run(config, lambda db: PeopleStore(db).link(person, other))
    logger.info("people: linked {} to {}", other, target)
    return (
        f"{other.strip()} is now the same person as {target}: their folder, memory and chats "
        f"are {target}'s. A running gateway takes this up when it next starts."
    )


def people_export(config: Config, person: str, to: Path | None) -> list[str]:
    """Write what nanobot holds of `person` to the folder `to` (default
    ./nanobot-export-<folder>): `sessions.jsonl` (one entry a line) and `files/` (a copy of
    their folder, symlinks as symlinks). Returns what it wrote.

    Raises:
        PersonError: the id is malformed. FileExistsError: `to` exists and is not empty.
        NanobotError: the store failed.
    """
    person = checked_id(person)
    target = to if to is not None else Path(f"nanobot-export-{folder_name(person)}")
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} exists and is not empty; give another --to")
    target.mkdir(parents=True, exist_ok=True, mode=0o700)

    async def export(db: Database) -> int:
        count = 0
        with (target / "sessions.jsonl").open("w", encoding="utf-8") as out:
            for record in await PersonData(db).entries(person):
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
        return count

    count = _run(config, export)
    lines = [f"{target / 'sessions.jsonl'}: {count} entries"]
    folder = _folder(config, person)
    if folder.is_dir() and not folder.is_symlink():
        shutil.copytree(folder, target / "files", symlinks=True)
        lines.append(f"{target / 'files'}: a copy of {folder}")
    else:
        lines.append(f"no folder of their own ({folder} does not exist)")
    logger.info("people: exported {} to {}", person, target)
    return lines


def people_forget(config: Config, person: str) -> list[str]:
    """Delete what nanobot holds of `person`: their sessions, index rows, messages, jobs
    and other rows (`PersonData.forget`), and their folder. Logged. Returns what it did.

    Raises:
        PersonError: the id is malformed. NanobotError: the store failed.
    """
    person = checked_id(person)
    folder = _folder(config, person)

    async def forget(db: Database) -> list[str]:
        data = PersonData(db)
        gone = await data.forget(person)
        await data.forget_taint(f"{PEOPLE_DIR}/{folder.name}")
        return [
            f"deleted {gone.sessions} private sessions, {gone.entries} entries (and their "
            f"search index rows), {gone.inbound} received and {gone.outbox} sent messages, "
            f"{gone.jobs} cron jobs"
        ]

    lines = _run(config, forget)
    if folder.is_symlink():
        folder.unlink()
        lines.append(f"removed the link {folder}")
    elif folder.is_dir():
        shutil.rmtree(folder)  # never follows a symlink inside
        lines.append(f"deleted {folder}")
    people = People(config.workspace_path, config.people.isolation or "shared")
    if not people.apart:
        lines.append(
            "people share one workspace here (people.isolation: shared): what they put into "
            "USER.md, memory/ or other files there is not theirs alone and was left as it is"
        )
    logger.warning("people: forgot {} (the store's rows and {})", person, folder)
    return lines
