"""Telegram long polling that acknowledges an update only once it is taken.

`getUpdates(offset=N)` acknowledges every update below N: Telegram never sends those again.
The offset sent is explicit state (`Offsets`): every update below it was *taken* — handed to
intake, which journaled it, or deliberately skipped. The updates of an answer are taken in
per-chat lanes (`nanobot.lanes`: in order within a chat, concurrently across chats; each
button press in a lane of its own, so it never waits behind a chat's downloads), and the
next poll first waits a moment (`patience`) for them. Updates still being taken then are not
waited for: the poll asks again from the oldest of them, so other chats' new messages come
in meanwhile, and what comes again while in hand is skipped. (An answer holds at most 100
updates, so while one is still being taken, at most the 99 after it come in.)

While a store failure pauses intake (a take raises `IntakePaused`), the takes wait it out
(`_pause.Pause`: one of them tries again when intake says) with their updates unacknowledged,
and no getUpdates is made: nothing new could be taken. Polling resumes once a take gets
through. A take that fails otherwise ends the run with its
exception (the channel manager restarts the channel; Telegram delivers the update again); a
take that leaves its update (the gateway is stopping) ends the polling until the run is
cancelled. Either way nothing from that update on is acknowledged. On stop, one last short
getUpdates acknowledges what was taken (as PTB's Updater does), and nothing else.

An answer is read one update at a time: an update the library cannot read (a button press
without `chat_instance`, from a Bot API server other than Telegram's) is logged, skipped
and acknowledged, and the rest of the answer is taken (read as a whole, one bad update
would lose the batch, and come again at every start). The first getUpdates asks for what
waits without holding the poll, so that the channel says it is connected (`ready`) once
polling works, at once. A server that answers a long poll at once with nothing (some
emulators do) gets a short pause before the next, growing to `EARLY_MAX`: an idle gateway
does not spin.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from loguru import logger
from telegram import Bot, Update
from telegram.error import Conflict, InvalidToken, RetryAfter, TelegramError, TimedOut

from nanobot.channels._pause import Pause
from nanobot.channels._telegram_retry import retry_after_seconds
from nanobot.lanes import Lanes

POLL_PATIENCE = 1.0  # seconds a poll waits for updates still being taken before going ahead
CONFIRM_TIMEOUT = 5.0  # seconds the last, acknowledging getUpdates may take on stop
FIRST_DELAY, MAX_DELAY = 1.0, 30.0  # seconds before retrying a failed getUpdates, growing ×1.5
EARLY_FIRST, EARLY_MAX = 0.1, 2.0  # pause after an empty answer that came early, growing ×2
ALLOWED = (Update.MESSAGE, Update.CALLBACK_QUERY)  # messages and button presses, not edits

Take = Callable[[Update], Awaitable[bool]]
"""Takes one update: True once it may be acknowledged (journaled, or deliberately skipped);
False to leave it for redelivery (the gateway is stopping). `IntakePaused` is waited out;
what else it raises fails the run."""

Sleep = Callable[[float], Awaitable[None]]

Lane = tuple[str, int | None]  # ("chat", chat id) or ("press", update id)


def lane(update: Update) -> Lane:
    """Where an update is taken: a message in its chat's lane, a press in a lane of its own."""
    if update.callback_query is not None:
        return "press", update.update_id
    chat = update.effective_chat
    return "chat", chat.id if chat is not None else None


async def fetch_updates(bot: Bot, *, offset: int | None, hold: int) -> list[Any]:
    """getUpdates' answer as the server sent it, held by the server up to `hold` seconds:
    one JSON object an update (see the module docstring for why not `Bot.get_updates`,
    which parses them all at once).

    Raises:
        TelegramError: as `Bot.get_updates` does (InvalidToken, Conflict, TimedOut, ...).
    """
    # As Bot.get_updates: the polling request's read timeout lengthened by the poll's own.
    read_timeout = (bot._request[0].read_timeout or 0) + hold
    data = {"timeout": hold, "offset": offset, "allowed_updates": list(ALLOWED)}
    answer = await bot._post("getUpdates", data, read_timeout=read_timeout)
    return answer if isinstance(answer, list) else []


