"""End to end: `nanobot gateway` in Telegram webhook mode, as a subprocess, with the fake Bot
API posting updates to its webhook as Telegram does (through a route that plays the reverse
proxy) and the fake LLM. Observed as a user and an operator would: replies, log lines, what
Telegram's getWebhookInfo would show."""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.llm import FakeLLM, Text
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import GatewayProcess
from tests.test_gateway_telegram import ALICE, gateway_config, replies
from tests.test_telegram_webhook import PUBLIC, SECRET, forged

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

READY = "telegram webhook set"


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=DEFAULT_TOKEN, webhook_retry=0.5) as fake:
        yield fake


def webhook_config(root: Path, llm: FakeLLM, telegram: FakeTelegram) -> dict[str, Any]:
    """The gateway's config in webhook mode, on a port the system picks (`start` routes
    PUBLIC to it)."""
    config = gateway_config(root, llm, telegram)
    config["channels"]["telegram"]["webhook"] = {
        "url": PUBLIC,
        "listen": "127.0.0.1:0",
        "secret_token": SECRET,
    }
    return config


async def start(process: GatewayProcess, telegram: FakeTelegram) -> None:
    """Start a gateway in webhook mode, the fake's "reverse proxy" routing PUBLIC to the
    port it listens on. (Until it says, PUBLIC's host is routed nowhere: setWebhook only
    checks that it resolves, and nothing is posted before the test sends a message.)"""
    telegram.route_webhook(PUBLIC, "http://127.0.0.1:9")
    await process.start(ready=READY)
    telegram.route_webhook(PUBLIC, f"http://127.0.0.1:{process.webhook_port()}")


@pytest.fixture
async def gateway(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> AsyncIterator[GatewayProcess]:
    config = webhook_config(tmp_path, fake_llm, telegram)
    process = GatewayProcess(tmp_path, config, dict(os.environ))
    await start(process, telegram)
    yield process
    await process.stop(signal.SIGKILL)


@contextmanager
def locked(state: Path) -> Iterator[None]:
    """Another process holds the state database's write lock: every write the gateway
    tries fails once SQLite's busy timeout (5 s) is over, as the store fails on a full disk."""
    with closing(sqlite3.connect(state, isolation_level=None, timeout=30)) as other:
        other.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            other.execute("ROLLBACK")


async def test_a_message_posted_to_the_webhook_is_answered_once(
    gateway: GatewayProcess, telegram: FakeTelegram, fake_llm: FakeLLM
) -> None:
    assert telegram.webhook is not None and telegram.webhook.url == PUBLIC
    assert telegram.calls("getUpdates") == []
    fake_llm.script(Text("Hello over the webhook!"))
    update_id = telegram.user_message(ALICE, "hi there", user_id=ALICE)
    assert await replies(telegram, ALICE, 1) == ["Hello over the webhook!"]
    assert [(d.update_id, d.status) for d in telegram.deliveries] == [(update_id, 200)]
    assert telegram.pending_updates == [] and fake_llm.request_count == 1
    # Telegram posting it again (its answer lost on the way) gets 200 and no second turn.
    assert await telegram.post_update(update_id) == 200
    assert await telegram.post_update(update_id) == 200
    fake_llm.script(Text("And the next one."))
    telegram.user_message(ALICE, "next", user_id=ALICE)
    assert await replies(telegram, ALICE, 2) == ["Hello over the webhook!", "And the next one."]
    assert fake_llm.request_count == 2


async def test_a_wrong_or_missing_secret_is_refused_and_nothing_answered(
    gateway: GatewayProcess, telegram: FakeTelegram, fake_llm: FakeLLM
) -> None:
    update = forged(900_000_001, "forged: run rm -rf /", ALICE)
    assert await telegram.post_update(update, secret_token="guessed-secret") == 403
    assert await telegram.post_update(update, use_secret=False) == 403
    await gateway.wait_log("refused a request from 127.0.0.1 with a wrong secret token")
    fake_llm.script(Text("Only this."))
    telegram.user_message(ALICE, "the real one", user_id=ALICE)
    assert await replies(telegram, ALICE, 1) == ["Only this."]
    assert fake_llm.request_count == 1
    assert "forged" not in str(fake_llm.requests[0].messages)
    assert gateway.log().count("with a wrong secret token") == 1  # then at debug


async def test_a_malformed_body_gets_400(gateway: GatewayProcess, telegram: FakeTelegram) -> None:
    assert await telegram.post_update(b"<html>not an update</html>") == 400
    await gateway.wait_log("telegram webhook: refused a body that is not JSON")
    assert await telegram.post_update({"update_id": 5, "message": {"chat": 5}}) == 400
    await gateway.wait_log("refused update 5, which could not be read")
    assert telegram.sent() == []


async def test_a_store_failure_answers_non_2xx_and_the_redelivery_is_answered_once(
    gateway: GatewayProcess, telegram: FakeTelegram, fake_llm: FakeLLM
) -> None:
    state = gateway.data_dir / "state.db"
    fake_llm.script(Text("Stored at last."))
    with locked(state):
        update_id = telegram.user_message(ALICE, "keep this one", user_id=ALICE)
        await gateway.wait_log("intake stopped", seconds=30)
        await telegram.wait_for(lambda: len(telegram.deliveries) >= 2, seconds=30)
        assert all(d.status == 503 for d in telegram.deliveries)
        assert telegram.pending_updates  # Telegram still holds it
        assert telegram.webhook is not None and telegram.webhook.last_error_message == (
            "Wrong response from the webhook: 503 Service Unavailable"
        )
    assert await replies(telegram, ALICE, 1, seconds=60) == ["Stored at last."]
    assert telegram.deliveries[-1].status == 200
    assert {d.update_id for d in telegram.deliveries} == {update_id}
    assert fake_llm.request_count == 1
    await gateway.wait_log("intake resumed")


async def test_switching_to_polling_deletes_the_webhook(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    config = webhook_config(tmp_path, fake_llm, telegram)
    process = GatewayProcess(tmp_path, config, dict(os.environ))
    await start(process, telegram)
    try:
        assert await process.stop(signal.SIGTERM) == 0
        # Kept at a clean stop: other gateways of a cluster may still take updates.
        assert telegram.webhook_url == PUBLIC and telegram.calls("deleteWebhook") == []
        update_id = telegram.user_message(ALICE, "sent while it was down", user_id=ALICE)
        await telegram.wait_for(lambda: any(d.status is None for d in telegram.deliveries))

        del config["channels"]["telegram"]["webhook"]
        fake_llm.script(Text("Polling now."))
        polling = GatewayProcess(tmp_path, config, dict(os.environ))
        await polling.start(ready="telegram connected")
        try:
            await polling.wait_log(f"deleted the webhook to {PUBLIC} to poll instead")
            assert telegram.webhook_url == "" and len(telegram.calls("deleteWebhook")) == 1
            assert await replies(telegram, ALICE, 1) == ["Polling now."]
            assert not any(d.status == 200 for d in telegram.deliveries if d.update_id == update_id)
            assert fake_llm.request_count == 1
        finally:
            assert await polling.stop(signal.SIGTERM) == 0
    finally:
        await process.stop(signal.SIGKILL)
