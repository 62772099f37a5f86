"""End to end: `nanobot gateway` as a subprocess, with Telegram and Discord in one process."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.discord import FakeDiscord
from tests.fakes.llm import Call, FakeLLM, Text, ToolCalls
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import GatewayProcess
from tests.test_gateway_telegram import (
    ALICE,
    check_answered_once,
    gateway_config,
    replies,
    turns,
    unanswered,
)

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

ADA = 424242
BEA = 434343


@pytest.fixture
async def discord() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as fake:
        yield fake


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=DEFAULT_TOKEN) as fake:
        yield fake


def config(
    root: Path, llm: FakeLLM, telegram: FakeTelegram, discord: FakeDiscord
) -> dict[str, Any]:
    settings = gateway_config(root, llm, telegram)
    settings["channels"]["discord"] = {
        "enabled": True,
        "token": "discord-bot-token-secret",
        "allow_from": [ADA],
        "api_base": discord.api_base,
        "gateway_url": discord.gateway_url,
    }
    return settings


@asynccontextmanager
async def running(
    root: Path, llm: FakeLLM, telegram: FakeTelegram, discord: FakeDiscord
) -> AsyncIterator[GatewayProcess]:
    """The gateway with both platforms, once Discord is connected; stopped (exit 0) after."""
    process = GatewayProcess(root, config(root, llm, telegram, discord), dict(os.environ))
    await process.start(ready="gateway started")
    try:
        await process.wait_log("discord connected", seconds=60)
        await discord.wait_for_ready()
        yield process
    finally:
        assert await process.stop(signal.SIGTERM) == 0


async def expect(discord: FakeDiscord, channel: int, texts: list[str]) -> None:
    """Wait until the bot's messages in `channel` (after edits) read exactly `texts`."""

    def arrived() -> bool:
        return [m.content for m in discord.sent(channel) if not m.deleted] == texts

    try:
        await discord.wait_until(arrived, 30, f"replies {texts!r}")
    except TimeoutError:
        actual = [m.content for m in discord.sent(channel)]
        raise AssertionError(f"expected {texts!r}, got {actual!r}") from None


async def test_both_platforms_in_one_gateway(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, discord: FakeDiscord
) -> None:
    guild = discord.add_guild("home")
    general = discord.add_channel(guild, "general")
    thread = discord.add_thread(general, "plans")
    discord.add_user("ada", user_id=ADA)
    dm = discord.dm_channel(ADA)
    async with running(tmp_path, fake_llm, telegram, discord) as process:
        await process.wait_log("telegram connected", seconds=60)
        fake_llm.default_reply = Text("Hello from nanobot.")
        discord.user_message(dm, "hi in a DM", user_id=ADA)
        await expect(discord, dm, ["Hello from nanobot."])
        telegram.user_message(ALICE, "hi on telegram", user_id=ALICE)
        assert await replies(telegram, ALICE, 1) == ["Hello from nanobot."]

        # In a server: only when mentioned; a thread is its own conversation.
        discord.user_message(general, "talking among ourselves", user_id=ADA)
        discord.user_message(general, "what do you think?", user_id=ADA, mentions_bot=True)
        await expect(discord, general, ["Hello from nanobot."])
        discord.user_message(thread, "and here?", user_id=ADA, mentions_bot=True)
        await expect(discord, thread, ["Hello from nanobot."])
        thread_request = fake_llm.requests[-1].messages
        assert [m["role"] for m in thread_request] == ["system", "user"]
        assert all("talking among ourselves" not in str(m["content"]) for m in thread_request)

        # Model output can never ping anyone.
        fake_llm.default_reply = Text("@everyone look, <@&123> too")
        discord.user_message(dm, "ping people", user_id=ADA)
        await expect(discord, dm, ["Hello from nanobot.", "@everyone look, <@&123> too"])
        last = discord.sent(dm)[-1]
        assert not last.mention_everyone
        assert last.mentions in ([], [ADA])  # at most the person replied to
        assert "discord-bot-token-secret" not in process.log()


