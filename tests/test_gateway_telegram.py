"""End to end: `nanobot gateway` as a subprocess, talking to the fake Telegram and fake LLM.

Everything is observed as a user would: messages in through the Bot API fake, replies out
of it, the process started, signalled and killed like a real deployment.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import stat
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.llm import Call, FakeLLM, Hang, RecordedRequest, Text, ToolCalls
from tests.fakes.telegram import DEFAULT_TOKEN, ApiError, FakeTelegram, Garbled, ServerError
from tests.fakes.telegram import Hang as FakeHang
from tests.gateway_process import GatewayProcess

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

ALICE = 1001
BOB = 1002
STRANGER = 6666
GROUP = -100500


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=DEFAULT_TOKEN) as fake:
        yield fake


def gateway_config(
    root: Path, llm: FakeLLM, telegram: FakeTelegram, **agent: Any
) -> dict[str, Any]:
    return {
        "data_dir": str(root / "data"),
        "agent": {
            "model": "openai/fake-model",
            "api_base": llm.base_url,
            "api_key": "sk-test-secret-key-123456",
            "max_retries": 0,
            **agent,
        },
        "channels": {
            "telegram": {
                "enabled": True,
                "token": DEFAULT_TOKEN,
                "allow_from": [ALICE, BOB],
                "api_base": telegram.base_url,
            }
        },
        "gateway": {"shutdown_timeout": 5},
        # Not about approvals (tests/test_gateway_approvals.py is): exec runs unasked here.
        "tools": {"approval": {"exec": "allow"}},
    }


@pytest.fixture
async def gateway(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> AsyncIterator[GatewayProcess]:
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    await process.start(ready="telegram connected")
    yield process
    await process.stop(signal.SIGKILL)


def snapshot(telegram: FakeTelegram, chat: int) -> list[tuple[int, str]]:
    return [(m.message_id, m.visible) for m in telegram.sent(chat)]


async def replies(telegram: FakeTelegram, chat: int, count: int, seconds: float = 30) -> list[str]:
    """The chat's messages once there are `count` and none is still being streamed."""
    await telegram.wait_for_sent(count, chat, seconds=seconds)
    while True:  # a streamed reply is edited until it is final; wait for it to settle
        before = snapshot(telegram, chat)

        def changed(before: list[tuple[int, str]] = before) -> bool:
            return snapshot(telegram, chat) != before

        try:
            await telegram.wait_for(changed, seconds=1.5)
        except TimeoutError:
            return [visible for _, visible in snapshot(telegram, chat)]


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_start_up_loads_the_model_before_taking_messages(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, event_loop: str
) -> None:
    # What the model needs (its route, on `auto`; litellm, where it goes through it: seconds
    # to import) is loaded before the first message, not lazily in the first turn, stalling
    # every chat. The heap start-up built is then left out of garbage collection.
    config = gateway_config(tmp_path, fake_llm, telegram, transport="auto") | {
        "log": {"level": "DEBUG"},
        "gateway": {"event_loop": event_loop},
    }
    process = GatewayProcess(tmp_path, config, dict(os.environ))
    await process.start(ready="telegram connected")
    try:
        lines = (f"event loop: {event_loop}", "calls go directly", "start-up heap frozen: ")
        loop, ready, frozen = [await process.wait_log(line, seconds=1) for line in lines]
        assert loop < ready < frozen < await process.wait_log("gateway started", seconds=1)
        assert "collected every 10000 objects" in process.lines[frozen]
        fake_llm.script(Text("ready"))
        telegram.user_message(ALICE, "hi", user_id=ALICE)
        assert await replies(telegram, ALICE, 1) == ["ready"]
    finally:
        await process.stop(signal.SIGKILL)


async def test_sigterm_lets_the_running_turn_finish(
    gateway: GatewayProcess, telegram: FakeTelegram, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("Finished before leaving.", delay=1.0))
    telegram.user_message(ALICE, "one more thing", user_id=ALICE)
    await fake_llm.wait_for_requests(1, seconds=30)
    assert await gateway.stop(signal.SIGTERM, seconds=20) == 0
    assert [m.visible for m in telegram.sent(ALICE)] == ["Finished before leaving."]
    assert "gateway stopped" in gateway.log()


