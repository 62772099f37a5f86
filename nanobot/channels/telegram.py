"""The Telegram channel: python-telegram-bot long polling in, rendered HTML out.

Nothing is acknowledged before it is journaled. PTB's Updater hands every update it fetched
to the Application's `update_queue` and then asks Telegram for the next ones with a higher
offset, which is what acknowledges them. Our queue's `put` *is* the intake: it starts
turning the update into an `InboundMessage` (its files fetched only if `intake` admits the
sender) and handing it to `intake` (which journals it), in the update's chat's lane
(`IntakeLanes`: in order per chat, concurrently across chats), and the getUpdates request
that would acknowledge it asks from the oldest update still being taken, so an update is
confirmed only after the journal has it. No PTB handlers are registered; the Application
never sees an update, so nothing is processed twice.

Out: Markdown is rendered to Telegram HTML and split into messages of at most 4096 visible
characters; a reply that was streamed is edited in place, at most about once a second.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

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
from nanobot.channels._replies import Replies
from nanobot.channels._settings import BotSettings
from nanobot.channels._telegram_http import AiohttpRequest, Timeouts
from nanobot.channels._telegram_lanes import IntakeLanes
from nanobot.channels._telegram_send import ONCE, Retry, Sender
from nanobot.channels._typing import DELAY as TYPING_DELAY
from nanobot.channels._typing import TypingIndicator
from nanobot.channels.base import (
    Channel,
    DeliveryError,
    InboxPolicy,
    Intake,
    IntakePort,
    Progress,
    Streams,
)
from nanobot.channels.render import split_telegram, telegram_html
from nanobot.errors import ConfigError

POLL_TIMEOUT = 30  # seconds a getUpdates long poll is held open by Telegram
STREAM_INTERVAL = 1.0  # seconds between two edits of a streamed reply
TYPING_INTERVAL = 4.0  # Telegram shows "typing…" for about 5 s
TAKE_ATTEMPTS = 3  # an update that cannot be read this often is skipped (logged)
# Seconds, for Bot API calls and for getUpdates (whose read timeout PTB lengthens by the poll's).
REQUEST_TIMEOUTS: Final = Timeouts(
    connect_timeout=10.0, read_timeout=20.0, write_timeout=20.0, pool_timeout=10.0
)
POLL_TIMEOUTS: Final = Timeouts(
    connect_timeout=10.0, read_timeout=10.0, write_timeout=10.0, pool_timeout=10.0
)


class TelegramSettings(BotSettings, Protocol):
    """The `channels.telegram` config section, as far as this channel reads it."""


class _IntakeQueue(asyncio.Queue[object]):
    """The update queue PTB's Updater puts fetched updates into; `put` hands an update to
    its chat's intake lane (see the module docstring)."""

    def __init__(self, lanes: IntakeLanes) -> None:
        super().__init__()
        self._lanes = lanes

    async def put(self, item: object) -> None:
        if isinstance(item, Update):
            self._lanes.add(item)
        else:  # the Application's own stop signal
            await super().put(item)


class _Outlet:
    """The Sender as `Replies` uses it: a reply names its message by the bus's key, and
    every call tries as hard as `retry` says (None: the Sender's own)."""

    def __init__(self, sender: Sender, retry: Retry | None = None) -> None:
        self._sender = sender
        self._retry = retry

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None) -> int:
        number = inbound.message_number(reply_to)
        return await self._sender.send(chat, text, reply_to=number, retry=self._retry)

    async def edit(self, chat: ChatRef, message_id: int, text: str) -> bool:
        return await self._sender.edit(chat, message_id, text, retry=self._retry)