async def test_a_discord_message_that_arrives_while_stopping_is_answered_after_the_restart(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, discord: FakeDiscord
) -> None:
    # Discord never delivers a message twice: the gateway keeps it in the journal.
    discord.add_user("ada", user_id=ADA)
    dm = discord.dm_channel(ADA)
    async with running(tmp_path, fake_llm, telegram, discord) as process:
        fake_llm.script(Text("Finished before leaving.", delay=2.0))
        discord.user_message(dm, "a long one", user_id=ADA)
        await fake_llm.wait_for_requests(1, seconds=30)
        assert process.process is not None
        process.process.send_signal(signal.SIGTERM)
        await process.wait_log("running turn(s)")  # intake is closed, the turn still runs
        discord.user_message(dm, "one more thing", user_id=ADA)
        await process.wait_log("arrived while stopping: kept")
        assert await process.stop(seconds=30) == 0
        await expect(discord, dm, ["Finished before leaving."])
        assert len(fake_llm.requests) == 1

        fake_llm.default_reply = Text("Answered after the restart.")
        await process.start(ready="gateway started")
        await expect(discord, dm, ["Finished before leaving.", "Answered after the restart."])
        assert "one more thing" in str(fake_llm.requests[-1].messages[-1]["content"])


async def test_an_approval_card_in_a_discord_dm_is_decided_with_a_click(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, discord: FakeDiscord
) -> None:
    discord.add_user("ada", user_id=ADA)
    dm = discord.dm_channel(ADA)
    settings = config(tmp_path, fake_llm, telegram, discord)
    settings["tools"] = {"approval": {}}  # the defaults: exec asks
    process = GatewayProcess(tmp_path, settings, dict(os.environ))
    await process.start(ready="gateway started")
    try:
        await process.wait_log("discord connected", seconds=60)
        await discord.wait_for_ready()
        fake_llm.script(
            ToolCalls([Call("exec", {"command": "touch clicked"}, id="x1")]), Text("Made it.")
        )
        discord.user_message(dm, "make the file", user_id=ADA)
        await discord.wait_until(
            lambda: any(m.buttons for m in discord.sent(dm)), 30, "an approval card"
        )
        card = next(m for m in discord.sent(dm) if m.buttons)
        assert "touch clicked" in card.content
        allow = next(b for b in card.buttons if b["label"] == "Allow once")
        click = discord.click(card.id, allow["custom_id"], user_id=ADA)
        await discord.wait_for_response(click)
        await discord.wait_until(
            lambda: any(m.content == "Made it." for m in discord.sent(dm)), 30, "the answer"
        )
        assert (tmp_path / "data" / "workspace" / "clicked").exists()
        edited = next(m for m in discord.sent(dm) if m.id == card.id)
        assert edited.buttons == [] and "allowed once by" in edited.content
        await discord.wait_until(lambda: bool(click.followups), 30, "the ephemeral answer")
    finally:
        assert await process.stop(signal.SIGTERM) == 0


async def test_discord_messages_sent_while_the_gateway_is_down_are_answered_once_after_start(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, discord: FakeDiscord
) -> None:
    # Discord does not deliver them again: the gateway fetches the DM's history on start.
    discord.add_user("ada", user_id=ADA)
    dm = discord.dm_channel(ADA)
    fake_llm.default_reply = Text("First answer.")
    async with running(tmp_path, fake_llm, telegram, discord):
        discord.user_message(dm, "before the stop", user_id=ADA)
        await expect(discord, dm, ["First answer."])
    assert not discord.sessions  # nobody is connected now

    discord.user_message(dm, "sent while down, one", user_id=ADA)
    discord.user_message(dm, "sent while down, two", user_id=ADA)
    requests = len(fake_llm.requests)
    fake_llm.default_reply = Text("Caught up.")
    async with running(tmp_path, fake_llm, telegram, discord) as process:
        await process.wait_log("2 message(s) after the last one taken", seconds=30)
        await discord.wait_until(
            lambda: [m.content for m in discord.sent(dm)][-1:] == ["Caught up."],
            30,
            "an answer to what was sent while down",
        )
        # Answered together or one by one, but each once; the first message not again.
        await asyncio.sleep(1.0)
        said = [str(m["content"]) for r in fake_llm.requests[requests:] for m in r.messages]
        users = [text for text in said if "sent while down" in text or "before the stop" in text]
        assert any("sent while down, one" in text for text in users)
        assert any("sent while down, two" in text for text in users)
        answers = [m.content for m in discord.sent(dm) if not m.deleted]
        assert answers[0] == "First answer." and answers.count("First answer.") == 1
        assert 1 <= answers.count("Caught up.") == len(fake_llm.requests) - requests <= 2

    # A restart with nothing new fetches nothing and answers nothing.
    async with running(tmp_path, fake_llm, telegram, discord) as process:
        await asyncio.sleep(1.0)
        assert "message(s) after the last one taken" not in process.log()
    assert len(fake_llm.requests) - requests == answers.count("Caught up.")


