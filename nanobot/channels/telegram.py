"""The Telegram channel: python-telegram-bot long polling in, rendered HTML out.

Nothing is acknowledged before it is journaled. PTB's Updater hands every update it fetched
to the Application's `update_queue` and only then asks Telegram for the next ones with a
higher offset, which is what acknowledges them. Our queue's `put` *is* the intake: it turns
the update into an `InboundMessage` and awaits `intake` (which journals it) before
returning, so an update is confirmed only after the journal has it. No PTB handlers are
registered; the Application never sees an update, so nothing is processed twice.

Out: Markdown is rendered to Telegram HTML and split into messages of at most 4096 visible
characters; a reply that was streamed is edited in place, at most about once a second.
"""

from __future__ import annotations

import asyncio
import html
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar

from loguru import logger
from telegram import Message, Update
from telegram.error import InvalidToken, TelegramError
from telegram.ext import Application, ApplicationBuilder

from nanobot.bus.events import (
    ChatRef,
    Outbound,
    OutboundMessage,
    StreamUpdate,
    Typing,
)
from nanobot.channels import _telegram_inbound as inbound
from nanobot.channels._telegram_send import ONCE, Retry, Sender
from nanobot.channels.base import Channel, DeliveryError, InboxPolicy, Intake, IntakeFn
from nanobot.channels.render import split_telegram, telegram_html
from nanobot.errors import ConfigError

POLL_TIMEOUT = 30  # seconds a getUpdates long poll is held open by Telegram
STREAM_INTERVAL = 1.0  # seconds between two edits of a streamed reply
TYPING_INTERVAL = 4.0  # Telegram shows "typing…" for about 5 s
KEEP_STREAMS = 64  # streamed replies (and partly sent ones) remembered at most
TAKE_ATTEMPTS = 3  # an update that cannot be read this often is skipped (logged)


K = TypeVar("K")
V = TypeVar("V")


class Secret(Protocol):
    def get_secret_value(self) -> str: ...


class TelegramSettings(Protocol):
    """The `channels.telegram` config section, as far as this channel reads it."""

    @property
    def token(self) -> Secret: ...
    @property
    def api_base(self) -> str: ...
    @property
    def group_policy(self) -> str: ...


class _IntakeQueue(asyncio.Queue[object]):
    """The update queue PTB's Updater puts fetched updates into; `put` returns only when
    the update has been taken care of (see the module docstring)."""

    def __init__(self, take: Callable[[Update], Awaitable[None]]) -> None:
        super().__init__()
        self._take = take

    async def put(self, item: object) -> None:
        if isinstance(item, Update):
            await self._take(item)
        else:  # the Application's own stop signal
            await super().put(item)


@dataclass(slots=True)
class _Stream:
    """A reply being shown as it is written: the message that shows it, and what it shows."""

    message_id: int | None  # None: it can no longer be edited
    shown: str
    at: float


@dataclass(slots=True)
class _Typing:
    task: asyncio.Task[None]
    turns: int = 1