class TelegramChannel(Channel):
    """Telegram via the Bot API (long polling). See the module docstring."""

    name = "telegram"

    def __init__(
        self,
        config: TelegramSettings,
        intake: IntakePort,
        inbox: InboxPolicy,
        *,
        retry: Retry | None = None,
        stream_interval: float = STREAM_INTERVAL,
        typing_interval: float = TYPING_INTERVAL,
        typing_delay: float = TYPING_DELAY,
        progress: Progress | None = None,
        streams: Streams | None = None,
        poll_timeout: int = POLL_TIMEOUT,
    ) -> None:
        super().__init__(intake)
        self._config = config
        self._inbox = inbox
        self._sender = Sender(retry or Retry())
        self._replies = Replies(
            _Outlet(self._sender),
            _render,
            interval=stream_interval,
            name=self.name,
            best_effort=_Outlet(self._sender, ONCE),  # a stream update is tried once
            progress=progress,
            streams=streams,
        )
        self._typing = TypingIndicator(
            self._sender.typing, typing_interval, delay=typing_delay, name=self.name
        )
        self._poll_timeout = poll_timeout
        self._stopped: asyncio.Future[None] | None = None
        self._failures: dict[int, int] = {}

    # ---- running --------------------------------------------------------------------

    def _application(self, lanes: IntakeLanes) -> Application[Any, Any, Any, Any, Any, Any]:
        base = self._config.api_base.rstrip("/")
        return (
            ApplicationBuilder()
            .token(self._config.token.get_secret_value())
            .base_url(f"{base}/bot")
            .base_file_url(f"{base}/file/bot")
            .update_queue(_IntakeQueue(lanes))
            .job_queue(None)
            .request(AiohttpRequest(base, pool_size=256, **REQUEST_TIMEOUTS))
            # A poll confirms the updates fetched before it: it waits a moment for them to be
            # taken, then asks again from the oldest still being taken (and is not made if
            # one could not be). PTB lengthens its read timeout by the poll's own.
            .get_updates_request(
                AiohttpRequest(base, pool_size=1, before=lanes.before_poll, **POLL_TIMEOUTS)
            )
            .build()
        )

    async def run(self, ready: Callable[[], None]) -> None:
        lanes = IntakeLanes(self._take)  # one run's: a failed take fails only that run
        app = self._application(lanes)
        updater = app.updater
        assert updater is not None  # the builder always makes one
        stopped = self._stopped = asyncio.get_running_loop().create_future()
        try:
            async with app:
                await app.start()
                self._sender.bot = app.bot
                self._typing.start()
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
                    await self._typing.stop()
                    if updater.running:
                        await updater.stop()  # confirms what was taken, and no more
                    await lanes.close()  # what is left was not confirmed: comes again
                    self._sender.bot = None
                    await app.stop()
        except InvalidToken:  # its message quotes the token
            raise ConfigError("channels.telegram.token was rejected by Telegram") from None
        finally:
            await app.bot.shutdown()  # PTB leaves it open when `initialize()` failed

    async def _take(self, update: Update) -> bool:
        """Hand one update to intake; True once it may be acknowledged.

        False leaves it unacknowledged: while stopping, or after a failure, which also makes
        run() fail (the manager reconnects, Telegram delivers the update again).
        """
        bot = self._sender.bot
        if bot is None:  # stopping: leave it for the next start
            return False
        try:
            received = await inbound.read(update, bot, self._inbox, self.intake, self._sender.retry)
        except Exception as exc:  # noqa: BLE001 - see above
            failures = self._failures.pop(update.update_id, 0) + 1
            if failures >= TAKE_ATTEMPTS:  # it can never be read: do not block the chat
                logger.exception("telegram: update {} could not be read; skipped", update.update_id)
                return True
            self._failures[update.update_id] = failures
            self._fail(exc, f"reading update {update.update_id} failed")
            return False
        self._failures.pop(update.update_id, None)
        outcome = Intake.REFUSED
        if received.message is not None:
            try:
                outcome = await self.intake(received.message)
            except Exception as exc:  # noqa: BLE001 - the journal decides: never skipped
                self._fail(exc, f"intake of update {update.update_id} failed")
                return False
        accepted = outcome is Intake.ACCEPTED
        if not accepted and received.saved:  # refused, a redelivery, or taken again later
            await asyncio.to_thread(_remove, received.saved)
        if outcome is Intake.CLOSED:
            return False  # stopping, and a stranger's: Telegram delivers it again after restart
        # A message that was only a refused file is not handed over: say so if the bot was
        # addressed; otherwise only once the gate has let the message in.
        told = accepted or (received.message is None and received.addressed)
        if received.refusals and told and received.source is not None:
            await self._notify(received.source, "\n".join(received.refusals))
        return True

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
                await self._typing.update(item)
            case StreamUpdate():
                await self._replies.stream(item)
            case OutboundMessage():
                await self._replies.send(item)


def _render(text: str) -> list[str]:
    return split_telegram(telegram_html(text))


def _remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _polling_error(exc: TelegramError) -> None:
    # PTB retries by itself with backoff (up to 30 s); one line, not a traceback each time.
    logger.warning("telegram polling failed, retrying: {}", exc)
