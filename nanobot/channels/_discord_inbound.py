"""Discord messages as nanobot sees them: which chat, whether the bot is addressed, the text
without the bot's mention, and its files (fetched within the inbox's limit); and button
presses (component interactions), acknowledged at once and kept for their answers.

A thread has its own channel id on Discord, so it is simply its own chat (and session):
`ChatRef("discord", <thread id>)`, with no `thread_id`. Sending to that id posts in the thread.
A press comes from the chat of the message it was on: a DM's channel id, even for a card
sent to `@<user id>`.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
import discord
from loguru import logger

from nanobot.bus.events import Attachment, ChatRef, InboundMessage
from nanobot.channels._discord_send import QUIET
from nanobot.channels.base import (
    InboxError,
    InboxPolicy,
    IntakePort,
    discard_files,
    not_fetched,
    safe_filename,
    save_file,
)
from nanobot.channels.render import split_discord

CHANNEL = "discord"
MB = 1024 * 1024
PRESSES_KEPT = 1024  # presses remembered for their answers (each for its token's 15 min)

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
    try:
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
            try:
                path = await save_file(inbox.of(CHANNEL, str(message.author.id)), name, data)
            except InboxError as exc:
                logger.warning("discord: could not keep {}: {}", name, exc.reason)
                refusals.append(exc.line())
                continue
            kind, seconds = file_kind(remote), remote.duration  # a voice message's length
            saved.append(Attachment(kind, path, remote.content_type, len(data), seconds))
    except BaseException:  # a file could not be saved, or the take was cancelled
        discard_files(a.path for a in saved)
        raise
    return saved, refusals


@dataclass(slots=True)
class Received:
    """A message read: what goes to intake (if anything) and what became of its files."""

    message: InboundMessage | None
    addressed: bool = False
    saved: list[Attachment] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)


async def read(
    message: discord.Message, client: discord.Client, inbox: InboxPolicy, intake: IntakePort
) -> Received:
    """The message for intake (None if it is nothing for us), its files saved."""
    me = client.user
    if me is None:
        return Received(None)
    private = is_private(message)
    received = Received(None, addressed=is_addressed(message, me))
    sender_id = str(message.author.id)
    # Nothing is fetched that the gate would not take. A stranger's private message is
    # still handed over, even if it was only files: the gate offers them pairing.
    admitted = await intake.admits(
        CHANNEL, sender_id, private=private, addressed=received.addressed
    )
    if admitted:
        received.saved, received.refusals = await fetch_files(message, inbox)
    elif private:
        received.refusals = [not_fetched(file_name(a)) for a in message.attachments]
    text = text_for_agent(message, me)
    if not text and not received.saved and (admitted or not received.refusals):
        return received  # nothing to hand over (perhaps only a refused file)
    notes = "\n".join(f"({line})" for line in received.refusals)
    received.message = InboundMessage.from_chat(
        chat_ref(message),
        sender_id,
        f"{text}\n\n{notes}".strip() if notes else text,
        str(message.id),
        sender_name=message.author.display_name,
        is_private=private,
        addressed=received.addressed,
        attachments=tuple(received.saved),
        received_at=message.created_at,
    )
    return received


def press_of(interaction: discord.Interaction) -> InboundMessage | None:
    """A button press as a message (its text the button's `custom_id`); None for any other
    interaction (slash commands, modals: not ours)."""
    data: Mapping[str, object] = interaction.data or {}
    custom_id = data.get("custom_id")
    if (
        interaction.type is not discord.InteractionType.component
        or interaction.channel_id is None
        or not isinstance(custom_id, str)
        or not custom_id
    ):
        return None
    user = interaction.user
    return InboundMessage.from_press(
        ChatRef(CHANNEL, str(interaction.channel_id)),
        str(user.id),
        custom_id,
        str(interaction.id),
        sender_name=user.display_name,
        is_private=interaction.guild_id is None,
        received_at=interaction.created_at,
    )


class Presses:
    """Button presses: acknowledged at once, kept (in memory, the last `PRESSES_KEPT`) so
    that they can be answered while their token lives (15 minutes)."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, discord.Interaction] = OrderedDict()

    async def acknowledge(self, interaction: discord.Interaction) -> None:
        """Tell Discord the press arrived (DEFERRED_UPDATE_MESSAGE: nothing changes on
        screen), which it must hear within 3 s; then keep it for its answer. Never raises:
        a press Discord no longer takes (too late, or answered already) is still a press."""
        try:
            await interaction.response.defer()
        except (discord.DiscordException, aiohttp.ClientError, OSError, TimeoutError) as exc:
            logger.warning("discord: could not acknowledge press {}: {}", interaction.id, exc)
        self._kept[str(interaction.id)] = interaction
        while len(self._kept) > PRESSES_KEPT:
            self._kept.popitem(last=False)

    def forget(self) -> None:
        """Drop every press kept (their client is gone: they can no longer be answered)."""
        self._kept.clear()

    async def answer(self, press: str, text: str) -> None:
        """Show `text` to the one who pressed only (an ephemeral follow-up). Best effort:
        never raises; an unknown or expired press is logged at debug."""
        interaction = self._kept.get(press)
        if interaction is None or interaction.is_expired():
            logger.debug("discord: press {} is unknown or expired; not answered", press)
            return
        try:
            for part in split_discord(text):
                await interaction.followup.send(part, ephemeral=True, allowed_mentions=QUIET)
        except (discord.DiscordException, aiohttp.ClientError, OSError, TimeoutError) as exc:
            logger.debug("discord: could not answer press {}: {}", press, exc)
