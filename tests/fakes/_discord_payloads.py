"""The data model of ``tests.fakes.discord`` and the Discord API v10 JSON it serves.

Private to the fake: everything here builds wire payloads (ids as strings, ISO
timestamps) with the fields discord.py 2.7 reads, most of them required
(``KeyError`` otherwise), e.g. ``Member`` needs ``roles`` and ``flags``, a
thread needs ``thread_metadata`` and ``message_count``, a text channel needs
``position``, ``Attachment`` needs ``size``, ``url`` and ``proxy_url``.
"""

from __future__ import annotations

import datetime
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

DISCORD_EPOCH_MS = 1_420_070_400_000

# Channel types
GUILD_TEXT, DM, GUILD_CATEGORY, PUBLIC_THREAD, PRIVATE_THREAD = 0, 1, 4, 11, 12
THREAD_TYPES = (PUBLIC_THREAD, PRIVATE_THREAD)

# Message types
DEFAULT_MESSAGE, REPLY = 0, 19

# Gateway intents (https://discord.com/developers/docs/events/gateway#gateway-intents)
GUILDS = 1 << 0
GUILD_MEMBERS = 1 << 1
GUILD_PRESENCES = 1 << 8
GUILD_MESSAGES = 1 << 9
DIRECT_MESSAGES = 1 << 12
MESSAGE_CONTENT = 1 << 15
PRIVILEGED_INTENTS = GUILD_MEMBERS | GUILD_PRESENCES | MESSAGE_CONTENT

# Permission bits of the @everyone role and the bot's managed role.
EVERYONE_PERMISSIONS = (
    (1 << 0)  # CREATE_INSTANT_INVITE
    | (1 << 6)  # ADD_REACTIONS
    | (1 << 10)  # VIEW_CHANNEL
    | (1 << 11)  # SEND_MESSAGES
    | (1 << 14)  # EMBED_LINKS
    | (1 << 15)  # ATTACH_FILES
    | (1 << 16)  # READ_MESSAGE_HISTORY
    | (1 << 18)  # USE_EXTERNAL_EMOJIS
    | (1 << 20)  # CONNECT
    | (1 << 21)  # SPEAK
    | (1 << 26)  # CHANGE_NICKNAME
    | (1 << 35)  # CREATE_PUBLIC_THREADS
    | (1 << 38)  # SEND_MESSAGES_IN_THREADS
)
BOT_ROLE_PERMISSIONS = EVERYONE_PERMISSIONS | (1 << 13)  # + MANAGE_MESSAGES


class Snowflakes:
    """Discord snowflakes: ms since 2015 << 22 | worker << 17 | increment; strictly increasing."""

    def __init__(self, worker: int = 1) -> None:
        self._worker = worker & 0x1F
        self._last_ms = 0
        self._increment = 0

    def next(self) -> int:
        now = max(int(time.time() * 1000) - DISCORD_EPOCH_MS, self._last_ms)
        if now == self._last_ms:
            self._increment += 1
            if self._increment >= 1 << 12:
                now, self._increment = now + 1, 0
        else:
            self._increment = 0
        self._last_ms = now
        return (now << 22) | (self._worker << 17) | self._increment


def snowflake_time(snowflake: int) -> datetime.datetime:
    ms = (snowflake >> 22) + DISCORD_EPOCH_MS
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


def iso(moment: datetime.datetime) -> str:
    """Discord's timestamp format: ``2024-01-01T12:00:00.123000+00:00``."""
    return moment.isoformat(timespec="microseconds")


def now_iso() -> str:
    return iso(datetime.datetime.now(datetime.UTC))


def bucket_hash(route: str) -> str:
    """A stable, Discord-looking rate-limit bucket hash for a route template."""
    return hashlib.sha1(route.encode(), usedforsecurity=False).hexdigest()[:32]


def error_body(code: int, message: str, errors: JSON | None = None) -> JSON:
    body: JSON = {"message": message, "code": code}
    if errors is not None:
        body["errors"] = errors
    return body


def form_error(field_name: str, code: str, message: str) -> JSON:
    """``50035 Invalid Form Body`` for one field, as Discord nests it."""
    errors = {field_name: {"_errors": [{"code": code, "message": message}]}}
    return error_body(50035, "Invalid Form Body", errors)