async def test_messages_sent_while_the_gateway_is_stopped_are_answered_once_after_start(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, discord: FakeDiscord
) -> None:
    # Discord delivers none of them again. Three come in a DM answered before the stop (read
    # after the last message taken there), one is an allowed user's first DM ever and one a
    # first mention in a server channel (read from when the gateway last had everything).
    discord.add_user("ada", user_id=ADA)
    discord.add_user("bea", user_id=BEA)
    general = discord.add_channel(discord.add_guild("home"), "general")
    ada, bea = discord.dm_channel(ADA), discord.dm_channel(BEA)
    settings = config(tmp_path, fake_llm, telegram, discord)
    settings["channels"]["discord"]["allow_from"] = [ADA, BEA]
    process = GatewayProcess(tmp_path, settings, dict(os.environ))
    await process.start(ready="discord: caught up")
    fake_llm.script(Text("Before the stop."))
    discord.user_message(ada, "before the stop", user_id=ADA)
    await expect(discord, ada, ["Before the stop."])
    assert await process.stop(signal.SIGTERM) == 0

    sent = {
        ada: ["down one", "down two", "down three"],
        bea: ["my first DM ever"],
        general: ["a first mention"],
    }
    for chat, texts in sent.items():
        for text in texts:
            author = BEA if chat == bea else ADA
            discord.user_message(chat, text, user_id=author, mentions_bot=chat == general)
    discord.user_message(general, "just chatting, not to the bot", user_id=BEA)
    before = len(fake_llm.requests)
    fake_llm.default_reply = Text("Caught up.")

    def shown() -> dict[int, list[str]]:
        return {chat: [m.content for m in discord.sent(chat) if not m.deleted] for chat in sent}

    def answered() -> str | None:
        return check_answered_once(fake_llm.requests[before:], sent, shown(), "Caught up.")

    await process.start(ready="discord: caught up")
    try:
        await discord.wait_until(lambda: answered() is None, 60, "every message answered")
    finally:
        assert await process.stop(signal.SIGTERM) == 0
    assert answered() is None, answered()  # nothing more came before the stop
    assert shown()[ada][0] == "Before the stop."
    assert not turns(fake_llm.requests[before:], ["before the stop", "just chatting"])
    assert unanswered(process.data_dir) == (0, 0)

    # A restart with nothing new answers nothing.
    requests, answers = len(fake_llm.requests), shown()
    await process.start(ready="discord: caught up")
    assert await process.stop(signal.SIGTERM) == 0
    assert (len(fake_llm.requests), shown()) == (requests, answers)


async def test_offline_at_start_is_one_warning_a_try_and_no_traceback(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, discord: FakeDiscord
) -> None:
    settings = config(tmp_path, fake_llm, telegram, discord)
    settings["channels"]["discord"]["api_base"] = "http://127.0.0.1:9/api/v10"  # nothing listens
    process = GatewayProcess(tmp_path, settings, dict(os.environ))
    await process.start(ready="discord cannot reach its platform")
    try:
        after = len(process.lines)
        await process.wait_log("discord cannot reach its platform", after=after, seconds=30)
        await process.wait_log("telegram connected")  # the other channel is not held up
        tries = [line for line in process.lines if "discord cannot reach its platform" in line]
        assert all(" | WARNING " in line and "trying again in " in line for line in tries)
        assert "Traceback" not in process.log()
        assert " | ERROR " not in process.log()
    finally:
        await process.stop(signal.SIGKILL)