class TelegramChannel(Channel):
    """Telegram via the Bot API (long polling). See the module docstring."""

    name = "telegram"

    def __init__(
        self,
        config: TelegramSettings,
        intake: IntakeFn,
        inbox: InboxPolicy,
        *,
        retry: Retry | None = None,
        stream_interval: float = STREAM_INTERVAL,
        typing_interval: float = TYPING_INTERVAL,
        poll_timeout: int = POLL_TIMEOUT,
    ) -> None:
        super().__init__(intake)
        self._config = config
        self._inbox = inbox
        self._sender = Sender(retry or Retry())
        self._stream_interval = stream_interval
        self._typing_interval = typing_interval
        self._poll_timeout = poll_timeout
        self._stopped: asyncio.Future[None] | None = None
        self._streams: OrderedDict[str, _Stream] = OrderedDict()
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._typing: dict[ChatRef, _Typing] = {}
        self._progress: OrderedDict[int, tuple[OutboundMessage, int]] = OrderedDict()
        self._failures: dict[int, int] = {}

    # ---- running --------------------------------------------------------------------

    def _application(self) -> Application[Any, Any, Any, Any, Any, Any]:
        base = self._config.api_base.rstrip("/")
        return (
            ApplicationBuilder()
            .token(self._config.token.get_secret_value())
            .base_url(f"{base}/bot")
            .base_file_url(f"{base}/file/bot")
            .update_queue(_IntakeQueue(self._take))
            .job_queue(None)
            .connect_timeout(10)
            .read_timeout(20)
            .write_timeout(20)
            .pool_timeout(10)
            .get_updates_connect_timeout(10)
            .get_updates_read_timeout(10)  # PTB adds the long poll's own timeout to this
            .get_updates_write_timeout(10)
            .get_updates_pool_timeout(10)
            .build()
        )

    async def run(self, ready: Callable[[], None]) -> None:
        app = self._application()
        updater = app.updater
        assert updater is not None  # the builder always makes one
        stopped = self._stopped = asyncio.get_running_loop().create_future()
        try:
            async with app:
                await app.start()
                self._sender.bot = app.bot
                try:
                    await updater.start_polling(
                        timeout=self._poll_timeout,
                        allowed_updates=[Update.MESSAGE],  # edits and buttons are ignored
                        drop_pending_updates=False,
                        error_callback=_polling_error,
                    )
                    logger.info("telegram connected as @{}", app.bot.username)
                    ready()
                    await stopped  # until cancelled, or an update could not be taken
                finally:
                    self._stopped = None
                    await self._stop_typing()
                    if updater.running:
                        await updater.stop()  # confirms what was taken, and no more
                    self._sender.bot = None
                    await app.stop()
        except InvalidToken:  # its message quotes the token
            raise ConfigError("channels.telegram.token was rejected by Telegram") from None
        finally:
            await app.bot.shutdown()  # PTB leaves it open when `initialize()` failed

    async def _take(self, update: Update) -> None:
        """Hand one update to intake; returns when it may be acknowledged.

        This runs inside PTB's polling task, which any exception would end silently: so
        failures are caught here, leave the update unacknowledged and make run() fail (the
        manager reconnects, Telegram delivers the update again).
        """
        bot = self._sender.bot
        if bot is None:  # stopping: leave it for the next start
            await _hold()
        try:
            received = await inbound.read(
                update, bot, self._inbox, self._config.group_policy, self._sender.retry
            )
        except Exception as exc:  # noqa: BLE001 - see above
            failures = self._failures.pop(update.update_id, 0) + 1
            if failures >= TAKE_ATTEMPTS:  # it can never be read: do not block the chat
                logger.exception("telegram: update {} could not be read; skipped", update.update_id)
                return
            self._failures[update.update_id] = failures
            self._fail(exc, f"reading update {update.update_id} failed")
            await _hold()
        self._failures.pop(update.update_id, None)
        outcome = Intake.REFUSED
        if received.message is not None:
            try:
                outcome = await self.intake(received.message)
            except Exception as exc:  # noqa: BLE001 - the journal decides: never skipped
                self._fail(exc, f"intake of update {update.update_id} failed")
                await _hold()
        accepted = outcome is Intake.ACCEPTED
        if not accepted and received.saved:  # refused, a redelivery, or taken again later
            await asyncio.to_thread(_remove, received.saved)
        if outcome is Intake.CLOSED:
            await _hold()  # the gateway is stopping: Telegram delivers it again after restart
        # A message that was only a refused file is not handed over: say so if the bot was
        # addressed; otherwise only once the gate has let the message in.
        told = accepted or (received.message is None and received.addressed)
        if received.refusals and told and received.source is not None:
            await self._notify(received.source, "\n".join(received.refusals))

    def _fail(self, exc: Exception, what: str) -> None:
        logger.opt(exception=exc).error("telegram: {}; reconnecting", what)
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_exception(exc)  # run() raises; the manager restarts it

    async def _notify(self, message: Message, text: str) -> None:
        chat = inbound.chat_ref(message)
        try:
            await self._sender.send(
                chat, html.escape(text, quote=False), reply_to=message.message_id
            )
        except DeliveryError as exc:
            logger.warning("telegram: could not tell chat {} about a file: {}", chat.chat_id, exc)

    # ---- delivering -------------------------------------------------------------------

    async def deliver(self, item: Outbound) -> None:
        match item:
            case Typing():
                await self._set_typing(item)
            case StreamUpdate():
                await self._stream(item)
            case OutboundMessage():
                await self._send(item)

    async def _send(self, item: OutboundMessage) -> None:
        """Every chunk in order; a streamed reply's message becomes the first chunk. The
        chunks already sent are remembered, so the manager's retry resumes where it failed."""
        chunks = split_telegram(telegram_html(item.text))
        entry = self._progress.get(id(item))
        done = entry[1] if entry is not None and entry[0] is item else 0
        stream = self._streams.get(item.stream_id) if item.stream_id else None
        reply_to = inbound.message_number(item.reply_to)
        for index in range(done, len(chunks)):
            edited = (
                index == 0
                and stream is not None
                and await self._edit_stream(item.chat, stream, chunks[0])
            )
            if not edited:
                first = index == 0
                await self._sender.send(
                    item.chat, chunks[index], reply_to=reply_to if first else None
                )
            _remember(self._progress, id(item), (item, index + 1))
        self._progress.pop(id(item), None)
        if item.stream_id:
            self._streams.pop(item.stream_id, None)
            _remember(self._finished, item.stream_id, None)

    async def _edit_stream(self, chat: ChatRef, stream: _Stream, chunk: str) -> bool:
        """The final edit: exact, and still no sooner than the interval after the last."""
        if stream.message_id is None:
            return False
        loop = asyncio.get_running_loop()
        await asyncio.sleep(stream.at + self._stream_interval - loop.time())
        stream.at = loop.time()
        return await self._sender.edit(chat, stream.message_id, chunk)

    async def _stream(self, update: StreamUpdate) -> None:
        """Show the reply so far: send it, then edit it. Best effort: never raises."""
        if update.stream_id in self._finished:
            return  # the final message is out; a late update must not start another
        chunks = split_telegram(telegram_html(update.text))
        if not chunks:
            return
        now = asyncio.get_running_loop().time()
        state = self._streams.get(update.stream_id)
        try:
            if state is None:
                reply_to = inbound.message_number(update.reply_to)
                sent = await self._sender.send(
                    update.chat, chunks[0], reply_to=reply_to, retry=ONCE
                )
                _remember(self._streams, update.stream_id, _Stream(sent, chunks[0], now))
            elif state.message_id is not None and state.shown != chunks[0]:
                if now - state.at < self._stream_interval:
                    return  # the final message is exact; skipped updates are not missed
                state.at, state.shown = now, chunks[0]
                if not await self._sender.edit(
                    update.chat, state.message_id, chunks[0], retry=ONCE
                ):
                    state.message_id = None
        except DeliveryError as exc:
            logger.debug("telegram stream update skipped: {}", exc)

    async def _set_typing(self, signal: Typing) -> None:
        """One indicator per chat while any turn runs there."""
        current = self._typing.get(signal.chat)
        if signal.active:
            if self._sender.bot is None:
                return  # not connected; and run() could not stop it
            if current is not None:
                current.turns += 1
            else:
                task = asyncio.create_task(self._keep_typing(signal.chat), name="telegram-typing")
                self._typing[signal.chat] = _Typing(task)
        elif current is not None:
            current.turns -= 1
            if current.turns <= 0:
                del self._typing[signal.chat]
                await _cancel(current.task)

    async def _keep_typing(self, chat: ChatRef) -> None:
        while True:
            await self._sender.typing(chat)
            await asyncio.sleep(self._typing_interval)

    async def _stop_typing(self) -> None:
        tasks = [state.task for state in self._typing.values()]
        self._typing.clear()
        for task in tasks:
            await _cancel(task)


def _remember(cache: OrderedDict[K, V], key: K, value: V) -> None:
    """Put `key` in a small cache that forgets its oldest entries."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > KEEP_STREAMS:
        cache.popitem(last=False)


async def _hold() -> NoReturn:
    """Never return: the update being taken stays unacknowledged until the Updater stops
    and cancels us (its offset only advances after `put` returns)."""
    while True:
        await asyncio.get_running_loop().create_future()


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait([task])  # unlike `await task`, never swallows our own cancellation


def _remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _polling_error(exc: TelegramError) -> None:
    # PTB retries by itself with backoff (up to 30 s); one line, not a traceback each time.
    logger.warning("telegram polling failed, retrying: {}", exc)