@dataclass(frozen=True)
class User:
    """A Discord user known to the fake. ``mention`` is ``<@id>``."""

    id: int
    username: str
    bot: bool = False
    global_name: str | None = None

    @property
    def mention(self) -> str:
        return f"<@{self.id}>"


@dataclass
class Role:
    id: int
    name: str
    permissions: int = EVERYONE_PERMISSIONS
    position: int = 0
    managed: bool = False
    mentionable: bool = True
    bot_id: int | None = None


@dataclass
class Member:
    user_id: int
    joined_at: str
    roles: list[int] = field(default_factory=list)
    nick: str | None = None


@dataclass
class Channel:
    """A guild text channel, a thread (``parent_id``, ``owner_id``) or a DM (``recipient_id``)."""

    id: int
    type: int
    name: str | None
    guild_id: int | None = None
    parent_id: int | None = None
    owner_id: int | None = None
    recipient_id: int | None = None
    topic: str | None = None
    position: int = 0
    last_message_id: int | None = None
    message_count: int = 0

    @property
    def is_thread(self) -> bool:
        return self.type in THREAD_TYPES


@dataclass
class Guild:
    id: int
    name: str
    owner_id: int
    joined_at: str
    roles: list[Role] = field(default_factory=list)
    channel_ids: list[int] = field(default_factory=list)
    members: dict[int, Member] = field(default_factory=dict)


def user_payload(user: User) -> JSON:
    return {
        "id": str(user.id),
        "username": user.username,
        "discriminator": "0",
        "global_name": user.global_name,
        "avatar": None,
        "avatar_decoration_data": None,
        "banner": None,
        "accent_color": None,
        "public_flags": 0,
        "primary_guild": None,
        "collectibles": None,
        **({"bot": True} if user.bot else {}),
    }


def self_user_payload(user: User) -> JSON:
    """``GET /users/@me`` and READY's ``user``: the bot with its private fields."""
    return {
        **user_payload(user),
        "verified": True,
        "mfa_enabled": False,
        "flags": 0,
        "email": None,
        "locale": "en-US",
        "premium_type": 0,
    }


def member_payload(member: Member, user: User | None = None) -> JSON:
    """A guild member; with ``user`` for GUILD_CREATE, without for MESSAGE_CREATE."""
    data: JSON = {
        "roles": [str(r) for r in member.roles],
        "joined_at": member.joined_at,
        "nick": member.nick,
        "avatar": None,
        "banner": None,
        "premium_since": None,
        "deaf": False,
        "mute": False,
        "pending": False,
        "flags": 0,
        "communication_disabled_until": None,
    }
    if user is not None:
        data["user"] = user_payload(user)
    return data


def role_payload(role: Role) -> JSON:
    data: JSON = {
        "id": str(role.id),
        "name": role.name,
        "description": None,
        "permissions": str(role.permissions),
        "position": role.position,
        "color": 0,
        "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
        "hoist": False,
        "icon": None,
        "unicode_emoji": None,
        "managed": role.managed,
        "mentionable": role.mentionable,
        "flags": 0,
    }
    if role.bot_id is not None:
        data["tags"] = {"bot_id": str(role.bot_id)}
    return data


def channel_payload(channel: Channel, users: dict[int, User]) -> JSON:
    last = str(channel.last_message_id) if channel.last_message_id else None
    if channel.type == DM:
        recipient = users[channel.recipient_id or 0]
        return {
            "id": str(channel.id),
            "type": DM,
            "last_message_id": last,
            "flags": 0,
            "recipients": [user_payload(recipient)],
        }
    data: JSON = {
        "id": str(channel.id),
        "type": channel.type,
        "guild_id": str(channel.guild_id),
        "name": channel.name,
        "last_message_id": last,
        "rate_limit_per_user": 0,
        "flags": 0,
    }
    if channel.is_thread:
        created = iso(snowflake_time(channel.id))
        data |= {
            "parent_id": str(channel.parent_id),
            "owner_id": str(channel.owner_id),
            "message_count": channel.message_count,
            "total_message_sent": channel.message_count,
            "member_count": 1,
            "thread_metadata": {
                "archived": False,
                "auto_archive_duration": 1440,
                "archive_timestamp": created,
                "locked": False,
                "create_timestamp": created,
                **({"invitable": True} if channel.type == PRIVATE_THREAD else {}),
            },
        }
        return data
    return data | {
        "position": channel.position,
        "parent_id": str(channel.parent_id) if channel.parent_id else None,
        "topic": channel.topic,
        "nsfw": False,
        "permission_overwrites": [],
        "default_auto_archive_duration": 1440,
        "default_thread_rate_limit_per_user": 0,
    }


