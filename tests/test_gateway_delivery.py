"""End to end: replies Telegram refuses for good, as a user (and the owner) would meet them.

`nanobot gateway` as a subprocess against the fake Telegram and the fake model: a refusal is
given up at once and said once in the log, the reply is marked failed in the state database
(never tried again, not even after a restart), and a chat that blocked the bot is written to
again only once it writes. A cron run is recorded delivered only once the chat has its
answer, and not delivered, with the reason, when the platform refuses it.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path

import pytest

from tests.fakes.llm import FakeLLM, Text
from tests.fakes.telegram import DEFAULT_TOKEN, ApiError, FakeTelegram, Refusal200, ServerError
from tests.fakes.telegram import Hang as FakeHang
from tests.gateway_process import GatewayProcess
from tests.test_gateway_approvals import until
from tests.test_gateway_telegram import ALICE, BOB, gateway_config, nanobot_cli, replies

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

BLOCKED = "Forbidden: bot was blocked by the user"


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=DEFAULT_TOKEN) as fake:
        yield fake


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


def outbox(process: GatewayProcess) -> list[tuple[str, str | None]]:
    """Every outbox row's state and last error, oldest first."""
    with closing(sqlite3.connect(process.data_dir / "state.db")) as db:
        rows = db.execute("SELECT state, last_error FROM outbox ORDER BY id").fetchall()
    return [(str(state), error) for state, error in rows]


async def test_a_blocked_bot_gives_up_once_and_answers_again_when_the_chat_writes(
    gateway: GatewayProcess, telegram: FakeTelegram, fake_llm: FakeLLM
) -> None:
    fake_llm.default_reply = Text("An answer.")
    telegram.fail_next("*", ApiError(403, BLOCKED), times=None, chat_id=ALICE)
    telegram.user_message(ALICE, "hello", user_id=ALICE)
    await gateway.wait_log("takes no messages from the bot")
    telegram.user_message(BOB, "hello", user_id=BOB)
    assert await replies(telegram, BOB, 1) == ["An answer."]
    assert len(telegram.calls("sendMessage")) == 2  # one try for Alice's reply, at once
    assert outbox(gateway)[0] == ("failed", f"sendMessage: {BLOCKED}")
    assert sum(BLOCKED in line for line in gateway.lines) == 1

    telegram.clear_faults(ALICE)  # unblocked: Alice writes again, and is answered
    telegram.user_message(ALICE, "are you there?", user_id=ALICE)
    assert await replies(telegram, ALICE, 1) == ["An answer."]