async def test_a_token_revoked_while_running_is_reported_and_the_gateway_stops(
    gateway: GatewayProcess, telegram: FakeTelegram
) -> None:
    # The owner revoked the token in BotFather: every getUpdates now answers 401. Telegram
    # is the only channel and no terminal is attached: the gateway says so and stops itself.
    after = len(gateway.log().splitlines())
    telegram.fail_next("getUpdates", ApiError(401, "Unauthorized"), times=1000)
    # The poll held since "connected" ends with this message; the next one meets the 401.
    telegram.user_message(ALICE, "one more", user_id=ALICE)
    await gateway.wait_log("channels.telegram.token was rejected by Telegram", after=after)
    # Exit 2, a configuration error: systemd's unit and Docker's policy do not restart it.
    assert await gateway.stop(signal.SIGTERM, seconds=20) == 2
    assert "gateway stopped" in gateway.log()
    assert "the gateway stops with exit 2 (a configuration error" in gateway.log()


async def test_a_token_rejected_at_start_ends_the_gateway_as_a_configuration_error(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    telegram.fail_next("getMe", ApiError(401, "Unauthorized"), times=1000)
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    await process.start(ready="channels.telegram.token was rejected by Telegram")
    assert process.process is not None
    async with asyncio.timeout(30):  # it stops by itself: nothing is left running
        assert await process.process.wait() == 2
    assert "the gateway stops with exit 2 (a configuration error" in process.log()


@pytest.mark.parametrize("moment", ["model", "tool", "queued"])
async def test_kill_9_then_restart_answers_each_message_exactly_once(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, moment: str
) -> None:
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    await process.start(ready="telegram connected")
    if moment == "model":
        fake_llm.script(Hang())
    elif moment == "tool":
        fake_llm.script(ToolCalls([Call("exec", {"command": "sleep 30"}, id="long")]))
    else:
        fake_llm.script(Hang())
    telegram.user_message(ALICE, "first", user_id=ALICE)
    await fake_llm.wait_for_requests(1, seconds=30)
    if moment == "tool":
        await asyncio.sleep(0.5)  # let the tool start; if it has not, it is never run either
    if moment == "queued":
        telegram.user_message(BOB, "second, from Bob", user_id=BOB)
        await telegram.wait_for(lambda: not telegram.pending_updates, seconds=10)
    await process.kill()

    fake_llm.default_reply = Text("Answered after the restart.")
    await process.start(ready="telegram connected")
    expected = {ALICE: 1, BOB: 1 if moment == "queued" else 0}
    for chat, count in expected.items():
        if count:
            assert await replies(telegram, chat, count) == ["Answered after the restart."]
    await asyncio.sleep(1.5)
    for chat, count in expected.items():
        assert len(telegram.sent(chat)) == count, telegram.sent(chat)
    if moment == "tool":
        resumed = fake_llm.requests[-1].messages
        assert resumed[-1]["role"] == "tool"
        assert "may have run in part or in whole" in resumed[-1]["content"]
    assert await process.stop() == 0


async def test_a_restart_between_the_parts_of_a_long_reply_sends_only_the_rest(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    paragraphs = [f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 12 for i in range(40)]
    fake_llm.script(Text("\n\n".join(paragraphs)))  # four Telegram messages
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    await process.start(ready="telegram connected")
    telegram.user_message(ALICE, "write a lot", user_id=ALICE)
    await telegram.wait_for_sent(1, ALICE, seconds=30)
    telegram.fail_next("sendMessage", FakeHang())  # the second part never gets through
    await telegram.wait_for(lambda: len(telegram.calls("sendMessage")) >= 2, seconds=30)
    await process.kill()
    assert len(telegram.sent(ALICE)) == 1

    await process.start(ready="telegram connected")
    await telegram.wait_for(
        lambda: "Paragraph 39" in "".join(m.visible for m in telegram.sent(ALICE)), seconds=30
    )
    await asyncio.sleep(1)
    sent = [m.visible for m in telegram.sent(ALICE)]
    # The first part is not sent again: every paragraph is in exactly one message.
    assert [sum(f"Paragraph {i}:" in m for m in sent) for i in range(40)] == [1] * 40
    assert await process.stop() == 0


async def test_a_reply_cut_off_mid_stream_is_finished_in_its_message_after_a_restart(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    answer = " ".join(f"word{i}" for i in range(40))
    fake_llm.script(Text(answer), Text(answer))  # the first is cut off, the second finishes
    fake_llm.chunk_delay = 0.2  # eight seconds of streaming: the reply shows while written
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    await process.start(ready="telegram connected")
    telegram.user_message(ALICE, "tell me", user_id=ALICE)
    await telegram.wait_for_sent(1, ALICE, seconds=30)
    await telegram.wait_for(lambda: bool(telegram.calls("editMessageText")), seconds=30)
    await process.kill()  # an edit went out: the stream's message was recorded before it
    (partial,) = telegram.sent(ALICE)
    assert partial.visible != answer

    fake_llm.chunk_delay = 0.0
    await process.start(ready="telegram connected")
    await telegram.wait_for(
        lambda: any(m.visible == answer for m in telegram.sent(ALICE)), seconds=30
    )
    await asyncio.sleep(1)
    (final,) = telegram.sent(ALICE)  # the cut-off message now shows the whole reply
    assert (final.message_id, final.visible) == (partial.message_id, answer)
    assert await process.stop() == 0


async def nanobot_cli(gateway: GatewayProcess, *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nanobot",
        *args,
        env=gateway.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


async def test_a_cron_job_from_the_cli_is_delivered_exactly_once(
    gateway: GatewayProcess, telegram: FakeTelegram, fake_llm: FakeLLM
) -> None:
    added = await nanobot_cli(
        gateway,
        "cron",
        "add",
        "--name",
        "stretch",
        "--message",
        "remind me to stretch",
        "--every",
        "1h",
        "--channel",
        "telegram",
        "--to",
        str(ALICE),
    )
    job_id = added.split()[2].rstrip(";")
    # The model sends the reminder with the message tool and also answers with it.
    fake_llm.script(
        ToolCalls([Call("message", {"text": "Time to stretch!"})]), Text("Time to stretch!")
    )
    await nanobot_cli(gateway, "cron", "run", job_id)
    assert await replies(telegram, ALICE, 1) == ["Time to stretch!"]
    await asyncio.sleep(1.5)
    assert [m.visible for m in telegram.sent(ALICE)] == ["Time to stretch!"]
    listing = await nanobot_cli(gateway, "cron", "list")
    assert job_id in listing
    assert "ok" in listing.splitlines()[1]
    request = fake_llm.requests[0].messages
    assert request[-1]["content"].endswith("remind me to stretch")


async def test_kill_9_during_a_cron_turn_resumes_it_and_records_the_run_after_the_restart(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    await process.start(ready="telegram connected")
    added = await nanobot_cli(
        process,
        "cron",
        "add",
        "--name",
        "backup",
        "--message",
        "run the backup",
        "--every",
        "1h",
        "--channel",
        "telegram",
        "--to",
        str(ALICE),
    )
    job_id = added.split()[2].rstrip(";")
    fake_llm.script(ToolCalls([Call("exec", {"command": "sleep 30"}, id="long")]))
    await nanobot_cli(process, "cron", "run", job_id)
    await fake_llm.wait_for_requests(1, seconds=30)
    await asyncio.sleep(0.5)  # let the tool start; if it has not, it is never run either
    await process.kill()

    fake_llm.default_reply = Text("The backup was cut short; shall I retry?")
    await process.start(ready="telegram connected")
    assert await replies(telegram, ALICE, 1) == ["The backup was cut short; shall I retry?"]
    await asyncio.sleep(1.5)
    assert len(telegram.sent(ALICE)) == 1
    resumed = fake_llm.requests[-1].messages
    assert resumed[-1]["role"] == "tool"  # the cut-off call is settled, not run again
    assert "may have run in part or in whole" in resumed[-1]["content"]
    listing = await nanobot_cli(process, "cron", "list")
    assert "ok" in listing.splitlines()[1], listing
    assert await process.stop() == 0


WHILE_DOWN = {ALICE: ["down one", "down two", "down three"], BOB: ["down, from Bob"]}
"""Sent while the gateway is down: three messages in one chat, one in another."""


def turns(requests: Sequence[RecordedRequest], texts: Iterable[str]) -> list[list[str]]:
    """Per model request, which of `texts` it answers: those in its trailing user messages
    (after the last assistant message or tool result)."""
    answering: list[list[str]] = []
    for request in requests:
        tail: list[str] = []
        for entry in reversed(request.messages):
            if entry["role"] != "user":
                break
            tail.append(str(entry["content"]))
        answering.append([text for text in texts if any(text in content for content in tail)])
    return [answered for answered in answering if answered]


def check_answered_once(
    requests: Sequence[RecordedRequest],
    sent: dict[int, list[str]],
    replies: dict[int, list[str]],
    answer: str,
) -> str | None:
    """What is wrong (None: nothing) with the answers to the messages `sent` to each chat:
    each message is answered in exactly one turn, and each turn by one reply `answer` in
    its chat, so a turn that answers several has one reply for all of them."""
    for chat, texts in sent.items():
        answering = turns(requests, texts)
        answered = sorted(text for turn in answering for text in turn)
        if answered != sorted(texts):
            return f"chat {chat}: {texts} answered in turns {answering}"
        if replies[chat].count(answer) != len(answering):
            return f"chat {chat}: {len(answering)} turn(s), replies {replies[chat]}"
    return None


def unanswered(data_dir: Path) -> tuple[int, int]:
    """Messages journaled but not answered, and replies not delivered, in the state database."""
    with closing(sqlite3.connect(data_dir / "state.db")) as db:
        inbound = db.execute("SELECT count(*) FROM inbound WHERE state = 'pending'").fetchone()
        outbox = db.execute("SELECT count(*) FROM outbox WHERE state = 'pending'").fetchone()
    return int(inbound[0]), int(outbox[0])


async def test_messages_sent_while_the_gateway_is_stopped_are_answered_once_after_start(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    await process.start(ready="telegram connected")
    fake_llm.script(Text("Before the stop."))
    telegram.user_message(ALICE, "before the stop", user_id=ALICE)
    assert await replies(telegram, ALICE, 1) == ["Before the stop."]
    assert await process.stop(signal.SIGTERM) == 0

    for chat, texts in WHILE_DOWN.items():  # Telegram keeps them until they are fetched
        for text in texts:
            telegram.user_message(chat, text, user_id=chat)
    before = len(fake_llm.requests)
    fake_llm.default_reply = Text("Caught up.")
    await process.start(ready="telegram connected")

    def shown() -> dict[int, list[str]]:
        return {chat: [m.visible for m in telegram.sent(chat)] for chat in WHILE_DOWN}

    def answered() -> str | None:
        requests = fake_llm.requests[before:]
        return check_answered_once(requests, WHILE_DOWN, shown(), "Caught up.")

    try:
        await telegram.wait_for(lambda: answered() is None, seconds=60)
    finally:
        assert await process.stop(signal.SIGTERM) == 0
    assert answered() is None, answered()  # nothing more came before the stop
    assert shown()[ALICE][0] == "Before the stop."
    assert not turns(fake_llm.requests[before:], ["before the stop"])  # not again
    assert unanswered(process.data_dir) == (0, 0)


async def test_a_config_others_may_read_is_warned_about_at_every_start_and_left_as_it_is(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    config = process.config_path
    said = (
        f"{config} holds secrets (agent.api_key, channels.telegram.token) and can be read by "
        f"its group and anyone (mode 0644): run `chmod 600 {config}`"
    )
    await process.start(ready="telegram connected")
    try:
        assert not any("holds secrets" in line for line in process.lines)  # 0600: nothing
        await process.stop()
        config.chmod(0o644)
        for _ in range(2):
            await process.start(ready="telegram connected")
            assert [line for line in process.lines if "holds secrets" in line] == [
                line for line in process.lines if said in line
            ]
            assert len([line for line in process.lines if said in line]) == 1
            assert await process.stop() == 0
        assert stat.S_IMODE(config.stat().st_mode) == 0o644  # the user's file, not ours
    finally:
        await process.stop(signal.SIGKILL)


async def test_a_bot_api_server_failing_the_webhook_check_is_polled_all_the_same(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    telegram.fail_next("getWebhookInfo", ServerError(500), times=None)  # an emulator's gap
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    await process.start(ready="telegram connected")
    try:
        assert "could not check for a webhook set on the bot (getWebhookInfo: " in process.log()
        fake_llm.default_reply = Text("Polled anyway.")
        telegram.user_message(ALICE, "hello", user_id=ALICE)
        await telegram.wait_for(lambda: len(telegram.sent(ALICE)) == 1, seconds=30)
        assert "crashed" not in process.log()
    finally:
        await process.stop(signal.SIGKILL)


async def test_a_get_me_answer_the_library_cannot_read_names_the_method_and_the_answer(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    unreadable = {"id": 42, "is_bot": True, "username": "emulated_bot"}  # no first_name
    telegram.fail_next("getMe", Garbled(result=unreadable), times=None)
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    await process.start(ready="telegram crashed")
    try:
        [line] = [line for line in process.lines if "telegram crashed" in line]
        assert "answered getMe with what python-telegram-bot cannot read (TypeError: " in line
        assert '{"id": 42, "is_bot": true, "username": "emulated_bot"}' in line
        assert "telegram connected" not in process.log()
    finally:
        await process.stop(signal.SIGKILL)
