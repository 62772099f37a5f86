"""REST calls to Discord with nanobot's error semantics.

discord.py already waits out rate limits (429, up to five tries, longer waits than
`max_ratelimit_timeout` refused) and retries 5xx; whatever still fails is classified here,
in one place (`classify`):

| kind      | Discord answered                                    | what is done                |
|-----------|-----------------------------------------------------|-----------------------------|
| transient | 429 or 5xx after discord.py's retries, a network    | DeliveryError: the manager  |
|           | error or timeout, a garbled answer, 401 (the        | tries again, later          |
|           | token, not the message)                             |                             |
| reference | 400 50035 on `message_reference`, 160002 (may not   | posted without the reply    |
|           | read the history it replies to)                     |                             |
| length    | 400 50035 on `content` (too long as Discord counts) | shorter parts               |
| closed    | 403 50007 (cannot message this user), 403 50001     | Undeliverable, chat closed: |
|           | (no access: the bot was removed), 404 10003 (the    | nothing more goes there     |
|           | channel is gone)                                    | until it writes again       |
| refused   | any other 4xx (50006 empty message, 50013 missing   | Undeliverable: given up at  |
|           | permissions, 50083 archived thread, ...)            | once                        |

Nothing sent can ping anyone but the person replied to: every call names its
`allowed_mentions`, so model output with @everyone, @here, `<@id>` or `<@&role>` stays text.

Buttons go out as one action row of message components whose `custom_id` is the button's
data. discord.py's views are used only to build them: every view is stopped before it is
sent, so discord.py keeps none (they would pile up, one per card, for good) and calls no
callback; a press is taken by the channel's own interaction handler, which works as well
after a restart. A chat named `@<user id>` (`ChatRef.direct`) is that user's DM channel,
opened once and remembered.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from typing import Any, Literal, TypeVar

import aiohttp
import discord
from loguru import logger

from nanobot.bus.events import Button, ChatRef
from nanobot.channels.base import DeliveryError, Undeliverable
from nanobot.channels.render import split_discord

T = TypeVar("T")

QUIET = discord.AllowedMentions.none()
REPLY_PING = discord.AllowedMentions(everyone=False, users=False, roles=False, replied_user=True)

Kind = Literal["transient", "reference", "length", "closed", "refused"]
_CLOSED = frozenset({50007, 50001, 10003})  # cannot message the user, no access, no channel
_NO_HISTORY = 160002  # may not read the message history, so may not reply to a message
_INVALID_FORM = 50035
SPLITS = 3  # times a message Discord finds too long is halved before it is given up
DMS_KEPT = 1024  # users whose DM channel id is remembered


def classify(exc: Exception) -> Kind:
    """What a failed REST call means for the message (see the module docstring)."""
    if isinstance(exc, discord.DiscordServerError | discord.InvalidData) or (
        isinstance(exc, discord.HTTPException) and exc.status in (401, 429)
    ):
        return "transient"  # InvalidData: an answer discord.py could not read
    if isinstance(exc, discord.HTTPException):
        return _refusal(exc.code, exc.text)
    # RateLimited (a wait too long to make), aiohttp.ClientError, OSError, TimeoutError
    return "refused" if isinstance(exc, discord.ClientException) else "transient"


def _refusal(code: int, text: str) -> Kind:
    """The kind of a 4xx by its JSON error code (and, for 50035, the field it names)."""
    if code in _CLOSED:
        return "closed"
    if code == _NO_HISTORY or (code == _INVALID_FORM and "In message_reference" in text):
        return "reference"
    if code == _INVALID_FORM and "In content" in text:
        return "length"
    return "refused"


async def attempt(call: Awaitable[T], what: str) -> T:
    """`call`, with its failures as DeliveryError: `Undeliverable` unless transient (the
    discord.py exception is its `__cause__`, for the caller's other forms of the message)."""
    try:
        return await call
    except (discord.DiscordException, aiohttp.ClientError, OSError, TimeoutError) as exc:
        kind = classify(exc)
        if kind == "transient":
            if isinstance(exc, discord.HTTPException):
                raise DeliveryError(f"{what} failed after retries: {exc}") from exc
            raise DeliveryError(f"{what}: {exc!r}") from exc
        raise Undeliverable(f"Discord refused {what}: {exc}", chat_closed=kind == "closed") from exc


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def view(buttons: Sequence[Button]) -> discord.ui.View | None:
    """The buttons as one row of components (None: none). The view is stopped at once: it
    only carries the components (see the module docstring)."""
    if not buttons:
        return None
    row = discord.ui.View(timeout=None)
    for button in buttons:
        style = (
            discord.ButtonStyle.danger
            if button.label.startswith("Deny")
            else discord.ButtonStyle.secondary
        )
        row.add_item(discord.ui.Button(label=button.label, custom_id=button.data, style=style))
    row.stop()
    return row


class Sender:
    """Sends and edits messages. `client` is None while disconnected."""

    def __init__(self) -> None:
        self.client: discord.Client | None = None
        self._dms: OrderedDict[str, int] = OrderedDict()  # user id → DM channel id

    async def _channel(self, chat: ChatRef) -> discord.PartialMessageable:
        client = self.client
        if client is None or client.is_closed():
            raise DeliveryError("discord is not connected")
        user = chat.direct_user
        channel_id = _number(chat.chat_id) if user is None else await self._dm(client, user)
        if channel_id is None:
            raise Undeliverable(f"not a Discord channel id: {chat.chat_id!r}")
        return client.get_partial_messageable(channel_id)

    async def _dm(self, client: discord.Client, user: str) -> int:
        """The id of the DM channel with `user`, opened the first time it is asked for."""
        known = self._dms.get(user)
        if known is None:
            user_id = _number(user)
            if user_id is None:
                raise Undeliverable(f"not a Discord user id: {user!r}")
            dm = await attempt(client.create_dm(discord.Object(user_id)), "opening a DM")
            known = dm.id
        self._dms[user] = known
        self._dms.move_to_end(user)
        while len(self._dms) > DMS_KEPT:
            self._dms.popitem(last=False)
        return known

    async def send(
        self,
        chat: ChatRef,
        text: str,
        *,
        reply_to: str | None = None,
        buttons: Sequence[Button] = (),
    ) -> int:
        """Post `text` (at most 2000 characters), with `buttons` under it; returns the new
        message's id (if it went out in parts: the first one's, or the last one's, which
        carries the buttons, when there are buttons). With `reply_to` it answers that
        message (pinging only its author), or is posted plainly when that message is gone
        or may not be replied to. Raises DeliveryError (`Undeliverable`: refused for good)."""
        channel = await self._channel(chat)
        return await self._send(channel, text, _number(reply_to), tuple(buttons), SPLITS)

    async def _send(
        self,
        channel: discord.PartialMessageable,
        text: str,
        reply_to: int | None,
        buttons: tuple[Button, ...],
        splits: int,
    ) -> int:
        try:
            return await self._post(channel, text, reply_to, buttons)
        except Undeliverable as exc:
            kind = classify(exc.__cause__) if isinstance(exc.__cause__, Exception) else None
            if kind == "reference" and reply_to is not None:
                logger.info("discord: posting plainly, not as a reply ({})", exc)
                return await self._send(channel, text, None, buttons, splits)
            parts = split_discord(text, max(64, len(text) // 2)) if kind == "length" else []
            if not splits or len(parts) < 2:
                raise
            logger.warning("discord: a message was too long ({}); sending it in parts", exc)
        first: int | None = None
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            sent = await self._send(channel, part, reply_to, buttons if last else (), splits - 1)
            first, reply_to = first or sent, None
        assert first is not None
        return sent if buttons else first

    async def _post(
        self,
        channel: discord.PartialMessageable,
        text: str,
        reply_to: int | None,
        buttons: tuple[Button, ...],
    ) -> int:
        options: dict[str, Any] = {"allowed_mentions": QUIET}
        if reply_to is not None:
            options["reference"] = discord.MessageReference(
                message_id=reply_to, channel_id=channel.id, fail_if_not_exists=False
            )
            options["allowed_mentions"] = REPLY_PING
        if buttons:
            options["view"] = view(buttons)
        call = channel.send(text, **options)
        return (await attempt(call, "sending a message")).id

    async def send_file(
        self,
        chat: ChatRef,
        data: bytes,
        filename: str,
        *,
        text: str | None = None,
        reply_to: str | None = None,
    ) -> int:
        """Post `data` as an attachment named `filename` (a spoken reply's audio, which
        Discord shows with a player), with `text` (at most 2000 characters) above it;
        returns the message's id. With `reply_to` as `send`. Raises DeliveryError
        (`Undeliverable`: refused for good, a file too large for the server included)."""
        channel = await self._channel(chat)
        number = _number(reply_to)
        for reference in (number, None) if number is not None else (None,):
            options: dict[str, Any] = {"allowed_mentions": QUIET}
            if reference is not None:
                options["reference"] = discord.MessageReference(
                    message_id=reference, channel_id=channel.id, fail_if_not_exists=False
                )
                options["allowed_mentions"] = REPLY_PING
            upload = discord.File(io.BytesIO(data), filename=filename)
            try:
                sent = await attempt(channel.send(text, file=upload, **options), "sending a file")
            except Undeliverable as exc:
                cause = exc.__cause__
                if reference is None or not isinstance(cause, Exception):
                    raise
                if classify(cause) != "reference":
                    raise
                logger.info("discord: posting a file plainly, not as a reply ({})", exc)
                continue
            return sent.id
        raise AssertionError("unreachable: the last try raises or returns")

    async def edit(
        self,
        chat: ChatRef,
        message_id: int,
        text: str,
        *,
        buttons: Sequence[Button] | None = None,
    ) -> bool:
        """Make message `message_id` show `text`, and `buttons` under it (None: leave them
        as they are; empty: remove them); False when it cannot (deleted, not ours,
        refused). Raises DeliveryError when a transient failure outlived discord.py's
        retries, Undeliverable when the chat is closed."""
        message = (await self._channel(chat)).get_partial_message(message_id)
        if buttons is None:
            call = message.edit(content=text, allowed_mentions=QUIET)
        else:
            call = message.edit(content=text, allowed_mentions=QUIET, view=view(buttons))
        try:
            await attempt(call, "editing a message")
        except Undeliverable as exc:
            if exc.chat_closed:
                raise
            logger.info("discord could not edit message {}: {}", message_id, exc)
            return False
        return True

    async def typing(self, chat: ChatRef) -> None:
        """One typing signal (Discord shows it for about 10 s, or until we post). Never raises."""
        try:
            await attempt((await self._channel(chat)).typing(), "typing")
        except DeliveryError as exc:
            logger.debug("discord typing signal failed: {}", exc)