async def test_a_reply_refused_after_a_restart_is_given_up_and_holds_back_nothing(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    await process.start(ready="telegram connected")
    fake_llm.default_reply = Text("An answer.")
    telegram.fail_next("sendMessage", FakeHang())  # in flight when the gateway dies
    telegram.user_message(ALICE, "hello", user_id=ALICE)
    await telegram.wait_for(lambda: len(telegram.calls("sendMessage")) == 1, seconds=30)
    await process.kill()
    assert outbox(process) == [("pending", None)]

    # Telegram now refuses that reply for good (as "message text is empty"): after the
    # restart it is tried once, marked failed, and Alice's next reply goes out behind it.
    refusal = "Bad Request: message text is empty"
    telegram.fail_next("sendMessage", ApiError(400, refusal), chat_id=ALICE)
    await process.start(ready="telegram connected")
    try:
        await process.wait_log("refused a reply to chat")
        telegram.user_message(ALICE, "hello again", user_id=ALICE)
        assert await replies(telegram, ALICE, 1) == ["An answer."]
        assert len(telegram.calls("sendMessage")) == 3  # the lost try, the refused, the new
        assert outbox(process)[0][0] == "failed" and "Message text is empty" in str(
            outbox(process)[0][1]
        )
        await process.kill()
        await process.start(ready="telegram connected")  # a failed reply is owed no more
        assert await process.stop() == 0
        assert len(telegram.calls("sendMessage")) == 3
    finally:
        await process.stop(signal.SIGKILL)


def attempts(process: GatewayProcess) -> list[int]:
    """Every outbox row's count of failed delivery attempts, oldest first."""
    with closing(sqlite3.connect(process.data_dir / "state.db")) as db:
        return [int(n) for (n,) in db.execute("SELECT attempts FROM outbox ORDER BY id")]


async def test_a_200_that_says_ok_false_is_retried_and_the_replies_keep_their_order(
    gateway: GatewayProcess, telegram: FakeTelegram, fake_llm: FakeLLM
) -> None:
    # Telegram (or a proxy before it) answers HTTP 200 {"ok": false}: once a KeyError left
    # the reply pending, with 0 attempts, until a restart sent it after later replies.
    fake_llm.script(Text("The first answer."), Text("The second answer."))
    telegram.fail_next("sendMessage", Refusal200({"ok": False}), times=None, chat_id=ALICE)
    telegram.user_message(ALICE, "one", user_id=ALICE)
    await until(lambda: attempts(gateway)[:1] == [1])
    assert outbox(gateway)[0][0] == "pending" and "Bad Gateway" in str(outbox(gateway)[0][1])
    telegram.user_message(ALICE, "two", user_id=ALICE)
    await until(lambda: len(attempts(gateway)) == 2)  # the second answer waits behind
    telegram.clear_faults(ALICE)
    assert await replies(telegram, ALICE, 2) == ["The first answer.", "The second answer."]
    await until(lambda: [state for state, _ in outbox(gateway)] == ["delivered"] * 2)


def cron_runs(process: GatewayProcess) -> list[tuple[str, str | None, str | None]]:
    """Every cron run's status, its answer's delivery and why it was not delivered, oldest
    first."""
    with closing(sqlite3.connect(process.data_dir / "state.db")) as db:
        rows = db.execute(
            "SELECT status, delivery, delivery_error FROM cron_runs ORDER BY id"
        ).fetchall()
    return [(str(status), delivery, error) for status, delivery, error in rows]


async def add_job(process: GatewayProcess, chat: int) -> str:
    added = await nanobot_cli(
        process, "cron", "add", "--name", "stretch", "--message", "remind me to stretch",
        "--every", "1h", "--channel", "telegram", "--to", str(chat),
    )  # fmt: skip
    return added.split()[2].rstrip(";")


async def test_a_cron_run_is_delivered_once_the_chat_has_its_answer_and_not_before(
    gateway: GatewayProcess, telegram: FakeTelegram, fake_llm: FakeLLM
) -> None:
    job_id = await add_job(gateway, ALICE)
    fake_llm.default_reply = Text("Time to stretch!")
    # Telegram's servers fail for Alice's chat: the answer waits in the outbox.
    telegram.fail_next("sendMessage", ServerError(502), times=None, chat_id=ALICE)
    await nanobot_cli(gateway, "cron", "run", job_id)
    await gateway.wait_log(f"cron job {job_id} finished: ok")
    assert telegram.sent(ALICE) == []
    assert cron_runs(gateway) == [("ok", "pending", None)]
    listing = await nanobot_cli(gateway, "cron", "list")
    assert "ok, delivery pending" in listing.splitlines()[1]
    shown = await nanobot_cli(gateway, "cron", "runs", job_id)
    assert shown.splitlines()[0].split() == ["RUN", "DUE", "STARTED", "STATUS", "ANSWER", "DETAIL"]
    assert shown.splitlines()[1].split()[-3:] == ["ok", "delivery", "pending"]

    telegram.clear_faults(ALICE)  # the next try goes through
    assert await replies(telegram, ALICE, 1) == ["Time to stretch!"]
    await until(lambda: cron_runs(gateway) == [("ok", "delivered", None)])
    assert "ok, delivered" in (await nanobot_cli(gateway, "cron", "list")).splitlines()[1]
    shown = await nanobot_cli(gateway, "cron", "runs", job_id)
    assert shown.splitlines()[1].split()[-2:] == ["ok", "delivered"]


async def test_a_cron_answer_pending_at_a_restart_is_settled_when_the_chat_refuses_it(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    await process.start(ready="telegram connected")
    try:
        job_id = await add_job(process, ALICE)
        fake_llm.default_reply = Text("Time to stretch!")
        telegram.fail_next("sendMessage", ServerError(502), times=None, chat_id=ALICE)
        await nanobot_cli(process, "cron", "run", job_id)
        await process.wait_log(f"cron job {job_id} finished: ok")
        await process.kill()
        assert cron_runs(process) == [("ok", "pending", None)]  # still owed after the crash

        # Meanwhile the chat is gone: after the restart the owed answer is refused for good.
        telegram.clear_faults(ALICE)
        telegram.fail_next("*", ApiError(400, "Bad Request: chat not found"), chat_id=ALICE)
        await process.start(ready="telegram connected")
        await process.wait_log("takes no messages from the bot")
        await until(lambda: cron_runs(process)[0][1] == "failed")
        ((status, delivery, reason),) = cron_runs(process)
        assert (status, delivery) == ("ok", "failed") and reason == "sendMessage: Chat not found"
        listing = await nanobot_cli(process, "cron", "list")
        assert "ok, not delivered" in listing.splitlines()[1]
        shown = (await nanobot_cli(process, "cron", "runs", job_id)).splitlines()
        assert "not delivered" in shown[1] and "Chat not found" in shown[1]

        # The next run's answer is not even tried there, and says so.
        tried = len(telegram.calls("sendMessage"))
        await nanobot_cli(process, "cron", "run", job_id)
        await until(lambda: len(cron_runs(process)) == 2 and cron_runs(process)[1][1] == "failed")
        (_, (status, _, reason)) = cron_runs(process)
        assert status == "ok" and str(reason).startswith("not sent: the chat is closed")
        assert telegram.sent(ALICE) == [] and len(telegram.calls("sendMessage")) == tried
    finally:
        await process.stop(signal.SIGKILL)