def guild_create_payload(
    guild: Guild, channels: dict[int, Channel], users: dict[int, User], members: list[Member]
) -> JSON:
    """A full GUILD_CREATE: roles, ``members``, channels and active threads."""
    own = [channels[c] for c in guild.channel_ids]
    text = [c for c in own if not c.is_thread]
    threads = [c for c in own if c.is_thread]
    return {
        "id": str(guild.id),
        "name": guild.name,
        "icon": None,
        "splash": None,
        "discovery_splash": None,
        "banner": None,
        "description": None,
        "owner_id": str(guild.owner_id),
        "afk_channel_id": None,
        "afk_timeout": 300,
        "system_channel_id": str(text[0].id) if text else None,
        "system_channel_flags": 0,
        "rules_channel_id": None,
        "public_updates_channel_id": None,
        "safety_alerts_channel_id": None,
        "widget_enabled": False,
        "verification_level": 0,
        "default_message_notifications": 1,
        "explicit_content_filter": 0,
        "mfa_level": 0,
        "nsfw_level": 0,
        "nsfw": False,
        "premium_tier": 0,
        "premium_subscription_count": 0,
        "premium_progress_bar_enabled": False,
        "preferred_locale": "en-US",
        "vanity_url_code": None,
        "application_id": None,
        "max_members": 500000,
        "max_video_channel_users": 25,
        "max_stage_video_channel_users": 50,
        "features": [],
        "roles": [role_payload(r) for r in guild.roles],
        "emojis": [],
        "stickers": [],
        "joined_at": guild.joined_at,
        "large": False,
        "unavailable": False,
        "lazy": True,
        "member_count": len(guild.members),
        "members": [member_payload(m, users[m.user_id]) for m in members],
        "channels": [channel_payload(c, users) for c in text],
        "threads": [channel_payload(c, users) for c in threads],
        "presences": [],
        "voice_states": [],
        "stage_instances": [],
        "guild_scheduled_events": [],
        "soundboard_sounds": [],
        "embedded_activities": [],
        "incidents_data": None,
    }


def attachment_payload(
    attachment_id: int,
    filename: str,
    size: int,
    *,
    content_type: str | None,
    url: str,
    proxy_url: str,
) -> JSON:
    return {
        "id": str(attachment_id),
        "filename": filename,
        "size": size,
        "url": url,
        "proxy_url": proxy_url,
        "content_type": content_type,
        "width": None,
        "height": None,
        "ephemeral": False,
        "flags": 0,
    }


def mention_payload(user: User, member: Member | None) -> JSON:
    """An entry of ``mentions``: a user, with a partial ``member`` in guild messages."""
    data = user_payload(user)
    if member is not None:
        data["member"] = member_payload(member)
    return data


def message_payload(
    *,
    message_id: int,
    channel: Channel,
    author: User,
    content: str,
    mentions: list[JSON],
    mention_roles: list[int],
    mention_everyone: bool = False,
    attachments: list[JSON] | None = None,
    embeds: list[JSON] | None = None,
    message_reference: JSON | None = None,
    referenced_message: JSON | None = None,
    tts: bool = False,
    flags: int = 0,
    nonce: str | int | None = None,
    components: list[JSON] | None = None,
) -> JSON:
    """A message object as REST returns it (no ``guild_id``/``member``; the gateway adds them)."""
    data: JSON = {
        "id": str(message_id),
        "channel_id": str(channel.id),
        "type": REPLY if message_reference is not None else DEFAULT_MESSAGE,
        "author": user_payload(author),
        "content": content,
        "timestamp": iso(snowflake_time(message_id)),
        "edited_timestamp": None,
        "tts": tts,
        "mention_everyone": mention_everyone,
        "mentions": mentions,
        "mention_roles": [str(r) for r in mention_roles],
        "attachments": attachments or [],
        "embeds": embeds or [],
        "components": components or [],
        "pinned": False,
        "flags": flags,
    }
    if nonce is not None:
        data["nonce"] = nonce
    if channel.is_thread:
        data["position"] = channel.message_count
    if message_reference is not None:
        data["message_reference"] = message_reference
        data["referenced_message"] = referenced_message
    return data
