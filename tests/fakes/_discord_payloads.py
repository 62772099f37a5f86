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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

DISCORD_EPOCH_MS = 1_420_070_400_000

# Channel types
GUILD_TEXT, DM, GUILD_CATEGORY, PUBLIC_THREAD, PRIVATE_THREAD = 0, 1, 4, 11, 12
THREAD_TYPES = (PUBLIC_THREAD, PRIVATE_THREAD)

# Message types
DEFAULT_MESSAGE, REPLY = 0, 19

# Message flags
EPHEMERAL, LOADING = 1 << 6, 1 << 7

# Interactions: the type of a click, the callback types a click may be answered with
MESSAGE_COMPONENT = 3
CHANNEL_MESSAGE_WITH_SOURCE, DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE = 4, 5
DEFERRED_UPDATE_MESSAGE, UPDATE_MESSAGE, MODAL = 6, 7, 9
COMPONENT_CALLBACKS = (4, 5, 6, 7, 9)

# Message components (the legacy layout: up to 5 action rows of up to 5 buttons)
ACTION_ROW, BUTTON = 1, 2
SELECT_TYPES = (3, 5, 6, 7, 8)  # string, user, role, mentionable, channel selects
BUTTON_STYLES = (1, 2, 3, 4, 5, 6)  # primary, secondary, success, danger, link, premium
LINK_STYLE, PREMIUM_STYLE = 5, 6
MAX_ROWS, MAX_ROW_ITEMS, MAX_CUSTOM_ID, MAX_LABEL = 5, 5, 100, 80

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
ALL_PERMISSIONS = (1 << 51) - 1  # what a guild's owner has
# app_permissions in a DM with the bot:
# ATTACH_FILES | EMBED_LINKS | MENTION_EVERYONE | USE_EXTERNAL_EMOJIS
DM_APP_PERMISSIONS = (1 << 15) | (1 << 14) | (1 << 17) | (1 << 18)


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


def nested_form_error(path: Sequence[str | int], code: str, message: str) -> JSON:
    """``50035 Invalid Form Body`` for a field deep in the body, e.g. ``("components", 0,
    "components", 1, "custom_id")`` nests as ``{"components": {"0": {"components": {"1":
    {"custom_id": {"_errors": [...]}}}}}}``, as Discord does."""
    node: JSON = {"_errors": [{"code": code, "message": message}]}
    for key in reversed(path):
        node = {str(key): node}
    return error_body(50035, "Invalid Form Body", node)


def components_error(components: Any, prefix: Sequence[str | int] = ()) -> JSON | None:
    """The 50035 body Discord answers for ``components`` it refuses, or None if they are fine.

    Checked: a list of at most 5 action rows (type 1), each of 1 to 5 buttons (type 2) or one
    select; a button's ``style`` 1-6, ``label`` at most 80 characters, a ``custom_id`` of 1 to
    100 characters on every non-link button and a ``url`` on link buttons; no ``custom_id``
    twice in the message.
    """
    root = (*prefix, "components")
    if not isinstance(components, list):
        return nested_form_error(
            root, "MODEL_TYPE_CONVERT", "Only iterables may be used in a ListType"
        )
    if len(components) > MAX_ROWS:
        return nested_form_error(
            root, "BASE_TYPE_BAD_LENGTH", f"Must be {MAX_ROWS} or fewer in length."
        )
    seen: set[str] = set()
    for i, row in enumerate(components):
        if not isinstance(row, dict) or row.get("type") != ACTION_ROW:
            return nested_form_error(
                (*root, i, "type"),
                "UNION_TYPE_CHOICES",
                'Value of field "type" must be one of (1,).',
            )
        items = row.get("components")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_ROW_ITEMS:
            return nested_form_error(
                (*root, i, "components"),
                "BASE_TYPE_BAD_LENGTH",
                f"Must be between 1 and {MAX_ROW_ITEMS} in length.",
            )
        for j, item in enumerate(items):
            if (error := _item_error(item, (*root, i, "components", j), seen)) is not None:
                return error
    return None