def read_update(bot: Bot, data: Any) -> Update | None:
    """One update of an answer, or None (said once) when the library cannot read it."""
    try:
        update = Update.de_json(data, bot)
    except Exception as exc:  # noqa: BLE001 - any malformed update is skipped, not fatal
        logger.warning(
            "telegram: update {} could not be read ({}: {}); skipped and acknowledged",
            unreadable_id(data),
            type(exc).__name__,
            exc,
        )
        return None
    return update


def unreadable_id(data: Any) -> int | None:
    """The id of an update that could not be read, if it has one to acknowledge it by."""
    update_id = data.get("update_id") if isinstance(data, dict) else None
    return update_id if isinstance(update_id, int) else None


def early(previous: float | None) -> float:
    """Seconds to pause after a poll answered early with nothing; `previous`: the last."""
    return EARLY_FIRST if previous is None else min(EARLY_MAX, previous * 2)


def backoff(previous: float | None) -> float:
    """Seconds to wait before retrying a failed getUpdates; `previous`: the last wait, None
    after a success."""
    return FIRST_DELAY if previous is None else min(MAX_DELAY, previous * 1.5)


class Offsets:
    """Which updates a getUpdates may acknowledge: every one below `offset` was taken."""

    def __init__(self) -> None:
        self.acknowledged = 0  # the offset of the last getUpdates Telegram answered (0: none)
        self._next = 0  # one past the newest update received
        self._untaken: set[int] = set()  # received and not (yet) taken

    @property
    def offset(self) -> int:
        """The offset for the next getUpdates: the oldest update not taken, else the next
        new one (0 before any was received)."""
        return min(self._untaken, default=self._next)

    def received(self, update_id: int) -> bool:
        """Note an update an answer brought; False if it is in hand already (a repeat)."""
        if update_id < self._next:
            return False
        self._next = update_id + 1
        self._untaken.add(update_id)
        return True

    def taken(self, update_id: int) -> None:
        """The update may be acknowledged."""
        self._untaken.discard(update_id)


