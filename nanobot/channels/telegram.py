"""The Telegram channel: long polling or a webhook in, rendered HTML out.

In: our own loop on `Bot.getUpdates` (`_telegram_poll.Poller`), or Telegram's POSTs to the
webhook (`_telegram_webhook.Webhook`, when `webhook.url` is set), hands every update to
`_take`, which turns it into an `InboundMessage` (its files fetched only if `intake` admits
the sender) and hands that to `intake`, which journals it; an update is acknowledged to
Telegram (the poll's offset, the webhook's 200) only once `_take` has returned for it.
Chats are taken concurrently, each in order. While a store failure pauses intake, polled
updates wait unacknowledged (`_telegram_poll`), and the webhook answers 503 (Telegram sends
again later). The files of a message intake does not take are deleted. A button press
(`callback_query`) is a message
with `press` set, taken the same way; one the gate does not take is answered here at once,
the others by an `answer` from the agent's side. In a cluster one member at a time polls,
while it holds the channel's intake `role` (a second poller would be refused with 409
Conflict); a webhook is served by every member, and every member delivers.

Out: Markdown is rendered to Telegram HTML and split into messages of at most 4096 visible
characters; a reply that was streamed is edited in place, at most about once a second. A
spoken reply is a voice note (sendVoice, OGG/Opus), its text the caption where it fits in
1024 characters, else in messages right after. A
card's buttons are an inline keyboard under its last message; a message that `replaces`
another edits it (editMessageText: the keyboard goes with the new text, or is removed), or is
posted anew when that message can no longer be edited.
"""

from __future__ import annotations

import asyncio
import html
import json
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Final, Protocol

from loguru import logger
from telegram import Bot, Message, Update
from telegram.error import BadRequest, InvalidToken, NetworkError, TelegramError

from nanobot.bus.events import (
    Button,
    ChatRef,
    InboundMessage,
    Outbound,
    OutboundMessage,
    StreamUpdate,
    Typing,
)
from nanobot.channels import _telegram_inbound as inbound
from nanobot.channels._replies import Replies
from nanobot.channels._settings import BotSettings
from nanobot.channels._telegram_http import AiohttpRequest, Timeouts
from nanobot.channels._telegram_poll import Poller
from nanobot.channels._telegram_retry import ONCE, Retry
from nanobot.channels._telegram_send import CAPTION_LIMIT, Sender, button_refusal
from nanobot.channels._telegram_webhook import Webhook, WebhookSettings
from nanobot.channels._typing import DELAY as TYPING_DELAY
from nanobot.channels._typing import TypingIndicator
from nanobot.channels.base import (
    SOLO,
    Channel,
    ChannelRefused,
    ChannelUnreachable,
    DeliveryError,
    InboxPolicy,
    Intake,
    IntakePort,
    OutboxPort,
    Role,
    Undeliverable,
    discard_files,
    read_outgoing,
)
from nanobot.channels.render import split_telegram, telegram_html, visible_length

POLL_TIMEOUT = 30  # seconds a getUpdates long poll is held open by Telegram
STREAM_INTERVAL = 1.0  # seconds between two edits of a streamed reply
TYPING_INTERVAL = 4.0  # Telegram shows "typing…" for about 5 s
TAKE_ATTEMPTS = 3  # an update that cannot be read this often is skipped (logged)
# What a press the gate does not take is answered (shown to the one who pressed only).
PRESS_REFUSED: Final = {
    Intake.REFUSED: "Only an approver can decide this.",
    Intake.CLOSED: "Only an approver can decide this.",
    Intake.PAIRING: "You are not allowed to use this bot yet.",
}
# Seconds, for Bot API calls and for getUpdates (whose read timeout PTB lengthens by the poll's).
REQUEST_TIMEOUTS: Final = Timeouts(
    connect_timeout=10.0, read_timeout=20.0, write_timeout=20.0, pool_timeout=10.0
)
POLL_TIMEOUTS: Final = Timeouts(
    connect_timeout=10.0, read_timeout=10.0, write_timeout=10.0, pool_timeout=10.0
)


class TelegramSettings(BotSettings, Protocol):
    """The `channels.telegram` config section, as far as this channel reads it."""

    @property
    def webhook(self) -> WebhookSettings: ...


class _Outlet:
    """The Sender as `Replies` uses it (a `CardOutlet`): a reply names its message by the
    bus's key, and every call tries as hard as `retry` says (None: the Sender's own)."""

    def __init__(self, sender: Sender, retry: Retry | None = None) -> None:
        self._sender = sender
        self._retry = retry

    async def send(
        self, chat: ChatRef, text: str, *, reply_to: str | None, buttons: Sequence[Button] = ()
    ) -> int:
        number = inbound.message_number(reply_to)
        return await self._sender.send(
            chat, text, reply_to=number, retry=self._retry, buttons=buttons
        )

    async def edit(
        self, chat: ChatRef, message_id: int, text: str, *, buttons: Sequence[Button] = ()
    ) -> bool:
        return await self._sender.edit(chat, message_id, text, retry=self._retry, buttons=buttons)


