"""REST calls to Discord with nanobot's error semantics.

discord.py already waits out rate limits (429, up to five tries, longer waits than
`max_ratelimit_timeout` refused) and retries 5xx; whatever still fails becomes
`DeliveryError` here, once. A missing channel or missing permissions fails at once.
Nothing sent can ping anyone but the person replied to: every call names its
`allowed_mentions`, so model output with @everyone, @here, `<@id>` or `<@&role>` stays text.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import aiohttp
import discord
from loguru import logger

from nanobot.bus.events import ChatRef
from nanobot.channels.base import DeliveryError

T = TypeVar("T")

QUIET = discord.AllowedMentions.none()
REPLY_PING = discord.AllowedMentions(everyone=False, users=False, roles=False, replied_user=True)


async def attempt(call: Awaitable[T], what: str) -> T:
    """`call`, with its failures as DeliveryError (discord.NotFound and Forbidden are
    re-raised by `edit`, which handles them itself)."""
    try:
        return await call
    except (discord.NotFound, discord.Forbidden) as exc:
        raise DeliveryError(f"Discord refused {what}: {exc}") from exc
    except discord.HTTPException as exc:
        raise DeliveryError(f"{what} failed after retries: {exc}") from exc
    except (discord.RateLimited, discord.ClientException) as exc:
        raise DeliveryError(f"{what}: {exc}") from exc
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise DeliveryError(f"{what}: network error: {exc!r}") from exc


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


class Sender:
    """Sends and edits messages. `client` is None while disconnected."""

    def __init__(self) -> None:
        self.client: discord.Client | None = None

    def _channel(self, chat: ChatRef) -> discord.PartialMessageable:
        client = self.client
        if client is None or client.is_closed():
            raise DeliveryError("discord is not connected")
        channel_id = _number(chat.chat_id)
        if channel_id is None:
            raise DeliveryError(f"not a Discord channel id: {chat.chat_id!r}")
        return client.get_partial_messageable(channel_id)

    async def send(self, chat: ChatRef, text: str, *, reply_to: str | None = None) -> int:
        """Post `text` (at most 2000 characters); returns the new message's id. With
        `reply_to` it answers that message (pinging only its author), or is posted plainly
        when that message is gone."""
        channel = self._channel(chat)
        reference = None
        if (message_id := _number(reply_to)) is not None:
            reference = discord.MessageReference(
                message_id=message_id, channel_id=channel.id, fail_if_not_exists=False
            )
        if reference is None:
            call = channel.send(text, allowed_mentions=QUIET)
        else:
            call = channel.send(text, reference=reference, allowed_mentions=REPLY_PING)
        return (await attempt(call, "sending a message")).id

    async def edit(self, chat: ChatRef, message_id: int, text: str) -> bool:
        """Make message `message_id` show `text`; False when it can no longer be edited
        (deleted, or not ours). Other failures raise DeliveryError."""
        message = self._channel(chat).get_partial_message(message_id)
        try:
            await attempt(message.edit(content=text, allowed_mentions=QUIET), "editing a message")
        except DeliveryError as exc:
            if isinstance(exc.__cause__, discord.NotFound | discord.Forbidden):
                logger.info("discord could not edit message {}: {}", message_id, exc)
                return False
            raise
        return True

    async def typing(self, chat: ChatRef) -> None:
        """One typing signal (Discord shows it for about 10 s, or until we post). Never raises."""
        try:
            await attempt(self._channel(chat).typing(), "typing")
        except DeliveryError as exc:
            logger.debug("discord typing signal failed: {}", exc)
