"""Telegram long polling: the real python-telegram-bot `Bot` against the fake Bot API, and the
acknowledged offset as explicit state."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest
from loguru import logger
from telegram import Bot, Update
from telegram.error import Conflict, InvalidToken

from nanobot.channels._telegram_http import AiohttpRequest
from nanobot.channels._telegram_poll import CONFIRM_TIMEOUT, Offsets, Poller, backoff
from nanobot.channels.telegram import REQUEST_TIMEOUTS
from tests.fakes.telegram import (
    DEFAULT_TOKEN,
    FakeTelegram,
    Garbled,
    Hang,
    RateLimited,
    ServerError,
)

TIMEOUT = 5  # seconds a long poll is held


class Takes:
    """A take that records starts and ends, waits for `release[chat]` if set, and answers
    `answer[chat]` (True by default; an exception is raised)."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.taken: list[int] = []
        self.release: dict[int, asyncio.Event] = {}
        self.answer: dict[int, bool | Exception] = {}
        self._changed = asyncio.Event()

    async def __call__(self, update: Update) -> bool:
        chat = update.effective_chat.id if update.effective_chat else 0
        self.started.append(update.update_id)
        if chat in self.release:
            await self.release[chat].wait()
        answer = self.answer.get(chat, True)
        if isinstance(answer, Exception):
            raise answer
        if answer:
            self.taken.append(update.update_id)
        self._changed.set()
        return answer

    async def wait(self, count: int) -> list[int]:
        async with asyncio.timeout(5):
            while len(self.taken) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.taken


