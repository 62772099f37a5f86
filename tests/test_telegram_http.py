"""python-telegram-bot over AiohttpRequest, against the fake Bot API: the transport PTB's
own HTTPXRequest was, errors included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from telegram import Bot
from telegram.error import Forbidden, NetworkError, RetryAfter, TelegramError, TimedOut

from nanobot.channels._telegram_http import AiohttpRequest
from nanobot.channels._telegram_send import retry_after_seconds
from nanobot.channels.telegram import REQUEST_TIMEOUTS
from tests.fakes.telegram import (
    DEFAULT_TOKEN,
    ApiError,
    Disconnect,
    FakeTelegram,
    Hang,
    RateLimited,
    ServerError,
)

CHAT = 42


def request(base: str, read_timeout: float | None = None) -> AiohttpRequest:
    timeouts = REQUEST_TIMEOUTS.copy()
    if read_timeout is not None:
        timeouts["read_timeout"] = read_timeout
    return AiohttpRequest(base, pool_size=8, **timeouts)


def make_bot(base: str, read_timeout: float | None = None) -> Bot:
    return Bot(
        DEFAULT_TOKEN,
        base_url=f"{base}/bot",
        base_file_url=f"{base}/file/bot",
        request=request(base, read_timeout),
        get_updates_request=request(base, read_timeout),
    )


@pytest.fixture
def fake(fake_telegram: FakeTelegram) -> FakeTelegram:
    return fake_telegram


@pytest.fixture
async def bot(fake: FakeTelegram) -> AsyncIterator[Bot]:
    async with make_bot(fake.base_url) as client:
        yield client


async def test_messages_and_updates_round_trip(bot: Bot, fake: FakeTelegram) -> None:
    assert (await bot.get_me()).username
    sent = await bot.send_message(CHAT, "<b>a &lt; b</b> é 😀", parse_mode="HTML")
    assert sent.text == "a < b é 😀"
    assert [m.visible for m in fake.sent(CHAT)] == ["a < b é 😀"]
    fake.user_message(CHAT, "hello", user_id=CHAT)
    (update,) = await bot.get_updates(timeout=5)
    assert update.message is not None and update.message.text == "hello"


async def test_uploads_keep_their_name_and_bytes(bot: Bot, fake: FakeTelegram) -> None:
    await bot.send_document(CHAT, document=b"\x00data", filename="отчёт 1.txt", caption="done")
    await bot.send_photo(CHAT, photo=b"\x89PNG", filename="chart.png")
    document, photo = fake.sent(CHAT)
    assert document.file is not None and photo.file is not None
    assert (document.file.filename, document.file.content, document.visible) == (
        "отчёт 1.txt",
        b"\x00data",
        "done",
    )
    assert (photo.file.kind, photo.file.content) == ("photo", b"\x89PNG")


async def test_downloads(bot: Bot, fake: FakeTelegram) -> None:
    fake.user_document(CHAT, filename="notes.txt", content=b"\x00notes", user_id=CHAT)
    (update,) = await bot.get_updates(timeout=5)
    assert update.message is not None and update.message.document is not None
    file = await bot.get_file(update.message.document.file_id)
    assert await file.download_as_bytearray() == b"\x00notes"


async def test_failures_are_ptbs_errors(bot: Bot, fake: FakeTelegram) -> None:
    for fault in (ServerError(500), Disconnect()):
        fake.fail_next("sendMessage", fault)
        with pytest.raises(NetworkError) as info:
            await bot.send_message(CHAT, "hi")
        assert type(info.value) is NetworkError  # not BadRequest, its subclass
    fake.fail_next("sendMessage", RateLimited(retry_after=7))
    with pytest.raises(RetryAfter) as limited:
        await bot.send_message(CHAT, "hi")
    assert retry_after_seconds(limited.value) == 7
    fake.fail_next("sendMessage", ApiError(403, "Forbidden: bot was blocked by the user"))
    with pytest.raises(Forbidden, match="bot was blocked"):
        await bot.send_message(CHAT, "hi")
    fake.offline = True
    with pytest.raises(NetworkError, match=r"^aiohttp\."):
        await bot.send_message(CHAT, "lost")


async def test_timeouts_given_and_default(fake: FakeTelegram) -> None:
    async with make_bot(fake.base_url) as bot:
        fake.fail_next("sendMessage", Hang())
        with pytest.raises(TimedOut):
            await bot.send_message(CHAT, "hi", read_timeout=0.3)  # given with the call
    async with make_bot(fake.base_url, read_timeout=0.3) as bot:
        fake.fail_next("sendMessage", Hang())
        with pytest.raises(TimedOut):
            await bot.send_message(CHAT, "hi")  # the request's own


async def test_a_long_poll_outlasts_the_read_timeout(fake: FakeTelegram) -> None:
    # PTB asks getUpdates with the request's read timeout lengthened by the poll's own.
    async with make_bot(fake.base_url, read_timeout=0.3) as bot:
        assert await bot.get_updates(timeout=1) == ()  # held 1 s, answered
        fake.fail_next("getUpdates", Hang())
        with pytest.raises(TimedOut):
            await bot.get_updates(timeout=0)  # the request's own, and no more


async def test_unreachable_server_is_a_network_error() -> None:
    with pytest.raises(NetworkError, match=r"aiohttp\.ClientConnectorError"):
        async with make_bot("http://127.0.0.1:9"):  # initialising calls getMe
            pass


async def test_goes_through_the_environments_proxy(
    fake: FakeTelegram, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("http_proxy", "all_proxy", "no_proxy", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", fake.base_url)
    async with make_bot("http://api.telegram.invalid") as bot:
        assert (await bot.get_me()).username  # only the proxy (the fake) could answer


@pytest.mark.parametrize("payload", [b"<html>502</html>", b"[1, 2]", b""])
def test_a_body_that_is_not_a_json_object_is_a_telegram_error(payload: bytes) -> None:
    with pytest.raises(TelegramError, match="Invalid server response"):
        AiohttpRequest.parse_json_payload(payload)


async def test_requests_need_initialising_and_shut_down_twice(fake: FakeTelegram) -> None:
    transport = request(fake.base_url)
    url = f"{fake.base_url}/bot{DEFAULT_TOKEN}/getMe"
    with pytest.raises(RuntimeError, match="not initialized"):
        await transport.do_request(url, "POST")
    await transport.initialize()
    status, body = await transport.do_request(url, "POST")
    assert status == 200
    parsed: dict[str, Any] = transport.parse_json_payload(body)
    assert parsed["ok"] is True
    await transport.shutdown()
    await transport.shutdown()
    assert transport.read_timeout == REQUEST_TIMEOUTS["read_timeout"]
