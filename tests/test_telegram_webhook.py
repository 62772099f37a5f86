"""Telegram webhook mode: the channel serving the webhook, against the fake Bot API posting
updates to it as Telegram does (retrying what was not answered with a 2xx); and its config."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from loguru import logger
from pydantic import SecretStr

from nanobot.bus.events import InboundMessage
from nanobot.channels.base import ChannelRefused, InboxPolicy, Intake
from nanobot.channels.telegram import TelegramChannel
from nanobot.config import TelegramConfig, TelegramWebhookConfig, load
from nanobot.errors import ConfigError, StoreError
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import webhook_port_in
from tests.test_channel_telegram import FAST, USER, Recorder, make_channel, running

PUBLIC = "https://bot.example.test/telegram"
SECRET = "webhook-Secret_0123456789"
OTHER = 43

pytestmark = pytest.mark.filterwarnings("ignore::telegram.warnings.PTBDeprecationWarning")


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(webhook_retry=0.05) as fake:
        yield fake


@pytest.fixture
def route(fake: FakeTelegram) -> Iterator[Callable[[], int]]:
    """The channels of a test listen on ports the system picks (`listen: 127.0.0.1:0`);
    `route()` sends PUBLIC's posts (the fake's "reverse proxy") to the one the last of them
    said it listens on, and returns it. Until then PUBLIC is routed nowhere: setWebhook only
    checks that its host resolves."""
    ports: list[int] = []

    def heard(message: Any) -> None:
        if (port := webhook_port_in(message.record["message"])) is not None:
            ports.append(port)

    sink = logger.add(heard, level="INFO", format="{message}")
    fake.route_webhook(PUBLIC, "http://127.0.0.1:9")

    def routed() -> int:
        assert ports, "no webhook said where it listens"
        fake.route_webhook(PUBLIC, f"http://127.0.0.1:{ports[-1]}")
        return ports[-1]

    yield routed
    logger.remove(sink)


@pytest.fixture
def intake() -> Recorder:
    return Recorder()


@pytest.fixture
def inbox(tmp_path: Path) -> InboxPolicy:
    return InboxPolicy(tmp_path / "inbox", max_bytes=1000)


def webhook_channel(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy, port: int = 0, **webhook: Any
) -> TelegramChannel:
    settings = {"url": PUBLIC, "listen": f"127.0.0.1:{port}", "secret_token": SECRET}
    config = TelegramConfig(
        enabled=True,
        token=SecretStr(DEFAULT_TOKEN),
        api_base=fake.base_url,
        webhook=TelegramWebhookConfig.model_validate(settings | webhook),
    )
    return TelegramChannel(config, intake, inbox, retry=FAST, typing_interval=0.1)


@pytest.fixture
async def channel(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy, route: Callable[[], int]
) -> AsyncIterator[TelegramChannel]:
    channel = webhook_channel(fake, intake, inbox)
    async with running(channel):
        route()
        yield channel


def forged(update_id: int = 1, text: str = "hello", chat: int = USER) -> dict[str, Any]:
    """An update as Telegram would post it, made up by the test (not in the fake's queue)."""
    user = {"id": chat, "is_bot": False, "first_name": "Ada"}
    message = {
        "message_id": update_id,
        "date": 1_700_000_000,
        "chat": {"id": chat, "type": "private", "first_name": "Ada"},
        "from": user,
        "text": text,
    }
    return {"update_id": update_id, "message": message}


async def test_start_sets_the_webhook_as_configured(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy, route: Callable[[], int]
) -> None:
    channel = webhook_channel(fake, intake, inbox, max_connections=5)
    async with running(channel):
        [call] = fake.calls("setWebhook")
        assert call.params["url"] == PUBLIC
        assert call.params["secret_token"] == SECRET
        assert call.params["max_connections"] == "5"  # form values, as PTB sends them
        assert json.loads(call.params["allowed_updates"]) == ["message", "callback_query"]
        assert call.params["drop_pending_updates"] == "false"
        assert fake.calls("deleteWebhook") == []
        assert fake.webhook is not None and fake.webhook.max_connections == 5


async def test_a_message_is_answered_200_only_once_intake_returned(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    release = asyncio.Event()

    async def journaled(message: InboundMessage) -> Intake:
        await release.wait()
        return Intake.ACCEPTED

    intake.decide = journaled
    update_id = fake.user_message(USER, "hello over the webhook", user_id=USER)
    [message] = await intake.wait(1)
    assert (message.text, message.sender_id) == ("hello over the webhook", str(USER))
    assert fake.deliveries == [] and len(fake.pending_updates) == 1  # no answer yet
    release.set()
    await fake.wait_for(lambda: not fake.pending_updates)
    assert [(d.update_id, d.status) for d in fake.deliveries] == [(update_id, 200)]
    assert len(intake.messages) == 1


async def test_a_wrong_or_missing_secret_is_refused_before_anything_is_read(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder, warnings: list[str]
) -> None:
    assert await fake.post_update(forged(), secret_token="not-the-secret") == 403
    assert await fake.post_update(forged(), use_secret=False) == 403
    assert await fake.post_update(b"not even json", secret_token="wrong") == 403
    assert intake.messages == []
    [warning] = warnings  # once for the source, the others at debug
    assert "refused a request from 127.0.0.1 with a wrong secret token" in warning
    assert SECRET not in warning
    # Telegram's own posts still go through.
    fake.user_message(USER, "still here", user_id=USER)
    assert [m.text for m in await intake.wait(1)] == ["still here"]


@pytest.mark.parametrize(
    ("body", "logged"),
    [
        (b"{not json", "a body that is not JSON"),
        (b"[1, 2]", "no update"),
        (b'{"update_id": "7"}', "no update"),
        (b'{"update_id": 7, "message": {"chat": 5}}', "refused update 7, which could not be read"),
    ],
)
async def test_a_malformed_body_gets_400_and_the_channel_goes_on(  # noqa: PLR0917
    channel: TelegramChannel,
    fake: FakeTelegram,
    intake: Recorder,
    warnings: list[str],
    body: bytes,
    logged: str,
) -> None:
    assert await fake.post_update(body) == 400
    assert any(logged in line for line in warnings), warnings
    assert intake.messages == []
    assert await fake.post_update(forged(text="after that")) == 200
    assert [m.text for m in intake.messages] == ["after that"]


async def test_a_store_failure_answers_503_and_the_redelivery_is_taken(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    outage = True
    outcomes: list[Intake] = []

    async def journal(message: InboundMessage) -> Intake:
        if outage:
            raise StoreError("disk full while writing state.db; the write was not saved")
        outcomes.append(Intake.ACCEPTED if not outcomes else Intake.DUPLICATE)
        return outcomes[-1]

    intake.decide = journal
    update_id = fake.user_message(USER, "kept by Telegram", user_id=USER)
    await fake.wait_for(lambda: len(fake.deliveries) >= 3)
    assert {(d.update_id, d.status) for d in fake.deliveries} == {(update_id, 503)}
    assert fake.pending_updates and fake.webhook is not None
    assert (
        fake.webhook.last_error_message
        == "Wrong response from the webhook: 503 Service Unavailable"
    )
    outage = False  # the disk has room again: the next attempt is taken
    await fake.wait_for(lambda: not fake.pending_updates)
    assert outcomes == [Intake.ACCEPTED]
    assert fake.deliveries[-1].status == 200
    assert {m.text for m in intake.messages} == {"kept by Telegram"}


async def test_an_update_left_while_stopping_answers_503(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    intake.result = Intake.CLOSED  # a stranger's message while the gateway stops
    assert await fake.post_update(forged()) == 503
    intake.result = Intake.DUPLICATE  # a redelivery of one taken before: acknowledged
    assert await fake.post_update(forged()) == 200


async def test_a_button_press_comes_through_the_webhook(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    fake.user_message(USER, "a message under which a button was", user_id=USER)
    await fake.wait_for(lambda: not fake.pending_updates)
    intake.result = Intake.REFUSED
    press_update = fake.user_callback(USER, 1, "approve:7", user_id=USER)
    query = next(q for q in fake.callback_queries if q.update_id == press_update)
    answer = await fake.wait_for_answer(query)
    assert answer.text == "Only an approver can decide this."
    press = intake.messages[-1]
    assert (press.text, press.press) == ("approve:7", query.id)
    await fake.wait_for(lambda: not fake.pending_updates)


async def test_a_held_chat_does_not_hold_another(
    channel: TelegramChannel, fake: FakeTelegram, intake: Recorder
) -> None:
    release = asyncio.Event()

    async def slow_for_user(message: InboundMessage) -> Intake:
        if message.chat.chat_id == str(USER):
            await release.wait()
        return Intake.ACCEPTED

    intake.decide = slow_for_user
    held = asyncio.create_task(fake.post_update(forged(1, "slow", USER)))
    await intake.wait(1)
    assert await fake.post_update(forged(2, "quick", OTHER)) == 200
    assert not held.done()
    release.set()
    assert await held == 200


async def test_a_url_telegram_refuses_stops_the_channel_with_one_line(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy, route: Callable[[], int]
) -> None:
    # No route: the host does not resolve for Telegram.
    channel = webhook_channel(fake, intake, inbox, url="https://nowhere.example.test/x")
    with pytest.raises(ChannelRefused) as refused:
        await channel.run(lambda: None)
    port = route()
    text = str(refused.value)
    assert text.startswith("Telegram refused the webhook https://nowhere.example.test/x (")
    assert "failed to resolve host" in text and "channels.telegram.webhook.url" in text
    with socket.socket() as again:  # the server was closed
        again.bind(("127.0.0.1", port))


async def test_an_address_in_use_stops_the_channel_with_one_line(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        channel = webhook_channel(fake, intake, inbox, port)
        with pytest.raises(ChannelRefused, match=rf"cannot listen on 127\.0\.0\.1:{port}"):
            await channel.run(lambda: None)
    assert fake.calls("setWebhook") == []


async def test_a_stop_keeps_the_webhook_and_polling_deletes_it(
    fake: FakeTelegram, intake: Recorder, inbox: InboxPolicy, route: Callable[[], int]
) -> None:
    async with running(webhook_channel(fake, intake, inbox)):
        route()
    # Other gateways of a cluster may still serve it; Telegram keeps what comes meanwhile.
    assert fake.webhook_url == PUBLIC and fake.calls("deleteWebhook") == []
    fake.user_message(USER, "sent while nobody served the webhook", user_id=USER)
    async with running(make_channel(fake, intake, inbox)):  # polling mode
        await fake.wait_for(lambda: fake.webhook_url == "")
        [message] = await intake.wait(1)
        assert len(fake.calls("deleteWebhook")) == 1
        assert message.text == "sent while nobody served the webhook"


# ---- config ------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    import os

    for name in list(os.environ):
        if name.startswith("NANOBOT_"):
            monkeypatch.delenv(name)
    yield monkeypatch


def load_webhook(tmp_path: Path, webhook: dict[str, Any]) -> TelegramWebhookConfig:
    path = tmp_path / "config.yaml"
    config = {"data_dir": str(tmp_path / "data"), "channels": {"telegram": {"webhook": webhook}}}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return load(path).channels.telegram.webhook


def test_no_url_means_polling(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    webhook = load_webhook(tmp_path, {})
    assert webhook.url is None and (webhook.host, webhook.port) == ("127.0.0.1", 8443)


def test_the_served_path_is_the_urls_unless_set(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    webhook = load_webhook(tmp_path, {"url": PUBLIC, "secret_token": SECRET})
    assert webhook.served_path == "/telegram"
    assert webhook.secret_token is not None and webhook.secret_token.get_secret_value() == SECRET
    bare = {"url": "https://bot.example.test", "secret_token": SECRET, "listen": "[::1]:9000"}
    webhook = load_webhook(tmp_path, bare)
    assert (webhook.served_path, webhook.host, webhook.port) == ("/", "::1", 9000)
    webhook = load_webhook(tmp_path, bare | {"path": "/hook"})
    assert webhook.served_path == "/hook"


def test_the_secret_may_come_from_the_environment(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("NANOBOT_CHANNELS__TELEGRAM__WEBHOOK__SECRET_TOKEN", SECRET)
    webhook = load_webhook(tmp_path, {"url": PUBLIC})
    assert webhook.secret_token is not None and webhook.secret_token.get_secret_value() == SECRET


@pytest.mark.parametrize(
    ("webhook", "expected"),
    [
        (
            {"url": "http://bot.example.test/telegram", "secret_token": SECRET},
            "channels.telegram.webhook.url: 'http://bot.example.test/telegram' is not an "
            "https:// URL: Telegram posts updates only over HTTPS",
        ),
        (
            {"url": "https://bot.example.test:9443/x", "secret_token": SECRET},
            "channels.telegram.webhook.url: Telegram posts only to ports 443, 80, 88 or 8443, "
            "not 9443",
        ),
        (
            {"url": PUBLIC},
            "channels.telegram.webhook: a webhook url needs secret_token too",
        ),
        (
            {"url": PUBLIC, "secret_token": "has spaces & more"},
            "channels.telegram.webhook.secret_token: must be 1 to 256 characters, each a "
            "letter A-Z or a-z, a digit, _ or -",
        ),
        (
            {"url": PUBLIC, "secret_token": "x" * 257},
            "channels.telegram.webhook.secret_token: must be 1 to 256 characters",
        ),
        (
            {"url": PUBLIC, "secret_token": SECRET, "listen": "8443"},
            "channels.telegram.webhook.listen: '8443' is not host:port, e.g. 127.0.0.1:8443",
        ),
        (
            {"url": PUBLIC, "secret_token": SECRET, "listen": "localhost:99999"},
            "channels.telegram.webhook.listen: 'localhost:99999' is not host:port",
        ),
        (
            {"url": PUBLIC, "secret_token": SECRET, "path": "telegram"},
            "channels.telegram.webhook.path: 'telegram' is not a URL path",
        ),
        (
            {"url": PUBLIC, "secret_token": SECRET, "max_connections": 101},
            "channels.telegram.webhook.max_connections: Input should be less than or equal to 100",
        ),
        (
            {"url": PUBLIC, "secret_token": SECRET, "secret": "typo"},
            "channels.telegram.webhook.secret: unknown key",
        ),
    ],
)
def test_bad_values_are_clear_config_errors(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, webhook: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as error:
        load_webhook(tmp_path, webhook)
    assert expected in str(error.value)
    assert "has spaces & more" not in str(error.value)  # a secret is never shown