def _item_error(item: Any, path: tuple[str | int, ...], seen: set[str]) -> JSON | None:
    """The 50035 body for one item of an action row Discord refuses, or None."""
    kind = item.get("type") if isinstance(item, dict) else None
    button = kind == BUTTON
    style = item.get("style") if button else None
    label = item.get("label") if button else None
    custom_id = item.get("custom_id") if button or kind in SELECT_TYPES else None
    needs_id = kind in SELECT_TYPES or (button and style in BUTTON_STYLES[:4])
    good_id = isinstance(custom_id, str) and 1 <= len(custom_id) <= MAX_CUSTOM_ID
    checks: list[tuple[bool, str, str, str]] = [
        (
            not button and kind not in SELECT_TYPES,
            "type",
            "UNION_TYPE_CHOICES",
            'Value of field "type" must be one of (2, 3, 5, 6, 7, 8).',
        ),
        (
            button and style not in BUTTON_STYLES,
            "style",
            "BASE_TYPE_CHOICES",
            "Value must be one of {1, 2, 3, 4, 5, 6}.",
        ),
        (
            label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL),
            "label",
            "BASE_TYPE_BAD_LENGTH",
            f"Must be {MAX_LABEL} or fewer in length.",
        ),
        (
            style == LINK_STYLE and not item.get("url"),
            "url",
            "BUTTON_COMPONENT_URL_REQUIRED",
            "A url is required",
        ),
        (
            needs_id and custom_id is None,
            "custom_id",
            "BUTTON_COMPONENT_CUSTOM_ID_REQUIRED",
            "A custom id required",
        ),
        (
            needs_id and custom_id is not None and not good_id,
            "custom_id",
            "BASE_TYPE_BAD_LENGTH",
            f"Must be between 1 and {MAX_CUSTOM_ID} in length.",
        ),
        (
            needs_id and good_id and custom_id in seen,
            "custom_id",
            "COMPONENT_CUSTOM_ID_DUPLICATED",
            "Component custom id cannot be duplicated",
        ),
    ]
    for failed, name, code, message in checks:
        if failed:
            return nested_form_error((*path, name), code, message)
    if needs_id and good_id:
        seen.add(str(custom_id))
    return None


def find_component(components: Any, custom_id: str) -> JSON | None:
    """The component with ``custom_id`` anywhere in a message's components, or None."""
    for item in components if isinstance(components, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("custom_id") == custom_id and item.get("type") != ACTION_ROW:
            return item
        if (found := find_component(item.get("components"), custom_id)) is not None:
            return found
    return None


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


def interaction_payload(
    *,
    interaction_id: int,
    token: str,
    application_id: int,
    custom_id: str,
    component_type: int,
    channel: JSON,
    message: JSON,
    guild_id: int | None,
    member: JSON | None,
    user: JSON,
    app_permissions: int,
    attachment_size_limit: int,
) -> JSON:
    """INTERACTION_CREATE for a click on a message component (type 3, MESSAGE_COMPONENT).

    In a guild it carries ``guild_id``, a partial ``guild`` and the clicker as ``member`` (with
    ``user`` and ``permissions``); in a DM the clicker as ``user``. discord.py requires
    ``token``, ``version``, ``application_id`` and ``attachment_size_limit``.
    """
    data: JSON = {
        "id": str(interaction_id),
        "application_id": str(application_id),
        "type": MESSAGE_COMPONENT,
        "data": {"custom_id": custom_id, "component_type": component_type},
        "channel": channel,
        "channel_id": channel["id"],
        "token": token,
        "version": 1,
        "message": message,
        "app_permissions": str(app_permissions),
        "locale": "en-US",
        "entitlements": [],
        "authorizing_integration_owners": {"0": str(guild_id or 0)},
        "context": 0 if guild_id is not None else 1,  # GUILD, BOT_DM
        "attachment_size_limit": attachment_size_limit,
    }
    if guild_id is not None:
        data |= {
            "guild_id": str(guild_id),
            "guild": {"id": str(guild_id), "locale": "en-US", "features": []},
            "guild_locale": "en-US",
            "member": member,
        }
    else:
        data["user"] = user
    return data
