"""Discord messages as nanobot sees them: which chat, whether the bot is addressed, the text
without the bot's mention, and its files (fetched within the inbox's limit).

A thread has its own channel id on Discord, so it is simply its own chat (and session):
`ChatRef("discord", <thread id>)`, with no `thread_id`. Sending to that id posts in the thread.
"""

from __future__ import annotations

import re
from typing import Literal

import aiohttp
import discord
from loguru import logger

from nanobot.bus.events import Attachment, ChatRef
from nanobot.channels.base import InboxPolicy, safe_filename, save_file

CHANNEL = "discord"
MB = 1024 * 1024

FileKind = Literal["photo", "document", "voice", "audio", "video"]

# Only what a person wrote; joins, pins, thread-created notices and the like are not.
_CONVERSATION = (discord.MessageType.default, discord.MessageType.reply)
_USER_MENTION = re.compile(r"<@!?(\d+)>")


def chat_ref(message: discord.Message) -> ChatRef:
    return ChatRef(CHANNEL, str(message.channel.id))


def is_conversation(message: discord.Message) -> bool:
    """Written by a person (not a bot, webhook or the system), so possibly for us."""
    return (
        not message.author.bot
        and not message.author.system
        and message.webhook_id is None
        and message.type in _CONVERSATION
    )


def is_private(message: discord.Message) -> bool:
    return message.guild is None


def _bot_role(message: discord.Message) -> discord.Role | None:
    """The bot's own managed role: Discord's autocomplete sometimes picks it for "@bot"."""
    return message.guild.self_role if message.guild is not None else None


def is_addressed(message: discord.Message, me: discord.abc.Snowflake) -> bool:
    """A DM, a mention of the bot (or of its own role), or a reply to one of its messages.

    Not `ClientUser.mentioned_in`: that counts @everyone and @here, which are not for us.
    """
    if is_private(message):
        return True
    if any(user.id == me.id for user in message.mentions):
        return True
    role = _bot_role(message)
    if role is not None and any(r.id == role.id for r in message.role_mentions):
        return True
    reference = message.reference
    if reference is None or reference.type is not discord.MessageReferenceType.reply:
        return False  # a forward of the bot's message is not talking to it
    replied = reference.resolved
    if not isinstance(replied, discord.Message):
        replied = reference.cached_message
    return replied is not None and replied.author.id == me.id


def text_for_agent(message: discord.Message, me: discord.abc.Snowflake) -> str:
    """The content without the bot's mentions (`<@ID>`, `<@!ID>`, its role), and with other
    users' mentions shown as `@name`, as the sender saw them."""
    names = {user.id: user.display_name for user in message.mentions}

    def user(match: re.Match[str]) -> str:
        user_id = int(match.group(1))
        return f"@{names[user_id]}" if user_id in names and user_id != me.id else match.group()

    text = _USER_MENTION.sub(user, message.content)
    role = _bot_role(message)
    mine = rf"<@!?{me.id}>" + (rf"|<@&{role.id}>" if role is not None else "")
    pieces = re.split(mine, text)
    text = pieces[0]
    for piece in pieces[1:]:  # "hey <@bot>, look" reads "hey, look"; "<@bot> hi" reads "hi"
        before, after = text.rstrip(" "), piece.lstrip(" ")
        if not before:
            after = after.lstrip(",:").lstrip(" ")
        space = " " if before and after and after[0] not in ",.;:!?\n" else ""
        text = before + space + after
    return text.strip()


def file_kind(attachment: discord.Attachment) -> FileKind:
    if attachment.is_voice_message():
        return "voice"
    kind = (attachment.content_type or "").split("/", 1)[0]
    if kind == "image":
        return "photo"
    if kind == "audio":
        return "audio"
    return "video" if kind == "video" else "document"


def file_name(attachment: discord.Attachment) -> str:
    return safe_filename(attachment.filename, f"attachment_{attachment.id}")


def _size(count: int) -> str:
    if count >= MB:
        return f"{count / MB:.3g} MB"
    return f"{count / 1024:.3g} KB" if count >= 1024 else f"{count} bytes"


def too_large(attachment: discord.Attachment, limit: int) -> str:
    return (
        f"I can't take {file_name(attachment)} ({_size(attachment.size)}): "
        f"files may be at most {_size(limit)}."
    )


async def fetch_files(
    message: discord.Message, inbox: InboxPolicy
) -> tuple[list[Attachment], list[str]]:
    """The attachments, saved under the inbox, and what to tell the sender about the rest.
    A file larger than the inbox allows is never downloaded."""
    limit = inbox.max_bytes
    saved: list[Attachment] = []
    refusals: list[str] = []
    for remote in message.attachments:
        name = file_name(remote)
        if remote.size > limit:
            refusals.append(too_large(remote, limit))
            continue
        try:
            data = await remote.read()
        except (discord.HTTPException, aiohttp.ClientError, OSError, TimeoutError) as exc:
            logger.warning("discord: could not download {}: {}", name, exc)
            refusals.append(f"I could not download {name}; please send it again.")
            continue
        if len(data) > limit:  # it was announced smaller
            refusals.append(too_large(remote, limit))
            continue
        path = await save_file(inbox, name, data)
        saved.append(Attachment(file_kind(remote), path, remote.content_type, len(data)))
    return saved, refusals
