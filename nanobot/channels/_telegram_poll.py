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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from functools import partial

from loguru import logger
from telegram import Bot, Update
from telegram.error import Conflict, InvalidToken, RetryAfter, TelegramError, TimedOut

from nanobot.channels._pause import Pause
from nanobot.channels._telegram_retry import retry_after_seconds
from nanobot.lanes import Lanes

POLL_PATIENCE = 1.0  # seconds a poll waits for updates still being taken before going ahead
CONFIRM_TIMEOUT = 5.0  # seconds the last, acknowledging getUpdates may take on stop
FIRST_DELAY, MAX_DELAY = 1.0, 30.0  # seconds before retrying a failed getUpdates, growing ×1.5
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

    Made in the running loop, one per run: `run()` once. `sleep` waits between retries
    (tests pass a recorder).
    """

    def __init__(
        self,
        bot: Bot,
        take: Take,
        *,
        timeout: int,
        patience: float = POLL_PATIENCE,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
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
        while True:
            if not self._idle.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._patience):
                        await self._idle.wait()
            await self._pause.opened()
            if self._halted.done():
                return
            offset = self.offsets.offset
            try:
                updates = await self._bot.get_updates(
                    offset=offset or None, timeout=self._timeout, allowed_updates=ALLOWED
                )
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
            for update in updates:
                if self.offsets.received(update.update_id):
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
                await self._bot.get_updates(offset=offset, timeout=0, allowed_updates=ALLOWED)
        except (TelegramError, TimeoutError) as exc:
            logger.warning("telegram: could not acknowledge the updates taken: {}", exc)
            return  # they come again after a restart, and are recognised there
        self.offsets.acknowledged = offset
