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
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from loguru import logger
from telegram import Bot, Message, Update
from telegram.error import InvalidToken, TelegramError
from telegram.ext import Application, ApplicationBuilder

from nanobot.bus.events import (
    Attachment,
    ChatRef,
    InboundMessage,
    Outbound,
    OutboundMessage,
    StreamUpdate,
    Typing,
)
from nanobot.channels import _telegram_inbound as inbound
from nanobot.channels._telegram_send import ONCE, Retry, Sender
from nanobot.channels.base import Channel, DeliveryError, InboxPolicy, Intake, IntakeFn, save_file
from nanobot.channels.render import split_telegram, telegram_html
from nanobot.errors import ConfigError

POLL_TIMEOUT = 30  # seconds a getUpdates long poll is held open by Telegram
STREAM_INTERVAL = 1.0  # seconds between two edits of a streamed reply
TYPING_INTERVAL = 4.0  # Telegram shows "typing…" for about 5 s
KEEP_STREAMS = 64  # streamed replies whose final message may still come


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


@dataclass(slots=True)
class _Received:
    message: InboundMessage | None
    refusals: list[str] = field(default_factory=list)
    saved: list[Path] = field(default_factory=list)


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
        self._progress: dict[int, tuple[OutboundMessage, int]] = {}

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
        self._stopped = asyncio.get_running_loop().create_future()
        try:
            async with app:
                await app.start()
                try:
                    await updater.start_polling(
                        timeout=self._poll_timeout,
                        allowed_updates=[Update.MESSAGE],  # edits and buttons are ignored
                        drop_pending_updates=False,
                        error_callback=_polling_error,
                    )
                    self._sender.bot = app.bot
                    logger.info("telegram connected as @{}", app.bot.username)
                    ready()
                    await self._stopped  # until cancelled, or intake failed
                finally:
                    self._sender.bot = None
                    await self._stop_typing()
                    if updater.running:
                        await updater.stop()  # confirms what was taken, and no more
                    await app.stop()
        except InvalidToken as exc:
            raise ConfigError(f"channels.telegram.token was rejected by Telegram: {exc}") from exc
        finally:
            self._stopped = None

    async def _take(self, update: Update) -> None:
        """Hand one update to intake; returns when it may be acknowledged."""
        try:
            hold = await self._receive(update)
        except Exception as exc:  # noqa: BLE001 - PTB's polling task would die silently
            logger.exception("telegram: taking update {} failed", update.update_id)
            if self._stopped is not None and not self._stopped.done():
                self._stopped.set_exception(exc)  # run() fails; the manager restarts it
            hold = True
        if hold:
            # Not acknowledged: the Updater advances its offset only after `put` returns,
            # and `updater.stop()` cancels us here, so Telegram delivers it again later.
            await asyncio.get_running_loop().create_future()

    async def _receive(self, update: Update) -> bool:
        """Take one update; True if it must not be acknowledged (intake is closed)."""
        message, bot = update.message, self._sender.bot
        if message is None or message.from_user is None or bot is None:
            return False
        if inbound.for_another_bot(message, bot.bot):
            return False
        try:
            received = await self._convert(message, bot)
        except DeliveryError as exc:  # a download failed for good: take it again later
            raise RuntimeError(f"could not download a file from Telegram: {exc}") from exc
        outcome = Intake.REFUSED
        if received.message is not None:
            outcome = await self.intake(received.message)
        if outcome is not Intake.ACCEPTED and received.saved:
            await asyncio.to_thread(_remove, received.saved)
        addressed = received.message is None and inbound.is_addressed(message, bot.bot)
        if received.refusals and (outcome is Intake.ACCEPTED or addressed):
            await self._notify(message, "\n".join(received.refusals))
        return outcome is Intake.CLOSED

    async def _convert(self, message: Message, bot: Bot) -> _Received:
        me = bot.bot
        addressed = inbound.is_addressed(message, me)
        private = message.chat.type == "private"
        policy = self._config.group_policy
        # Files nobody will read are not downloaded (the gate refuses those messages).
        wanted = private or (policy == "open" or (policy == "mention" and addressed))
        received = _Received(None)
        attachments = []
        for remote in inbound.remote_files(message) if wanted else []:
            data = await inbound.download(bot, remote, self._inbox, self._sender.retry)
            if data is None:
                received.refusals.append(remote.refusal(self._inbox.max_bytes))
                continue
            path = await save_file(self._inbox, remote.name, data)
            received.saved.append(path)
            attachments.append(Attachment(remote.kind, path, remote.mime_type, len(data)))
        text = inbound.text_without_mentions(message, me)
        notes = "\n".join(f"({line})" for line in received.refusals)
        if text or attachments:
            assert message.from_user is not None
            received.message = InboundMessage(
                chat=inbound.chat_ref(message),
                sender_id=str(message.from_user.id),
                text=f"{text}\n\n{notes}".strip() if notes else text,
                message_id=inbound.message_key(message),
                sender_name=inbound.sender_name(message.from_user),
                is_private=private,
                addressed=addressed,
                attachments=tuple(attachments),
                received_at=message.date,
            )
        return received

    async def _notify(self, message: Message, text: str) -> None:
        chat = inbound.chat_ref(message)
        try:
            await self._sender.send(chat, _escape(text), reply_to=message.message_id)
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
                and stream.message_id is not None
                and await self._sender.edit(item.chat, stream.message_id, chunks[0])
            )
            if not edited:
                first = index == 0
                await self._sender.send(item.chat, chunks[index], reply_to=reply_to if first else None)
            self._progress[id(item)] = (item, index + 1)
        self._progress.pop(id(item), None)
        if item.stream_id:
            self._streams.pop(item.stream_id, None)
            _remember(self._finished, item.stream_id, None)

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
                sent = await self._sender.send(update.chat, chunks[0], reply_to=reply_to, retry=ONCE)
                _remember(self._streams, update.stream_id, _Stream(sent, chunks[0], now))
            elif state.message_id is not None and state.shown != chunks[0]:
                if now - state.at < self._stream_interval:
                    return  # the final message is exact; skipped updates are not missed
                state.at, state.shown = now, chunks[0]
                if not await self._sender.edit(update.chat, state.message_id, chunks[0], retry=ONCE):
                    state.message_id = None
        except DeliveryError as exc:
            logger.debug("telegram stream update skipped: {}", exc)

    async def _set_typing(self, signal: Typing) -> None:
        """One indicator per chat while any turn runs there."""
        current = self._typing.get(signal.chat)
        if signal.active:
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


def _remember(cache: OrderedDict[str, Any], key: str, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > KEEP_STREAMS:
        cache.popitem(last=False)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _polling_error(exc: TelegramError) -> None:
    # PTB retries by itself with backoff (up to 30 s); one line, not a traceback each time.
    logger.warning("telegram polling failed, retrying: {}", exc)
