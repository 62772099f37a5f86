"""Sending to Telegram: HTML chunks that always get through, and buttons.

`Sender` sends and edits one rendered chunk, trying the other forms before giving up (as
`_telegram_retry.classify` tells a failure's kind: markup → plain text, length → shorter
parts), with an inline keyboard of buttons where it is given some (on the last message, if
the chunk goes out in pieces); it sends voice notes, their caption in the same forms (or,
too long after all, as a message after the note); it answers button presses, once and best
effort.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from loguru import logger
from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup, ReplyParameters
from telegram.constants import ParseMode
from telegram.error import BadRequest, TelegramError
from telegram.warnings import PTBUserWarning

from nanobot.bus.events import Button, ChatRef
from nanobot.channels._telegram_retry import ONCE, Retry, attempt, classify, retry_after_seconds
from nanobot.channels.base import DeliveryError, Undeliverable
from nanobot.channels.render import plain_text, split_plain, split_telegram, visible_length

# Retry and retry_after_seconds are `_telegram_retry`'s; tests import them from here too.
__all__ = ["Retry", "Sender", "button_refusal", "retry_after_seconds"]

T = TypeVar("T")

SPLITS = 3  # times a chunk Telegram finds too long is halved before it goes as plain text
IN_FLIGHT = 32  # Bot API requests a Sender makes at once
BUTTON_DATA = 64  # bytes of callback_data Telegram takes
ANSWER_TEXT = 200  # characters of a press's answer Telegram shows
CAPTION_LIMIT = 1024  # visible characters (UTF-16 units) of a media message's caption


# `post` calls known methods through `Bot.do_api_request`, which warns that each has a
# method of its own; it knows, and passes every parameter explicitly (no `Defaults`).
warnings.filterwarnings(
    "ignore",
    message=r"Please use 'Bot\.(sendMessage|editMessageText)' instead",
    category=PTBUserWarning,
)


async def post(bot: Bot, method: str, params: Mapping[str, object]) -> object:
    """Call Bot API `method`; its result as Telegram sent it (a dict for a message).

    python-telegram-bot's own `send_message` and `edit_message_text` build a `Message` from
    the reply, of which only the id is needed: in a burst of replies that parsing took a
    tenth of the gateway's CPU. Errors are PTB's, as with its own methods.
    """
    return await bot.do_api_request(method, {k: v for k, v in params.items() if v is not None})


def not_modified(exc: BadRequest) -> bool:
    return "message is not modified" in exc.message.lower()


def chat_id_of(chat: ChatRef) -> int | str:
    """The chat's id for the Bot API. `@<user id>` (`ChatRef.direct`) is the private chat
    with that user, which has the user's id; any other `@name` is a public chat's username."""
    user = chat.direct_user
    key = user if user is not None and user.isdigit() else chat.chat_id
    return int(key) if key.lstrip("-").isdigit() else key


def button_refusal(buttons: Sequence[Button]) -> str | None:
    """Why Telegram would refuse these buttons (None: it takes them)."""
    for button in buttons:
        size = len(button.data.encode())
        if not size or size > BUTTON_DATA:
            return (
                f"button {button.label!r} carries {size} bytes of data; "
                f"Telegram takes 1 to {BUTTON_DATA}"
            )
        if not button.label.strip():
            return "a button has no label"
    return None


def keyboard(buttons: Sequence[Button]) -> InlineKeyboardMarkup | None:
    """The buttons one under another (their labels are read in full on a phone); None for
    none."""
    rows = [[InlineKeyboardButton(b.label, callback_data=b.data)] for b in buttons]
    return InlineKeyboardMarkup(rows) if rows else None


def thread_of(chat: ChatRef) -> int | None:
    return int(chat.thread_id) if chat.thread_id else None


class Sender:
    """Sends and edits rendered chunks in any chat. `bot` is None while disconnected.

    At most `in_flight` of its requests are made at once, the others wait their turn: a
    burst of replies reuses a few connections instead of opening hundreds. A request holds
    its turn only while it is made, never while a retry waits (a chat that backs off for
    minutes takes nothing from the others).
    """

    def __init__(self, retry: Retry, *, in_flight: int = IN_FLIGHT) -> None:
        self.retry = retry
        self.bot: Bot | None = None
        self._in_flight = asyncio.Semaphore(in_flight)

    async def _request(self, call: Callable[[], Awaitable[T]]) -> T:
        async with self._in_flight:
            return await call()

    def _bot(self) -> Bot:
        if self.bot is None:
            raise DeliveryError("telegram is not connected")
        return self.bot

    async def send(
        self,
        chat: ChatRef,
        html: str,
        *,
        reply_to: int | None,
        retry: Retry | None = None,
        buttons: Sequence[Button] = (),
    ) -> int:
        """Send one chunk of at most 4096 visible characters, with `buttons` under it;
        returns the message id. A chunk Telegram cannot take as it is goes out in another
        form (see the module docstring), possibly in pieces: then the id is the first
        piece's, or with buttons the last piece's (which shows them).

        Raises:
            Undeliverable: Telegram refused it in every form, or the chat is closed.
            DeliveryError: a transient failure outlived the retries.
        """
        markup = keyboard(buttons)
        sent = await self._send_html(chat, html, reply_to, retry, SPLITS, markup=markup)
        return sent[-1] if markup is not None else sent[0]

    async def _send_html(
        self,
        chat: ChatRef,
        html: str,
        reply_to: int | None,
        retry: Retry | None,
        splits: int,
        *,
        markup: InlineKeyboardMarkup | None,
    ) -> list[int]:
        """The ids of the messages the chunk went out as, in order (at least one)."""
        try:
            return [await self._send(chat, html, ParseMode.HTML, reply_to, retry, markup=markup)]
        except BadRequest as exc:
            kind = classify(exc)
            if kind == "refused":
                raise Undeliverable(f"Telegram refused a message: {exc}") from exc
            logger.warning("telegram refused a chunk ({}); sending it in another form", exc)
        length = visible_length(html)
        parts = split_telegram(html, max(2, length // 2)) if kind == "length" and splits else []
        if len(parts) < 2:
            return await self._send_plain(chat, html, reply_to, retry, markup=markup)
        sent: list[int] = []
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            keys = markup if last else None
            sent += await self._send_html(chat, part, reply_to, retry, splits - 1, markup=keys)
            reply_to = None
        return sent

    async def _send_plain(
        self,
        chat: ChatRef,
        html: str,
        reply_to: int | None,
        retry: Retry | None,
        *,
        markup: InlineKeyboardMarkup | None,
    ) -> list[int]:
        pieces = split_plain(plain_text(html))
        sent: list[int] = []
        for index, piece in enumerate(pieces):
            keys = markup if index == len(pieces) - 1 else None
            try:
                sent.append(await self._send(chat, piece, None, reply_to, retry, markup=keys))
            except BadRequest as exc:
                raise Undeliverable(f"Telegram refused a message: {exc}") from exc
            reply_to = None
        if not sent:
            raise Undeliverable("a chunk had no visible text")
        return sent

    async def _send(
        self,
        chat: ChatRef,
        text: str,
        parse_mode: str | None,
        reply_to: int | None,
        retry: Retry | None,
        *,
        markup: InlineKeyboardMarkup | None = None,
    ) -> int:
        bot = self._bot()
        reply = (
            None
            if reply_to is None
            else ReplyParameters(reply_to, allow_sending_without_reply=True)
        )
        params = {
            "chat_id": chat_id_of(chat),
            "text": text,
            "parse_mode": parse_mode,
            "message_thread_id": thread_of(chat),
            "reply_parameters": reply,
            "reply_markup": markup,
        }
        sent = await attempt(
            lambda: self._request(lambda: post(bot, "sendMessage", params)),
            retry or self.retry,
            what="sendMessage",
            resends=True,
        )
        message_id = sent.get("message_id") if isinstance(sent, dict) else None
        if not isinstance(message_id, int):
            raise DeliveryError(f"sendMessage: Telegram answered {sent!r}, not a message")
        return message_id

    async def send_voice(
        self,
        chat: ChatRef,
        audio: bytes,
        filename: str,
        *,
        caption: str | None,
        reply_to: int | None,
        retry: Retry | None = None,
    ) -> int:
        """Send `audio` (OGG/Opus, or MP3) as a voice note with `caption` (a chunk of at
        most `CAPTION_LIMIT` visible characters) under it; returns its id. A caption
        Telegram cannot take as HTML goes as plain text; one it finds too long after all
        goes as a message right after the note.

        Raises:
            Undeliverable: Telegram refused the voice note (the user takes none, say), or
                the chat is closed.
            DeliveryError: a transient failure outlived the retries.
        """
        forms: list[tuple[str | None, str | None]] = [(None, None)]
        if caption:
            forms = [(caption, ParseMode.HTML), (plain_text(caption), None)]
        for text, mode in forms:
            try:
                return await self._voice(
                    chat,
                    audio,
                    filename,
                    caption=text,
                    parse_mode=mode,
                    reply_to=reply_to,
                    retry=retry,
                )
            except BadRequest as exc:
                kind, said = classify(exc), exc.message.lower()
                if kind == "markup" and mode is not None:
                    logger.warning("telegram refused a caption ({}); using plain text", exc)
                    continue
                if caption is None or "caption" not in said or "too long" not in said:
                    raise Undeliverable(f"Telegram refused a voice note: {exc}") from exc
                logger.warning("telegram found a caption too long ({}); sent after it", exc)
                break
        sent = await self._voice(
            chat, audio, filename, caption=None, parse_mode=None, reply_to=reply_to, retry=retry
        )
        assert caption is not None  # only a caption refused as too long comes here
        await self.send(chat, caption, reply_to=None, retry=retry)
        return sent

    async def _voice(
        self,
        chat: ChatRef,
        audio: bytes,
        filename: str,
        *,
        caption: str | None,
        parse_mode: str | None,
        reply_to: int | None,
        retry: Retry | None,
    ) -> int:
        bot = self._bot()
        reply = (
            None
            if reply_to is None
            else ReplyParameters(reply_to, allow_sending_without_reply=True)
        )
        sent = await attempt(
            lambda: self._request(
                lambda: bot.send_voice(
                    chat_id_of(chat),
                    audio,
                    caption=caption,
                    parse_mode=parse_mode,
                    message_thread_id=thread_of(chat),
                    reply_parameters=reply,
                    filename=filename,
                )
            ),
            retry or self.retry,
            what="sendVoice",
            resends=True,
        )
        return sent.message_id

    async def edit(
        self,
        chat: ChatRef,
        message_id: int,
        html: str,
        *,
        retry: Retry | None = None,
        buttons: Sequence[Button] = (),
    ) -> bool:
        """Make message `message_id` show `html` (as plain text if Telegram cannot take the
        markup) and exactly `buttons` (none: its keyboard is removed); False when it cannot
        be edited (deleted, too old, not ours, refused in either form). Unchanged text and
        buttons count as done. Raises DeliveryError when a transient failure outlived the
        retries, Undeliverable when the chat is closed."""
        bot = self._bot()
        markup = keyboard(buttons)

        async def edit(text: str, mode: str | None) -> object:
            params = {
                "chat_id": chat_id_of(chat),
                "message_id": message_id,
                "text": text,
                "parse_mode": mode,
                "reply_markup": markup,  # without one, Telegram removes the keyboard
            }
            return await self._request(lambda: post(bot, "editMessageText", params))

        for text, mode in ((html, ParseMode.HTML), (plain_text(html), None)):
            try:
                await attempt(
                    lambda: edit(text, mode),  # noqa: B023 - awaited within this iteration
                    retry or self.retry,
                    what="editMessageText",
                )
            except BadRequest as exc:
                if not_modified(exc):
                    return True
                if classify(exc) == "refused" or mode is None:
                    logger.info("telegram could not edit message {}: {}", message_id, exc)
                    return False
                logger.warning("telegram refused an edit ({}); using plain text", exc)
                continue
            return True
        return False

    async def answer(self, press: str, text: str | None = None) -> None:
        """Answer button press `press`, showing `text` (its first 200 characters) to the one
        who pressed only; with no text, the press just stops waiting. Tried once: a press
        answered before, too old or unknown is only logged (at debug). Never raises."""
        shown = text[:ANSWER_TEXT] if text else None
        try:
            await attempt(
                lambda: self._request(lambda: self._bot().answer_callback_query(press, text=shown)),
                ONCE,
                what="answerCallbackQuery",
            )
        except (DeliveryError, TelegramError) as exc:
            logger.debug("telegram: button press {} not answered: {}", press, exc)

    async def typing(self, chat: ChatRef) -> None:
        """One "typing…" signal (Telegram shows it for about 5 s). Never raises."""
        try:
            await attempt(
                lambda: self._request(
                    lambda: self._bot().send_chat_action(
                        chat_id_of(chat), "typing", message_thread_id=thread_of(chat)
                    )
                ),
                ONCE,
                what="sendChatAction",
            )
        except (DeliveryError, TelegramError) as exc:
            logger.debug("telegram typing signal failed: {}", exc)
