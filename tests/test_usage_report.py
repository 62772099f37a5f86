"""What a person sees of the spend: `nanobot usage` (through `manage.usage_report`) against
the rows of the ledger, and `/usage` and `/budget` in a chat."""

from __future__ import annotations

import asyncio
import csv
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nanobot.agent._spend_commands import budget_command, usage_command
from nanobot.agent.budget import Caps
from nanobot.bus.events import ChatRef, InboundMessage
from nanobot.config import Config
from nanobot.errors import NanobotError
from nanobot.manage import usage_report
from nanobot.manage._usage import since_moment
from nanobot.store import Database, UsageLedger
from tests._clock import Clock
from tests.fakes.llm import FakeLLM, Text
from tests.test_budget import CALL, build

ROWS: list[dict[str, Any]] = [
    {"key": "t:ada", "model": "openai/a", "p": 100, "c": 10, "cost": 0.5, "who": "ada"},
    {"key": "t:ada", "model": "openai/b", "p": 50, "c": 5, "cost": 0.25, "who": "ada", "k": 40},
    {"key": "t:bob", "model": "openai/a", "p": 10, "c": 1, "cost": 0.0, "who": "bob", "u": 1},
    {"key": "cron:1", "model": "openai/a", "p": 7, "c": 3, "cost": 0.125, "src": "cron"},
]


def _fill(config: Config) -> None:
    async def fill() -> None:
        async with await Database.open(config.store_target) as db:
            ledger = UsageLedger(db)
            for n, row in enumerate(ROWS):
                await ledger.record(
                    row["key"],
                    f"r{n}",
                    model=row["model"],
                    prompt_tokens=row["p"],
                    completion_tokens=row["c"],
                    cost=row["cost"],
                    cached_tokens=row.get("k", 0),
                    priced=not row.get("u"),
                    person=row.get("who"),
                    source=row.get("src", "chat"),
                )

    asyncio.run(fill())


@pytest.fixture
def config(tmp_path: Path) -> Config:
    config = Config(data_dir=tmp_path / "data", timezone="Europe/Berlin")
    config.data_dir.mkdir()
    _fill(config)
    return config


def test_json_by_model_sums_the_rows(config: Config) -> None:
    [text] = usage_report(config, by="model", fmt="json")
    data = json.loads(text)
    rows = {row["model"]: row for row in data["rows"]}
    assert rows["openai/a"] == {
        "model": "openai/a",
        "turns": 3,
        "prompt_tokens": 117,
        "completion_tokens": 14,
        "cached_tokens": 0,
        "cost_usd": 0.625,  # bob's unpriced turn is no figure, not 0
        "unpriced_turns": 1,
    }
    assert rows["openai/b"]["cached_tokens"] == 40
    assert data["total"]["turns"] == 4
    assert data["total"]["cost_usd"] == 0.875


def test_csv_by_person_and_source(config: Config) -> None:
    rows = list(csv.reader(usage_report(config, by="person", fmt="csv")))
    assert rows[0] == ["person", "turns", "prompt", "completion", "cached", "cost_usd"]
    assert rows[1:] == [
        ["(none)", "1", "7", "3", "0", "0.1250"],
        ["ada", "2", "150", "15", "40", "0.7500"],
        ["bob", "1", "10", "1", "0", "price unknown"],
        ["total", "4", "167", "19", "40", "0.8750 + price unknown"],
    ]
    by_source = list(csv.reader(usage_report(config, by="source", fmt="csv")))
    assert [r[0] for r in by_source[1:]] == ["chat", "cron", "total"]


def test_table_by_day_in_the_configured_zone(config: Config) -> None:
    lines = usage_report(config, by="day")
    today = datetime.now(UTC).astimezone(config_zone(config)).date().isoformat()
    assert lines[1].split() == ["day", "turns", "prompt", "completion", "cached", "cost_usd"]
    assert lines[2].split()[:2] == [today, "4"]
    assert lines[-1].split()[0] == "total"
    assert usage_report(config, since="2000-01-01", by="chat", fmt="json")


