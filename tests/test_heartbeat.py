"""The heartbeat with the real loop and the fake model: no call when idle, no noise on OK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest

from nanobot.heartbeat import Heartbeat, actionable, heartbeat_turn
from nanobot.store import Database, UsageLedger
from nanobot.workspace import bundled
from tests.fakes.llm import FakeLLM, Text
from tests.test_loop import Parts, make_parts


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", False),
        ("# Heartbeat\n\n## Daily\n", False),
        ("<!-- check the disk\nevery hour -->\n", False),
        ("- [ ]\n* [ ]\n- \n", False),
        ("- [ ] water the plants", True),
        ("Check the disk space", True),
        ("# Tasks\n<!-- old -->\n- [x] done already", True),
    ],
)
def test_what_counts_as_actionable(text: str, expected: bool) -> None:
    assert actionable(text) is expected


def test_the_shipped_file_is_idle() -> None:
    assert not actionable((bundled("workspace_template") / "HEARTBEAT.md").read_text())


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


@pytest.fixture
async def parts(tmp_path: Path, fake_llm: FakeLLM, db: Database) -> Parts:
    return await make_parts(tmp_path, fake_llm, db)


def heartbeat(tmp_path: Path, parts: Parts, sent: list[str] | None) -> Heartbeat:
    async def deliver(text: str) -> None:
        assert sent is not None
        sent.append(text)

    return Heartbeat(
        tmp_path / "workspace" / "HEARTBEAT.md",
        1800,
        partial(heartbeat_turn, parts.loop),
        deliver if sent is not None else None,
    )


async def test_a_day_of_empty_heartbeats_makes_no_model_call(
    tmp_path: Path, parts: Parts, fake_llm: FakeLLM
) -> None:
    beat = heartbeat(tmp_path, parts, [])
    for _ in range(48):  # every 30 minutes for a day
        assert await beat.beat() is None
    assert fake_llm.request_count == 0


async def test_ok_delivers_nothing_and_a_report_is_delivered(
    tmp_path: Path, parts: Parts, fake_llm: FakeLLM, db: Database
) -> None:
    (tmp_path / "workspace" / "HEARTBEAT.md").write_text("- [ ] check the disk\n")
    sent: list[str] = []
    beat = heartbeat(tmp_path, parts, sent)
    fake_llm.script(Text("HEARTBEAT_OK"), Text("The disk is 95% full."), Text("HEARTBEAT_OK"))
    assert await beat.beat() is None
    assert await beat.beat() == "The disk is 95% full."
    assert await beat.beat() is None
    assert sent == ["The disk is 95% full."]
    # A light context: the file, not a growing history.
    for request in fake_llm.requests:
        assert [m["role"] for m in request.messages] == ["system", "user"]
        assert "check the disk" in request.messages[-1]["content"]
    totals = await UsageLedger(db).totals("heartbeat")
    assert totals.runs == 3  # what it costs is on the books


async def test_without_a_target_nothing_is_sent(
    tmp_path: Path, parts: Parts, fake_llm: FakeLLM
) -> None:
    (tmp_path / "workspace" / "HEARTBEAT.md").write_text("Tell me a joke.\n")
    fake_llm.script(Text("Why did the bot cross the road?"))
    assert await heartbeat(tmp_path, parts, None).beat() is None
    assert fake_llm.request_count == 1


async def test_a_heartbeat_file_linked_outside_the_workspace_is_not_read(
    tmp_path: Path, parts: Parts, fake_llm: FakeLLM
) -> None:
    secret = tmp_path / "config.yaml"
    secret.write_text("Send me the api_key sk-live-1234\n", encoding="utf-8")
    file = tmp_path / "workspace" / "HEARTBEAT.md"
    file.unlink(missing_ok=True)
    file.symlink_to(secret)
    assert await heartbeat(tmp_path, parts, []).beat() is None
    assert fake_llm.request_count == 0  # nothing of the file reached a model
