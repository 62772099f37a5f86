"""People kept apart, as the parts build them: the isolation in force, the links, and whom
each turn runs as (`agent.persons`)."""

from __future__ import annotations

from datetime import tzinfo
from pathlib import Path

from loguru import logger

from nanobot.agent.context import ContextBuilder
from nanobot.agent.memory import Memory
from nanobot.agent.persons import Persons
from nanobot.agent.prompt_budget import PromptBudget
from nanobot.config import Config
from nanobot.people import People, shared_mode
from nanobot.store import Database
from nanobot.store.people import PeopleStore


async def open_people(config: Config, db: Database) -> People:
    """Who is who for this run: `people.isolation` (or, without the key, what the store
    says: see `shared_mode`, said once in the log), `people.owner`, and the links.

    Raises:
        StoreError: the store could not be read.
    """
    configured = config.people.isolation
    has_sessions = False
    if configured is None:
        has_sessions = await db.fetchone("SELECT 1 FROM sessions LIMIT 1") is not None
    isolation = shared_mode(configured, has_sessions=has_sessions)
    if configured is None and isolation == "shared":
        logger.warning(
            "people.isolation is not set and this store holds conversations from before: "
            "everyone allowed shares one workspace, USER.md and memory, as before. Set "
            "people.isolation: person to give each person their own (see the README, "
            "'People kept apart'); set it to shared to keep this and silence this line"
        )
    links = await PeopleStore(db).links()
    people = People(config.workspace_path, isolation, config.people.owner, links)
    if people.apart:
        logger.info(
            "people are kept apart: each person has a folder under {}/people", people.workspace
        )
    return people


async def open_persons(
    config: Config,
    db: Database,
    shared: ContextBuilder,
    budget: PromptBudget,
    zone: tzinfo | None,
) -> Persons:
    """Whom each turn runs as (`open_people`), each person's prompt built from their
    folder (days in `zone`).

    Raises:
        StoreError: the store could not be read.
    """
    people = await open_people(config, db)

    def context(root: Path) -> ContextBuilder:
        memory = Memory(root, zone, budget=budget)
        return ContextBuilder(
            people.workspace, skills=shared.skills, memory=memory, budget=budget, personal=root
        )

    return Persons(people, PeopleStore(db), shared, context)