class Sleeps:
    """Records the waits between retries instead of sleeping."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)
        await asyncio.sleep(0)


@pytest.fixture
def fake(fake_telegram: FakeTelegram) -> FakeTelegram:
    return fake_telegram


def make_bot(fake: FakeTelegram) -> Bot:
    base = fake.base_url
    polls = REQUEST_TIMEOUTS | {"read_timeout": 0.3}
    return Bot(
        DEFAULT_TOKEN,
        base_url=f"{base}/bot",
        request=AiohttpRequest(base, pool_size=8, **REQUEST_TIMEOUTS),
        get_updates_request=AiohttpRequest(base, pool_size=1, **polls),
    )


@pytest.fixture
async def bot(fake: FakeTelegram) -> AsyncIterator[Bot]:
    async with make_bot(fake) as client:
        yield client


@asynccontextmanager
async def polling(poller: Poller) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(poller.run(), name="poller-under-test")
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.wait([task], timeout=CONFIRM_TIMEOUT + 5)
        assert task.done()


@contextmanager
def warnings() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="WARNING")
    try:
        yield lines
    finally:
        logger.remove(sink)


def pending(fake: FakeTelegram) -> list[int]:
    return [u["update_id"] for u in fake.pending_updates]


def offsets(fake: FakeTelegram) -> list[int]:
    return [int(call.params.get("offset") or 0) for call in fake.calls("getUpdates")]


# ---- the state ----------------------------------------------------------------------------


def test_the_offset_passes_only_updates_taken_and_repeats_are_recognised() -> None:
    state = Offsets()
    assert state.offset == 0  # nothing received: nothing acknowledged
    assert [state.received(i) for i in (5, 6, 7)] == [True, True, True]
    assert state.offset == 5
    state.taken(6)
    state.taken(7)
    assert state.offset == 5  # 5 is still being taken: 6 and 7 come again
    assert [state.received(i) for i in (5, 6, 7, 8)] == [False, False, False, True]
    state.taken(5)
    assert state.offset == 8
    state.taken(8)
    assert state.offset == 9


def test_backoff_grows_to_half_a_minute() -> None:
    waits = [backoff(None)]
    while len(waits) < 12:
        waits.append(backoff(waits[-1]))
    assert waits[:3] == [1.0, 1.5, 2.25] and waits[-1] == 30.0


# ---- acknowledging ------------------------------------------------------------------------


async def test_a_slow_take_holds_the_offset_while_other_chats_are_taken(
    fake: FakeTelegram, bot: Bot
) -> None:
    takes = Takes()
    takes.release = {10: asyncio.Event()}
    slow = fake.user_message(10, "slow", user_id=10)
    same_chat = fake.user_message(10, "after it", user_id=10)
    other = fake.user_message(20, "another chat", user_id=20)
    poller = Poller(bot, takes, timeout=TIMEOUT, patience=0.05)
    async with polling(poller):
        await takes.wait(1)
        meanwhile = fake.user_message(30, "meanwhile", user_id=30)  # a later poll's
        assert await takes.wait(2) == [other, meanwhile]
        await fake.wait_for(lambda: len(fake.calls("getUpdates")) >= 4)
        assert takes.started == [slow, other, meanwhile]  # each once, though asked again
        assert poller.offsets.acknowledged == slow and max(offsets(fake)) == slow
        assert pending(fake) == [slow, same_chat, other, meanwhile]
        takes.release[10].set()
        assert await takes.wait(4) == [other, meanwhile, slow, same_chat]
        await fake.wait_for(lambda: not fake.pending_updates)
    assert poller.offsets.acknowledged == meanwhile + 1


async def test_presses_are_asked_for_and_none_waits_behind_its_chats_slow_take(
    fake: FakeTelegram, bot: Bot
) -> None:
    release, taken = asyncio.Event(), asyncio.Event()
    started: list[int] = []

    async def take(update: Update) -> bool:
        started.append(update.update_id)
        if update.callback_query is None:
            await release.wait()  # a slow message (its files downloading)
        taken.set()
        return True

    slow = fake.user_message(10, "slow", user_id=10)
    press = fake.user_callback(10, 1, "/deny a1", user_id=10)  # a button under it, say
    poller = Poller(bot, take, timeout=TIMEOUT, patience=0.05)
    async with polling(poller):
        async with asyncio.timeout(5):
            await taken.wait()
        assert started == [slow, press]
        assert pending(fake) == [slow, press]  # the press is held by the message before it
        release.set()
        await fake.wait_for(lambda: not fake.pending_updates)
    asked = {str(c.params["allowed_updates"]) for c in fake.calls("getUpdates")}
    assert [json.loads(a) for a in asked] == [["message", "callback_query"]]


async def test_a_failed_take_fails_the_run_and_nothing_from_it_on_is_acknowledged(
    fake: FakeTelegram, bot: Bot
) -> None:
    takes = Takes()
    takes.answer = {20: OSError("disk full")}
    takes.release = {20: asyncio.Event()}
    first = fake.user_message(10, "taken", user_id=10)
    failing = fake.user_message(20, "fails", user_id=20)
    later = fake.user_message(30, "later", user_id=30)
    poller = Poller(bot, takes, timeout=TIMEOUT, patience=60)
    async with polling(poller) as task:
        await takes.wait(2)
        calls = len(fake.calls("getUpdates"))
        takes.release[20].set()
        with pytest.raises(OSError, match="disk full"):
            await asyncio.wait_for(task, 5)
    assert takes.taken == [first, later]
    # One last poll acknowledged what came before it, and nothing else was asked.
    assert offsets(fake)[calls:] == [failing]
    assert pending(fake) == [failing, later]


async def test_an_update_left_for_redelivery_stops_the_polling_until_stopped(
    fake: FakeTelegram, bot: Bot
) -> None:
    takes = Takes()
    takes.answer = {20: False}  # intake is closed: the gateway is stopping
    first = fake.user_message(10, "taken", user_id=10)
    left = fake.user_message(20, "left", user_id=20)
    poller = Poller(bot, takes, timeout=TIMEOUT, patience=0.05)
    async with polling(poller) as task:
        await takes.wait(1)
        # A "nothing more happens" check: 6 × patience, by when a poller that went on
        # would have polled again.
        await asyncio.sleep(0.3)
        assert not task.done()
        assert len(fake.calls("getUpdates")) == 1 and not fake.polling
        fake.user_message(30, "too late", user_id=30)
    assert task.cancelled()
    assert offsets(fake)[1:] == [left] and pending(fake)[0] == left
    assert takes.taken == [first]


async def test_stopping_acknowledges_what_was_taken_with_one_short_poll(
    fake: FakeTelegram, bot: Bot
) -> None:
    takes = Takes()
    takes.release = {20: asyncio.Event()}  # never set: cancelled when the poller stops
    first = fake.user_message(10, "taken", user_id=10)
    unfinished = fake.user_message(20, "still being taken", user_id=20)
    poller = Poller(bot, takes, timeout=TIMEOUT, patience=60)
    async with polling(poller):
        await takes.wait(1)
        assert takes.started == [first, unfinished]
    last = fake.calls("getUpdates")[-1]
    assert len(fake.calls("getUpdates")) == 2
    assert (last.params.get("offset"), last.params.get("timeout")) == (str(unfinished), "0")
    assert pending(fake) == [unfinished] and poller.offsets.acknowledged == unfinished
    assert first not in pending(fake)


# ---- failures of getUpdates -----------------------------------------------------------------


async def test_failed_polls_are_retried_with_backoff_one_warning_each(
    fake: FakeTelegram, bot: Bot
) -> None:
    sleeps, takes = Sleeps(), Takes()
    fake.fail_next("getUpdates", ServerError(502), times=3)
    with warnings() as lines:
        async with polling(Poller(bot, takes, timeout=TIMEOUT, sleep=sleeps)):
            fake.user_message(10, "through at last", user_id=10)
            await takes.wait(1)
            assert sleeps.seconds == [1.0, 1.5, 2.25]
            fake.fail_next("getUpdates", ServerError(500))
            fake.fail_next("getUpdates", RateLimited(retry_after=7))
            fake.user_message(10, "again", user_id=10)  # ends the long poll being held
            await takes.wait(2)
    assert sleeps.seconds == [1.0, 1.5, 2.25, 1.0, 7.0]  # afresh after a success
    assert len(lines) == 5 and all(line.startswith("telegram polling") for line in lines)
    assert "retrying in 1.5s: Bad Gateway" in lines[1]


async def test_a_poll_the_network_lost_is_asked_again_at_once(fake: FakeTelegram, bot: Bot) -> None:
    sleeps, takes = Sleeps(), Takes()
    fake.fail_next("getUpdates", Hang())  # TimedOut after the poll's 1 s and 0.3 s more
    async with polling(Poller(bot, takes, timeout=1, sleep=sleeps)):
        fake.user_message(10, "hi", user_id=10)
        await takes.wait(1)
    assert sleeps.seconds == [] and len(fake.calls("getUpdates")) >= 2


async def test_another_poller_is_a_clear_warning_and_polling_goes_on(
    fake: FakeTelegram, bot: Bot
) -> None:
    sleeps, takes = Sleeps(), Takes()
    with warnings() as lines:
        async with (
            polling(Poller(bot, takes, timeout=TIMEOUT, sleep=sleeps)),
            make_bot(fake) as other,
        ):
            await fake.wait_for(lambda: fake.polling)
            # Another process polls with the same token: Telegram ends our long poll with
            # 409, and ours, asked again, ends the other's the same way.
            with pytest.raises(Conflict):
                await other.get_updates(timeout=TIMEOUT)
            fake.user_message(10, "still here", user_id=10)
            await takes.wait(1)
    [line] = lines
    assert "another poller of this bot" in line and "terminated by other getUpdates" in line
    assert sleeps.seconds == [1.0]


async def test_a_rejected_token_ends_the_run(fake: FakeTelegram, bot: Bot) -> None:
    fake.valid_token = "1:another-token"
    poller = Poller(bot, Takes(), timeout=TIMEOUT)
    with pytest.raises(InvalidToken):
        await asyncio.wait_for(poller.run(), 5)


# ---- servers that are not Telegram's ------------------------------------------------------


async def test_an_update_the_library_cannot_read_is_skipped_and_the_rest_taken(
    fake: FakeTelegram, bot: Bot
) -> None:
    takes = Takes()
    fake.user_message(10, "readable", user_id=10)
    [good] = fake.pending_updates
    poison = {  # a button press without chat_instance: PTB's CallbackQuery requires it
        "update_id": good["update_id"] - 1,
        "callback_query": {"id": "7", "from": {"id": 10, "is_bot": False, "first_name": "A"}},
    }
    fake.fail_next("getUpdates", Garbled(result=[poison, good]))  # the first poll's answer
    with warnings() as lines:
        async with polling(Poller(bot, takes, timeout=TIMEOUT, patience=0.05)):
            assert await takes.wait(1) == [good["update_id"]]
            await fake.wait_for(lambda: good["update_id"] + 1 in offsets(fake))
    [line] = [line for line in lines if "could not be read" in line]
    assert line.startswith(f"telegram: update {poison['update_id']} could not be read (")
    assert pending(fake) == []  # both acknowledged: the poison update never comes again


async def test_polls_answered_at_once_with_nothing_wait_a_growing_moment(
    fake: FakeTelegram, bot: Bot
) -> None:
    sleeps, takes, connected = Sleeps(), Takes(), []
    fake.fail_next("getUpdates", Garbled(result=[]), times=6)  # an emulator not holding polls
    poller = Poller(bot, takes, timeout=TIMEOUT, sleep=sleeps, ready=lambda: connected.append(1))
    async with polling(poller):
        await fake.wait_for(lambda: len(fake.calls("getUpdates")) >= 7)
        fake.user_message(10, "hi", user_id=10)
        await takes.wait(1)
    # The first poll is not held (the channel is connected once it is answered); the five
    # held ones answered at once each wait a moment more before the next.
    assert connected == [1]
    assert int(fake.calls("getUpdates")[0].params.get("timeout") or 0) == 0
    assert sleeps.seconds == [0.1, 0.2, 0.4, 0.8, 1.6]
