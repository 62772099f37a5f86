"""The cron tool's choice of the chat a job delivers to (its scoping and schedules are tested
with the cron service, in test_cron_service)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nanobot.agent.dispatcher import private_user
from nanobot.bus.events import ChatRef
from nanobot.cron.jobs import Jobs
from nanobot.cron.service import job_event
from nanobot.store import Database
from nanobot.store.cron import CronStore
from nanobot.tools.base import ToolContext, current_context
from nanobot.tools.cron import CronTool
from nanobot.tools.registry import ToolRegistry


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


@pytest.mark.parametrize(
    ("context", "to", "user"),
    [
        # Telegram: a private chat has its user's id, and is named for the user all the same.
        (ToolContext("telegram", "1", "telegram:1", "r", "1", private=True), "@1", "1"),
        # Discord: a DM's channel id is not its user's; named for the user, it says whose.
        (ToolContext("discord", "5550001", "discord:5550001", "r", "1", private=True), "@1", "1"),
        # A group is nobody's: its own id, and no user decides for it.
        (ToolContext("telegram", "-100", "telegram:-100", "r", "1", private=False), "-100", None),
        (
            ToolContext("discord", "7770001", "discord:7770001", "r", "1", private=False),
            "7770001",
            None,
        ),
    ],
)
async def test_a_job_made_in_a_private_chat_delivers_to_it_named_for_its_user(
    db: Database, context: ToolContext, to: str, user: str | None
) -> None:
    jobs = Jobs(CronStore(db), "UTC")
    registry = ToolRegistry([CronTool(jobs, deliverable=["telegram", "discord"])])
    token = current_context.set(context)
    try:
        added = await registry.execute("cron", {"action": "add", "message": "m", "every": "1h"})
    finally:
        current_context.reset(token)
    assert added.content.startswith("Scheduled job"), added.content
    (job,) = await jobs.all()
    assert (job.channel, job.to, job.owner) == (context.channel, to, context.session_key)
    # Its runs' events deliver there, and the chat tells who approves their calls.
    event = job_event(job, 1)
    assert event.chat == ChatRef(context.channel, to)
    assert private_user(event.chat) == user


def test_only_a_chat_named_for_a_numeric_user_id_is_someones_private_chat() -> None:
    assert private_user(ChatRef.direct("telegram", "42")) == "42"
    assert private_user(ChatRef.direct("discord", "123456789012345678")) == "123456789012345678"
    assert private_user(ChatRef("telegram", "42")) is None  # a chat id alone does not tell
    assert private_user(ChatRef("telegram", "@news_channel")) is None  # a public chat's name
    assert private_user(None) is None