class _Voices:
    """The Sender as `Replies` sends voice notes with it (a `VoiceOutlet`): the audio read
    from the workspace, confined to it."""

    def __init__(self, sender: Sender, inbox: InboxPolicy) -> None:
        self._sender = sender
        self._inbox = inbox

    def caption_fits(self, part: str) -> bool:
        return visible_length(part) <= CAPTION_LIMIT

    async def send_voice(
        self, chat: ChatRef, audio: Path, *, caption: str | None, reply_to: str | None
    ) -> int:
        try:
            data = await read_outgoing(self._inbox, audio)
        except OSError as exc:
            raise Undeliverable(f"the voice note {audio} cannot be read: {exc}") from exc
        number = inbound.message_number(reply_to)
        return await self._sender.send_voice(
            chat, data, audio.name, caption=caption, reply_to=number
        )


class UnreadableAnswer(Exception):
    """The Bot API answered with what the library cannot read: the channel crashes (and is
    started again), with a line naming the method and quoting the answer."""


def _quoted(answer: object, limit: int = 300) -> str:
    """An answer as JSON, cut to `limit` characters."""
    text = json.dumps(answer, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class TelegramChannel(Channel):
    """Telegram via the Bot API (long polling or a webhook). See the module docstring."""

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
        outbox: OutboxPort | None = None,
        poll_timeout: int = POLL_TIMEOUT,
        role: Role = SOLO,
    ) -> None:
        """`role`: whether this process polls (in a cluster, one member at a time does;
        every member delivers, and in webhook mode every member takes updates)."""
        super().__init__(intake)
        self._config = config
        self._role = role
        self._inbox = inbox
        self._sender = Sender(retry or Retry())
        outlet = _Outlet(self._sender)
        self._replies = Replies(
            outlet,
            _render,
            interval=stream_interval,
            name=self.name,
            best_effort=_Outlet(self._sender, ONCE),  # a stream update is tried once
            outbox=outbox,
            cards=outlet,
            voices=_Voices(self._sender, inbox),
        )
        self._typing = TypingIndicator(
            self._sender.typing, typing_interval, delay=typing_delay, name=self.name
        )
        self._poll_timeout = poll_timeout
        self._failures: dict[int, int] = {}  # update id → failed reads, across runs

    # ---- running --------------------------------------------------------------------

    def _bot(self) -> Bot:
        base = self._config.api_base.rstrip("/")
        return Bot(
            self._config.token.get_secret_value(),
            base_url=f"{base}/bot",
            base_file_url=f"{base}/file/bot",
            request=AiohttpRequest(base, pool_size=256, **REQUEST_TIMEOUTS),
            # PTB lengthens a long poll's read timeout by the poll's own.
            get_updates_request=AiohttpRequest(base, pool_size=1, **POLL_TIMEOUTS),
        )

    async def run(self, ready: Callable[[], None]) -> None:
        try:
            async with await self._signed_in() as bot:
                self._sender.bot = bot
                await self._replies.recover()
                self._typing.start()
                try:
                    logger.info("telegram: signed in as @{}", bot.username)
                    await self._serve(bot, ready)
                finally:
                    await self._typing.stop()
                    self._sender.bot = None
        except InvalidToken:  # its message quotes the token
            raise ChannelRefused(
                "channels.telegram.token was rejected by Telegram: check it with @BotFather "
                "(/mybots → API Token) and set the current one"
            ) from None
        except NetworkError as exc:  # the connection, a timeout, the server's 5xx
            if isinstance(exc, BadRequest):  # an answer, not an absence of one
                raise
            raise ChannelUnreachable(
                f"the Bot API at {self._config.api_base} did not answer: {exc}"
            ) from exc

    async def _signed_in(self) -> Bot:
        """The bot, its getMe made (PTB's `initialize`).

        Raises:
            UnreadableAnswer: getMe was answered with what the library cannot read (a Bot
                API server other than Telegram's, without a field PTB requires); the
                message names the method and quotes the answer.
            TelegramError: as `Bot.initialize` does.
        """
        bot = self._bot()
        try:
            await bot.initialize()
        except (TypeError, KeyError, ValueError) as exc:  # PTB's reading of the answer
            try:
                answer: object = await bot._post("getMe")
            except TelegramError as again:
                answer = f"asked again: {again}"
            await bot.shutdown()
            raise UnreadableAnswer(
                f"the Bot API at {self._config.api_base} answered getMe with what python-"
                f"telegram-bot cannot read ({type(exc).__name__}: {exc}): {_quoted(answer)}"
            ) from exc
        except BaseException:
            await bot.shutdown()
            raise
        return bot

    async def _serve(self, bot: Bot, ready: Callable[[], None]) -> None:
        """Take updates until cancelled: through the webhook if one is configured, else by
        polling (or until an update could not be taken: see `Poller.run`)."""
        webhook = self._config.webhook
        if webhook.url is not None:
            await Webhook(bot, self._take, webhook).run(ready)
            return
        # Connected once polling works here, or once another member is found polling.
        await self._role.hold(partial(self._poll, bot, ready), standby=ready)

    async def _poll(self, bot: Bot, ready: Callable[[], None]) -> None:
        """Poll until cancelled, or until an update could not be taken (see `Poller.run`)."""
        # getUpdates is refused while a webhook is set: one left from webhook mode goes (for
        # the whole bot: every gateway sharing it must use the same mode). Only a check: a
        # server that fails it (some Bot API emulators) is polled all the same.
        try:
            info = await bot.get_webhook_info()
        except TelegramError as exc:
            logger.warning(
                "telegram: could not check for a webhook set on the bot (getWebhookInfo: {}); "
                "polling all the same",
                exc,
            )
        else:
            if info.url:
                await bot.delete_webhook()
                logger.info("telegram: deleted the webhook to {} to poll instead", info.url)
        poller = Poller(bot, self._take, timeout=self._poll_timeout, ready=ready)
        await poller.run()  # one holding's

    async def _take(self, update: Update) -> bool:
        """Hand one update to intake; True once it may be acknowledged (see `_telegram_poll.Take`).

        False leaves it for redelivery after a restart (the gateway is stopping). Raises what
        reading it or intake raised: the run fails, Telegram delivers the update again.
        """
        try:
            received = await inbound.read(
                update, update.get_bot(), self._inbox, self.intake, self._sender.retry
            )
        except Exception:  # re-raised, unless it can never be read
            failures = self._failures.pop(update.update_id, 0) + 1
            if failures >= TAKE_ATTEMPTS:  # do not block the chat for good
                logger.exception("telegram: update {} could not be read; skipped", update.update_id)
                return True
            self._failures[update.update_id] = failures
            raise
        self._failures.pop(update.update_id, None)
        if received.press is not None:
            return await self._take_press(received.press, received.message)
        outcome = Intake.REFUSED
        try:
            if received.message is not None:  # what intake raises is never skipped
                outcome = await self.intake(received.message)
        except BaseException:  # read again, files and all, when the update comes again
            discard_files(received.saved)
            raise
        accepted = outcome is Intake.ACCEPTED
        if not accepted and received.saved:  # refused, a redelivery, or taken again later
            await asyncio.to_thread(discard_files, received.saved)
        if outcome is Intake.CLOSED:
            return False  # stopping, and a stranger's: Telegram delivers it again after restart
        # A message that was only a refused file is not handed over: say so if the bot was
        # addressed; otherwise only once the gate has let the message in.
        told = accepted or (received.message is None and received.addressed)
        if received.refusals and told and received.source is not None:
            await self._notify(received.source, "\n".join(received.refusals))
        return True

    async def _take_press(self, press: str, message: InboundMessage | None) -> bool:
        """Hand a button press to intake (as `_take`); one it does not take is answered at
        once, and one that is no message (no data, no chat) is answered with nothing."""
        if message is None:
            await self._sender.answer(press)  # the button stops waiting; nothing to decide
            return True
        outcome = await self.intake(message)
        if (refusal := PRESS_REFUSED.get(outcome)) is not None:
            await self._sender.answer(press, refusal)
        return outcome is not Intake.CLOSED  # stopping: comes again after a restart

    async def _notify(self, message: Message, text: str) -> None:
        chat = inbound.chat_ref(message)
        try:
            await self._sender.send(
                chat, html.escape(text, quote=False), reply_to=message.message_id
            )
        except DeliveryError as exc:
            logger.warning("telegram: could not tell chat {} about a file: {}", chat.chat_id, exc)

    # ---- delivering -------------------------------------------------------------------

    async def deliver(self, item: Outbound) -> str | None:
        match item:
            case Typing():
                await self._typing.update(item)
            case StreamUpdate():
                await self._replies.stream(item)
            case OutboundMessage(kind="answer"):
                if item.reply_to:
                    await self._sender.answer(item.reply_to, item.text)
            case OutboundMessage():
                if (refusal := button_refusal(item.buttons)) is not None:
                    raise Undeliverable(refusal)
                return await self._replies.send(item)
        return None


def _render(text: str) -> list[str]:
    return split_telegram(telegram_html(text))