def test_since_takes_a_duration_or_a_date_and_refuses_the_rest(config: Config) -> None:
    now = datetime(2026, 12, 4, 12, tzinfo=UTC)
    assert since_moment("7d", UTC, now) == now - timedelta(days=7)
    assert since_moment("2026-11-01", config_zone(config)).isoformat() == (
        "2026-11-01T00:00:00+01:00"
    )
    with pytest.raises(NanobotError, match="--since 'soon'"):
        since_moment("soon", UTC)
    [text] = usage_report(config, since="2999-01-01", by="model", fmt="json")
    assert json.loads(text)["rows"] == []


def config_zone(config: Config) -> Any:
    import zoneinfo

    return zoneinfo.ZoneInfo(config.timezone or "UTC")


def _chat(sender: str, text: str) -> InboundMessage:
    return InboundMessage.from_chat(ChatRef("cli", "c1"), sender, text, "m1")


async def test_usage_in_a_chat_shows_the_persons_spend_and_what_is_left(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    clock = Clock(datetime.now(UTC))
    rig = build(tmp_path, fake_llm, db, clock, person=Caps(daily=1.0))
    fake_llm.script(Text("ok", cost=CALL))
    await rig.say("hello")
    text = await usage_command(_chat("ada", "/usage"), rig.loop)
    assert "Model: openai/fake-model" in text
    assert "You, today: $0.2000 (1 turn," in text
    assert "The daily budget for you: $0.20 of $1.00 spent, $0.80 left" in text
    assert "Everyone" not in text
    assert "Everyone, today: $0.2000" in await usage_command(_chat("boss", "/usage"), rig.loop)


async def test_budget_raise_is_for_approvers_and_counts_at_once(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    clock = Clock(datetime.now(UTC))
    rig = build(tmp_path, fake_llm, db, clock, person=Caps(daily=0.1))
    refused = await rig.say("hello")
    assert refused.startswith("Over budget: the daily budget for you is $0.10")
    said = await budget_command(_chat("ada", "/budget raise 5 today ada"), rig.loop)
    assert said.startswith("Only an approver can raise a budget.")
    assert (await budget_command(_chat("boss", "/budget raise lots today"), rig.loop)).startswith(
        "Say /budget raise USD"
    )
    said = await budget_command(_chat("boss", "/budget raise 1 today ada"), rig.loop)
    assert said.startswith("Raised ada's budget by $1.00 for today")
    fake_llm.script(Text("ok", cost=CALL))
    assert await rig.say("hello again") == "ok"
    shown = await budget_command(_chat("ada", "/budget"), rig.loop)
    assert "The daily budget for you: $0.20 of $1.10 spent" in shown


def test_the_report_reads_a_postgresql_store(tmp_path: Path, postgres_url: str) -> None:
    config = Config(data_dir=tmp_path / "data", store={"url": postgres_url})
    config.data_dir.mkdir()
    _fill(config)
    [text] = usage_report(config, by="source", fmt="json")
    rows = {row["source"]: row["turns"] for row in json.loads(text)["rows"]}
    assert rows == {"chat": 3, "cron": 1}
    assert json.loads(text)["total"]["cost_usd"] == 0.875


async def test_usage_without_budgets_shows_the_spend_and_no_one_elses(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    from nanobot.agent._spend_commands import budget_command
    from tests.test_loop import make_parts

    parts = await make_parts(tmp_path, fake_llm, db)
    fake_llm.script(Text("hi"))
    from nanobot.agent.turn import TurnRequest

    await parts.loop.handle(TurnRequest("t:1", "hello", sender_id="ada"))
    text = await usage_command(_chat("ada", "/usage"), parts.loop)
    assert "You, today: price unknown (1 turn," in text  # the fake model has no price
    assert "Everyone" not in text and "budget" not in text
    assert await budget_command(_chat("ada", "/budget"), parts.loop) == (
        "No budgets are set (the `budget` section of the config)."
    )
