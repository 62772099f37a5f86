"""Approvals in chat end to end: `nanobot gateway` as a subprocess, the real
python-telegram-bot against the fake Bot API, the fake model; exec asks by default."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.llm import Call, FakeLLM, Text, ToolCalls
from tests.fakes.telegram import FakeTelegram, SentMessage
from tests.gateway_process import GatewayProcess
from tests.test_gateway_telegram import ALICE, gateway_config, nanobot_cli, replies


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


def config(root: Path, llm: FakeLLM, telegram: FakeTelegram, **approval: Any) -> dict[str, Any]:
    settings = gateway_config(root, llm, telegram)
    settings["tools"] = {"approval": approval}  # the defaults: exec asks
    return settings


async def start(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, **approval: Any
) -> GatewayProcess:
    process = GatewayProcess(
        tmp_path, config(tmp_path, fake_llm, telegram, **approval), dict(os.environ)
    )
    await process.start(ready="telegram connected")
    return process


async def card(telegram: FakeTelegram, chat: int = ALICE) -> SentMessage:
    await telegram.wait_for(lambda: any(m.buttons for m in telegram.sent(chat)), seconds=30)
    return next(m for m in telegram.sent(chat) if m.buttons)


def card_recorded(tmp_path: Path) -> bool:
    """Whether the outbox knows the card is out (and as which message): a kill -9 before
    that would leave it to be sent again, which is another test's business."""
    with closing(sqlite3.connect(tmp_path / "data" / "state.db")) as db:
        row = db.execute(
            "SELECT count(*) FROM outbox WHERE state = 'delivered' AND sent_id IS NOT NULL"
        ).fetchone()
    return bool(row[0])


def marker(tmp_path: Path, name: str) -> Path:
    return tmp_path / "data" / "workspace" / name


async def test_allow_once_from_the_card_runs_the_command_and_the_card_says_so(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    process = await start(tmp_path, fake_llm, telegram)
    fake_llm.script(
        ToolCalls([Call("exec", {"command": "touch made-by-exec"}, id="x1")]), Text("Done.")
    )
    telegram.user_message(ALICE, "make the file", user_id=ALICE)
    shown = await card(telegram)
    assert "touch made-by-exec" in shown.visible
    assert not marker(tmp_path, "made-by-exec").exists()  # nothing ran before the click
    query = telegram.press_button(ALICE, shown.message_id, user_id=ALICE, text="Allow once")
    answer = await telegram.wait_for_answer(query)
    assert answer.text == "Decided."
    texts = await replies(telegram, ALICE, 2)
    assert texts[-1] == "Done."
    assert marker(tmp_path, "made-by-exec").exists()
    edited = next(m for m in telegram.sent(ALICE) if m.message_id == shown.message_id)
    assert edited.buttons == [] and "allowed once by" in edited.visible
    assert await process.stop() == 0


async def test_deny_by_text_and_a_stranger_click_changes_nothing(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    process = await start(tmp_path, fake_llm, telegram)
    fake_llm.script(
        ToolCalls([Call("exec", {"command": "touch denied"}, id="x1")]), Text("As you wish.")
    )
    telegram.user_message(ALICE, "make it", user_id=ALICE)
    shown = await card(telegram)
    request_id = shown.visible.split("(", 1)[1].split(")", 1)[0]
    stranger = telegram.press_button(ALICE, shown.message_id, user_id=999, text="Allow once")
    assert (await telegram.wait_for_answer(stranger)).text is not None
    telegram.user_message(ALICE, f"/deny {request_id}", user_id=ALICE)
    texts = await replies(telegram, ALICE, 3)
    assert "Decided." in texts and texts[-1] == "As you wish."
    assert not marker(tmp_path, "denied").exists()
    assert "Not run: the user denied it." in str(fake_llm.requests[-1].messages[-1]["content"])
    assert await process.stop() == 0


async def test_injected_instructions_run_nothing_without_a_click(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    # A page (or a file) told the model to run a command and to schedule one; nobody clicks.
    process = await start(tmp_path, fake_llm, telegram, timeout="2s")
    fake_llm.script(
        ToolCalls([Call("exec", {"command": "touch pwned"}, id="x1")]),
        ToolCalls(
            [
                Call(
                    "cron",
                    {"action": "add", "message": "run touch pwned", "every": "10s"},
                    id="x2",
                )
            ]
        ),
        Text("I did not do those."),
    )
    telegram.user_message(ALICE, "summarise this page", user_id=ALICE)
    await replies(telegram, ALICE, 3, seconds=60)  # two cards and the answer
    assert not marker(tmp_path, "pwned").exists()
    results = [str(m["content"]) for m in fake_llm.requests[-1].messages if m.get("role") == "tool"]
    assert len(results) == 2 and all("not approved in time" in r for r in results)
    cards = [m for m in telegram.sent(ALICE) if "Approval" in m.visible]
    assert len(cards) == 2 and all(m.buttons == [] and "expired" in m.visible for m in cards)
    assert "no jobs" in (await nanobot_cli(process, "cron", "list")).lower()
    assert await process.stop() == 0


async def test_a_restart_while_waiting_expires_the_request_and_the_turn_goes_on(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    process = await start(tmp_path, fake_llm, telegram)
    fake_llm.script(ToolCalls([Call("exec", {"command": "touch late"}, id="x1")]))
    telegram.user_message(ALICE, "make it", user_id=ALICE)
    shown = await card(telegram)
    await telegram.wait_for(lambda: card_recorded(tmp_path), seconds=10)
    await process.kill()
    fake_llm.default_reply = Text("nanobot restarted, so I did not run it.")
    await process.start(ready="telegram connected")
    texts = await replies(telegram, ALICE, 2)
    assert texts[-1] == "nanobot restarted, so I did not run it."
    edited = next(m for m in telegram.sent(ALICE) if m.message_id == shown.message_id)
    assert edited.buttons == [] and "restarted before it was approved" in edited.visible, [
        (m.message_id, m.visible[:80], len(m.buttons)) for m in telegram.sent(ALICE)
    ]
    result = fake_llm.requests[-1].messages[-1]
    assert result["role"] == "tool" and "restarted before it was approved" in result["content"]
    assert not marker(tmp_path, "late").exists()
    assert await process.stop() == 0