class Poller:
    """Long-polls `bot` and takes every update with `take`; see the module docstring.

    Made in the running loop, one per run: `run()` once. `ready()` is called once the first
    getUpdates was answered. `sleep` waits between retries (tests pass a recorder).
    """

    def __init__(
        self,
        bot: Bot,
        take: Take,
        *,
        timeout: int,
        ready: Callable[[], None] = lambda: None,
        patience: float = POLL_PATIENCE,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._ready: Callable[[], None] | None = ready
        self.offsets = Offsets()
        self._pause = Pause("telegram")
        self._bot = bot
        self._take = take
        self._timeout = timeout
        self._patience = patience
        self._sleep = sleep
        self._lanes: Lanes[Lane] = Lanes(name="telegram-take")
        self._in_hand = 0  # updates handed to the lanes whose take has not ended
        self._idle = asyncio.Event()
        self._idle.set()
        self._halted: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def run(self) -> None:
        """Poll and take until cancelled; then cancel the takes still running and acknowledge
        what was taken (bounded by `CONFIRM_TIMEOUT`). Failed getUpdates are retried with
        backoff, one warning each.

        Raises:
            InvalidToken: Telegram rejected the token.
            Exception: what a take raised; nothing from that update on was acknowledged.
        """
        polling = asyncio.create_task(self._poll(), name="telegram-poll")
        try:
            await asyncio.wait([polling, self._halted], return_when=asyncio.FIRST_COMPLETED)
            if polling.done():
                polling.result()  # InvalidToken, or a bug; else it ended because of:
            await self._halted  # a take that raised; or one left for redelivery (stopping):
            await asyncio.get_running_loop().create_future()  # then only stop
        finally:
            polling.cancel()
            await asyncio.wait([polling])
            await self._lanes.close()  # what is still being taken is not taken
            for future in (polling, self._halted):
                if future.done() and not future.cancelled():
                    future.exception()  # raised above, or superseded by a cancellation
            await self._confirm()

    async def _poll(self) -> None:
        delay: float | None = None
        pause: float | None = None  # after answers that came early with nothing
        while True:
            if not self._idle.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._patience):
                        await self._idle.wait()
            await self._pause.opened()
            if self._halted.done():
                return
            offset = self.offsets.offset
            hold = 0 if self._ready is not None else self._timeout  # the first: at once
            asked = time.monotonic()
            try:
                answer = await fetch_updates(self._bot, offset=offset or None, hold=hold)
            except InvalidToken:
                raise
            except TimedOut as exc:  # a long poll the network lost: asked again at once
                logger.debug("telegram polling timed out, retrying: {}", exc)
                continue
            except TelegramError as exc:
                delay = self._retry(exc, delay)
                await self._sleep(delay)
                continue
            delay = None
            self.offsets.acknowledged = offset
            if self._ready is not None:
                self._ready()
                self._ready = None
            elif not answer and time.monotonic() - asked < hold / 2:
                pause = early(pause)  # a poll not held: do not ask again at once
                await self._sleep(pause)
            else:
                pause = None
            self._hand_out(answer)

    def _hand_out(self, answer: list[Any]) -> None:
        """Hand each new update of `answer` to its lane; acknowledge one that cannot be read."""
        for data in answer:
            update = read_update(self._bot, data)
            if update is None:
                skipped = unreadable_id(data)
                if skipped is not None and self.offsets.received(skipped):
                    self.offsets.taken(skipped)
            elif self.offsets.received(update.update_id):
                self._in_hand += 1
                self._idle.clear()
                self._lanes.add(lane(update), self._take_one(update))

    def _retry(self, exc: TelegramError, delay: float | None) -> float:
        """Log a failed getUpdates in one line; the seconds to wait before the next."""
        if isinstance(exc, RetryAfter):
            wait = retry_after_seconds(exc)
            logger.warning("telegram polling rate limited, retrying in {:g}s", wait)
            return wait
        wait = backoff(delay)
        if isinstance(exc, Conflict):
            logger.warning(
                "telegram polling conflicts with another poller of this bot (another gateway "
                "running with the same token?) or a webhook, retrying in {:g}s: {}",
                wait,
                exc,
            )
        else:
            logger.warning("telegram polling failed, retrying in {:g}s: {}", wait, exc)
        return wait

    async def _take_one(self, update: Update) -> None:
        try:
            if self._halted.done():
                return  # an earlier take failed: this one comes again too
            try:
                taken = await self._pause.hand_over(partial(self._take, update))
            except Exception as exc:  # noqa: BLE001 - it fails the run, in run()
                logger.error("telegram: update {} could not be taken: {}", update.update_id, exc)
                if not self._halted.done():
                    self._halted.set_exception(exc)
                return
            if taken:
                self.offsets.taken(update.update_id)
            elif not self._halted.done():
                self._halted.set_result(None)
        finally:
            self._in_hand -= 1
            if not self._in_hand:
                self._idle.set()

    async def _confirm(self) -> None:
        offset = self.offsets.offset
        if offset == self.offsets.acknowledged:
            return  # nothing taken since the last poll
        try:
            async with asyncio.timeout(CONFIRM_TIMEOUT):
                await fetch_updates(self._bot, offset=offset, hold=0)
        except (TelegramError, TimeoutError) as exc:
            logger.warning("telegram: could not acknowledge the updates taken: {}", exc)
            return  # they come again after a restart, and are recognised there
        self.offsets.acknowledged = offset
