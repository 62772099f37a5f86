"""A fake Discord: REST API v10 and gateway websocket, speaking the real wire format.

In process (it serves in the caller's loop)::

    async with FakeDiscord(heartbeat_interval_ms=1000) as fake:
        guild = fake.add_guild("home")
        channel = fake.add_channel(guild, "general")
        discord.http.Route.BASE = fake.api_base  # "http://127.0.0.1:PORT/api/v10"
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(fake.gateway_url)
        ...  # client.start(token) in a task; await fake.wait_for_ready()
        fake.user_message(channel, "hi", mentions_bot=True)
        [reply] = await fake.wait_for_sent(1, channel)

REST (under ``/api/v10``): ``GET /users/@me``, ``GET /users/{id}``, ``POST
/users/@me/channels``, ``GET /oauth2/applications/@me`` (discord.py's ``login``
calls it), ``GET /gateway[/bot]``, ``GET /channels/{id}``, ``GET|POST
/channels/{id}/messages``, ``GET|PATCH|DELETE /channels/{id}/messages/{mid}``,
``POST /channels/{id}/typing``, ``PUT|DELETE .../reactions/{emoji}/@me``; any other
API path answers Discord's 404 and is listed in ``unhandled``. Attachments are
served at ``/attachments/{channel}/{id}/{filename}``, like Discord's CDN; a user's voice
message (``user_voice_message``) is an OGG/Opus attachment with ``duration_secs`` and
``waveform`` on a message flagged ``IS_VOICE_MESSAGE``, as Discord's clients send it.

Message components: ``components`` (action rows of buttons) are validated on create and
edit as Discord does (50035 with the field's path: ``custom_id`` 1-100 characters and unique,
``label`` at most 80, ``style`` 1-6, at most 5 rows of 5) and kept on the message. A test
clicks a button with ``click(message_id, custom_id, user_id=...)``: INTERACTION_CREATE (type
3) goes to every session, whatever its intents. The bot answers on ``POST
/interactions/{id}/{token}/callback`` (no bot token needed, as on Discord): type 4 posts a
message (ephemeral with flags 64: only the clicker sees it, no MESSAGE_CREATE, not in the
channel's history), 5 a loading one, 6 acknowledges, 7 edits the clicked message, 9 (modal)
is recorded. Only one callback per interaction (a second: 400, 40060 "Interaction has
already been acknowledged."), and only within ``interaction_timeout`` (3 s) of the click
(later: 404, 10062 "Unknown interaction"); the clock is injectable and ``advance_clock``
moves it. After the callback, for ``interaction_token_ttl`` (15 min), ``GET|PATCH|DELETE
/webhooks/{application_id}/{token}/messages/@original`` (or a follow-up's id) reads, edits
or deletes the response (after 6 or 7: the clicked message) and ``POST
/webhooks/{application_id}/{token}`` posts a follow-up; ``interactions`` records it all.

The gateway (``/gateway``) does HELLO, IDENTIFY → READY + one GUILD_CREATE per
guild, HEARTBEAT → HEARTBEAT_ACK, RESUME → replay of the dispatches after the
client's ``seq`` then RESUMED, REQUEST_MEMBERS → GUILD_MEMBERS_CHUNK. Each session
keeps every dispatch, so events raised while its socket is gone are delivered on
resume. ``compress=zlib-stream`` is honoured (one zlib context per connection,
``Z_SYNC_FLUSH`` per frame, binary frames) unless ``compress=False``. Intents are
applied as Discord does: guild messages need GUILD_MESSAGES, DMs DIRECT_MESSAGES,
and without MESSAGE_CONTENT a guild message neither from nor mentioning the bot
arrives with empty content, embeds and attachments. Messages the bot sends come
back as MESSAGE_CREATE (``echo_own_messages``), as on Discord.

Standalone: ``python -m tests.fakes.discord --port 0 --guild home --channel general``
prints one JSON line (``api_base``, ``gateway_url``, ``bot_user_id``, ``guild_id``,
``channels``) and serves until SIGTERM. ``POST /_fake/user_message`` takes
``user_message``'s arguments as JSON and returns ``{"id": ...}`` (``POST
/_fake/user_voice_message`` ``user_voice_message``'s, the audio as ``content_base64``);
``GET /_fake/sent`` lists the bot's messages; ``GET /_fake/state`` the guilds, channels and
sessions; ``POST /_fake/click`` takes ``{"message_id", "custom_id", "user_id"|"username"}`` and
returns the interaction's ``{"id", "token"}``; ``GET /_fake/interactions`` lists the clicks
and their answers; ``POST /_fake/advance_clock`` takes ``{"seconds"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import fnmatch
import json
import math
import mimetypes
import re
import signal
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self
from urllib.parse import quote

from aiohttp import web

from tests.fakes import _discord_payloads as p
from tests.fakes import audio
from tests.fakes._discord_payloads import JSON, User

__all__ = [
    "IS_VOICE_MESSAGE",
    "VOICE_MESSAGE_FILENAME",
    "AttachmentFile",
    "FakeDiscord",
    "Fault",
    "Garbled",
    "GatewayConnection",
    "GatewaySession",
    "Hang",
    "HttpError",
    "InteractionRecord",
    "RateLimited",
    "Reaction",
    "RestRequest",
    "SentAttachment",
    "SentMessage",
    "ServerError",
    "User",
]

API_PREFIX = "/api/v10"
MAX_CONTENT = 2000
IS_VOICE_MESSAGE = 1 << 13  # message flag
VOICE_MESSAGE_FILENAME = "voice-message.ogg"  # what Discord's clients upload
USER_MENTION = re.compile(r"<@!?(\d+)>")
ROLE_MENTION = re.compile(r"<@&(\d+)>")
# Interaction callbacks and webhook calls: authorised by the token in the path, not a bot token
WEBHOOK_PATH = re.compile(r"/(?:interactions/\d+/[^/]+/callback|webhooks/\d+/[^/]+(?:/.*)?)$")

# Gateway opcodes
DISPATCH, HEARTBEAT, IDENTIFY, PRESENCE_UPDATE, VOICE_STATE_UPDATE = 0, 1, 2, 3, 4
RESUME, RECONNECT, REQUEST_MEMBERS, INVALID_SESSION, HELLO, HEARTBEAT_ACK = 6, 7, 8, 9, 10, 11


@dataclass(frozen=True)
class Fault:
    """Base of the REST faults ``FakeDiscord.fail_next`` injects."""


@dataclass(frozen=True)
class RateLimited(Fault):
    """HTTP 429 with Discord's body and headers (``Retry-After``, ``X-RateLimit-*``, ``Via``).

    ``scope`` is ``user``, ``shared`` or ``global``; ``global_`` marks a global limit.
    """

    retry_after: float = 0.5
    global_: bool = False
    scope: str = "user"


@dataclass(frozen=True)
class ServerError(Fault):
    """A 5xx: JSON ``{"message": "500: Internal Server Error"}``; 502/504 as Cloudflare HTML."""

    status: int = 500


@dataclass(frozen=True)
class HttpError(Fault):
    """Any Discord JSON error, e.g. ``HttpError(403, 50013, "Missing Permissions")``;
    ``errors`` as Discord nests them for 50035 Invalid Form Body (``form_error(...)["errors"]``
    of ``_discord_payloads``)."""

    status: int = 403
    code: int = 50013
    message: str = "Missing Permissions"
    errors: JSON | None = None


@dataclass(frozen=True)
class Hang(Fault):
    """Accept the request and never answer; the connection is dropped when the fake stops."""


@dataclass(frozen=True)
class Garbled(Fault):
    """Answer 200 with ``body`` as JSON without performing the request: a malformed answer
    (by default an object without any field discord.py reads)."""

    body: str = '{"unexpected": true}'


@dataclass(frozen=True)
class AttachmentFile:
    """A file a user attaches to an injected message (``content_type`` guessed if None).

    A voice message's one attachment also has ``duration_secs`` and ``waveform`` (base64 of
    up to 256 amplitudes, 0-255); discord.py's ``Attachment.is_voice_message()`` is true
    when both are set. ``FakeDiscord.user_voice_message`` makes the whole message.
    """

    filename: str
    data: bytes
    content_type: str | None = None
    duration_secs: float | None = None
    waveform: str | None = None


@dataclass(frozen=True)
class SentAttachment:
    """A file the bot uploaded (multipart ``files[n]``), with its attachment ``id`` and ``url``."""

    id: int
    filename: str
    data: bytes
    content_type: str | None
    url: str
    description: str | None = None


@dataclass
class SentMessage:
    """A message the bot created. ``content`` is the current text; ``edits`` the text after
    each PATCH, in order. ``mentions``: ids of the users it pings, after ``allowed_mentions``.
    ``payload`` is the JSON body of the POST (``payload_json`` for multipart).
    """

    id: int
    channel_id: int
    content: str
    allowed_mentions: JSON | None
    message_reference: JSON | None
    attachments: list[SentAttachment]
    embeds: list[JSON]
    mentions: list[int]
    mention_everyone: bool
    payload: JSON
    edits: list[str] = field(default_factory=list)
    deleted: bool = False
    components: list[JSON] = field(default_factory=list)  # as they are now
    flags: int = 0
    interaction_id: int | None = None  # set if posted in answer to a click
    edit_payloads: list[JSON] = field(default_factory=list)  # the body of each edit

    @property
    def reply_to(self) -> int | None:
        """The id of the message this one replies to, if any."""
        ref = self.message_reference or {}
        return int(ref["message_id"]) if ref.get("message_id") else None

    @property
    def ephemeral(self) -> bool:
        """Whether only the user who clicked sees it (flag 64, an interaction's answer)."""
        return bool(self.flags & p.EPHEMERAL)

    @property
    def buttons(self) -> list[JSON]:
        """The buttons shown now, row after row (``[]``: none)."""
        return [
            c
            for row in self.components
            for c in row.get("components", [])
            if isinstance(c, dict) and c.get("type") == p.BUTTON
        ]


@dataclass
class InteractionRecord:
    """A click the fake dispatched as INTERACTION_CREATE, and how the bot answered it.

    ``created_at`` and ``responded_at`` are on the fake's clock. ``response_type`` is the
    accepted callback's type (4, 5, 6, 7 or 9; None: not answered) and ``response`` its body;
    ``original_id`` is the message ``@original`` names (the posted answer for 4 and 5, the
    clicked message for 6 and 7); ``followups`` the follow-ups' ids; ``refusals`` the (HTTP
    status, Discord code) of every callback refused (answered twice, too late).
    """

    id: int
    token: str
    application_id: int
    custom_id: str
    component_type: int
    channel_id: int
    guild_id: int | None
    message_id: int
    user_id: int
    created_at: float
    payload: JSON = field(repr=False)
    response_type: int | None = None
    response: JSON | None = None
    responded_at: float | None = None
    original_id: int | None = None
    followups: list[int] = field(default_factory=list)
    refusals: list[tuple[int, int]] = field(default_factory=list)

    @property
    def acknowledged(self) -> bool:
        return self.response_type is not None

    @property
    def ephemeral(self) -> bool:
        """Whether the answer (type 4 or 5) is visible to the clicker only."""
        data = (self.response or {}).get("data") or {}
        flags = _int(data.get("flags")) if isinstance(data, dict) else None
        return bool((flags or 0) & p.EPHEMERAL) and self.response_type in (4, 5)


@dataclass(frozen=True)
class Reaction:
    """A reaction the bot added (or removed: ``added`` False)."""

    channel_id: int
    message_id: int
    emoji: str
    added: bool = True


@dataclass(frozen=True)
class RestRequest:
    """One REST call: ``path`` without ``/api/v10``, parsed JSON body (or ``payload_json``)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]
    received_at: float
    fault: str | None = None


@dataclass(eq=False)
class GatewayConnection:
    """One websocket: its query (``v``, ``encoding``, ``compress``), the opcodes the client
    sent, and how it ended: ``closed_by`` ``"server"`` or ``"client"`` with ``close_code``.
    """

    query: dict[str, str]
    compression: str | None
    ops: list[int] = field(default_factory=list)
    close_code: int | None = None
    closed_by: str | None = None

    @property
    def closed(self) -> bool:
        return self.closed_by is not None


@dataclass(eq=False)
class GatewaySession:
    """A gateway session: IDENTIFY data, last ``seq`` and every dispatch sent (for replay)."""

    session_id: str
    identify: JSON
    intents: int
    shard: tuple[int, int]
    seq: int = 0
    resumes: int = 0
    frames: list[JSON] = field(default_factory=list, repr=False)
    _conn: _Connection | None = field(default=None, repr=False)

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def push(self, event: str, data: JSON) -> None:
        self.seq += 1
        frame = {"op": DISPATCH, "t": event, "s": self.seq, "d": copy.deepcopy(data)}
        self.frames.append(frame)
        if self._conn is not None:
            self._conn.send(frame)


class _Connection:
    """A live gateway websocket; frames go through one writer task to keep their order."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        info: GatewayConnection,
        transport: asyncio.Transport | None,
    ) -> None:
        self.ws, self.info, self.transport = ws, info, transport
        self.session: GatewaySession | None = None
        self.server_closed = False
        self._zlib = zlib.compressobj() if info.compression == "zlib-stream" else None
        self._outbox: asyncio.Queue[JSON | None] = asyncio.Queue()

    def send(self, frame: JSON) -> None:
        self._outbox.put_nowait(frame)

    def send_op(self, op: int, data: Any) -> None:
        self.send({"op": op, "d": data, "s": None, "t": None})

    def finish(self) -> None:
        self._outbox.put_nowait(None)

    async def run_writer(self) -> None:
        while (frame := await self._outbox.get()) is not None:
            text = json.dumps(frame, separators=(",", ":"))
            try:
                if self._zlib is None:
                    await self.ws.send_str(text)
                else:
                    data = self._zlib.compress(text.encode()) + self._zlib.flush(zlib.Z_SYNC_FLUSH)
                    await self.ws.send_bytes(data)
            except (ConnectionError, RuntimeError):
                return

    async def close(self, code: int, reason: str = "", abort: bool = False) -> None:
        """Close from the server side (``abort``: drop TCP, no close frame); the session
        (if any) stays resumable."""
        if self.server_closed or self.ws.closed:
            return
        self.server_closed = True
        self.info.close_code, self.info.closed_by = (None if abort else code), "server"
        if self.session is not None and self.session._conn is self:
            self.session._conn = None
        self.finish()
        if abort and self.transport is not None:
            self.transport.abort()
            return
        with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
            await asyncio.wait_for(self.ws.close(code=code, message=reason.encode()), 2.0)


@dataclass
class _Stored:
    payload: JSON
    channel_id: int
    author_id: int
    deleted: bool = False
    ephemeral_to: int | None = None  # the only user who sees it (an ephemeral answer)


@dataclass
class _Body:
    data: Any
    files: list[tuple[str, str, bytes, str | None]] = field(default_factory=list)


@dataclass
class _FaultRule:
    pattern: str
    fault: Fault
    remaining: int | None  # None: until `clear_faults`


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response whose Content-Type is exactly ``application/json``.

    discord.py compares the header with ``==``; aiohttp's ``json_response`` would append
    ``; charset=utf-8`` and discord.py would then see a string, not JSON.
    """
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    return web.Response(body=json.dumps(data).encode(), status=status, headers=all_headers)


def _error(status: int, code: int, message: str) -> web.Response:
    return _json(p.error_body(code, message), status)


def _voice_fields(attachment: AttachmentFile) -> JSON:
    """The payload fields a voice message's attachment has beyond a file's."""
    fields = {"duration_secs": attachment.duration_secs, "waveform": attachment.waveform}
    return {k: v for k, v in fields.items() if v is not None}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class FakeDiscord:
    """Discord's REST API and gateway on 127.0.0.1, with a control API for tests.

    ``token``: if set, REST needs ``Authorization: Bot <token>`` (else 401) and
    IDENTIFY/RESUME that token (else close 4004); if None any token is accepted.
    ``heartbeat_interval_ms`` goes in HELLO. ``privileged_intents``: whether the
    application may use MEMBERS/PRESENCES/MESSAGE_CONTENT (else IDENTIFY asking for
    them is closed with 4014, which discord.py raises as ``PrivilegedIntentsRequired``).
    ``interaction_timeout``: seconds after a click within which its callback is accepted;
    ``interaction_token_ttl``: how long the webhook endpoints take its token. ``clock``
    (default ``time.monotonic``) times both; ``advance_clock`` moves it on without waiting.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        bot_name: str = "nanobot",
        heartbeat_interval_ms: int = 41250,
        compress: bool = True,
        privileged_intents: bool = True,
        echo_own_messages: bool = True,
        max_upload_bytes: int = 10 * 1024 * 1024,
        interaction_timeout: float = 3.0,
        interaction_token_ttl: float = 15 * 60.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.host, self.port, self.token = host, port, token
        self.interaction_timeout, self.interaction_token_ttl = (
            interaction_timeout,
            interaction_token_ttl,
        )
        self.clock: Callable[[], float] = clock or time.monotonic
        self._skew = 0.0
        self.interactions: list[InteractionRecord] = []
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.compress, self.privileged_intents = compress, privileged_intents
        self.echo_own_messages, self.max_upload_bytes = echo_own_messages, max_upload_bytes
        self._ids = p.Snowflakes()
        self.bot_user = User(self._ids.next(), bot_name, bot=True)
        self.application_flags = 1 << 19  # GATEWAY_MESSAGE_CONTENT_LIMITED
        self.requests: list[RestRequest] = []
        self.downloads: list[str] = []  # attachment (CDN) paths asked for
        self.unhandled: list[str] = []
        self.typing: list[int] = []
        self.reactions: list[Reaction] = []
        self.presences: list[JSON] = []
        self.heartbeats = 0
        self.ready_count = 0  # READYs sent (IDENTIFYs accepted)
        self.sessions: list[GatewaySession] = []
        self.connections: list[GatewayConnection] = []
        self._users: dict[int, User] = {self.bot_user.id: self.bot_user}
        self._user_by_name: dict[str, int] = {}
        self._guilds: dict[int, p.Guild] = {}
        self._channels: dict[int, p.Channel] = {}
        self._dms: dict[int, int] = {}  # user id -> DM channel id
        self._messages: dict[int, _Stored] = {}
        self._sent: list[SentMessage] = []
        self._files: dict[int, tuple[str, bytes, str | None, int]] = {}  # + channel id
        self._file_extras: dict[int, JSON] = {}  # attachment id -> more of its payload
        self._faults: list[_FaultRule] = []
        self._bodies: dict[int, _Body] = {}  # id(request) -> parsed body, while it is served
        self._inflight: set[asyncio.Future[None]] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._live: set[_Connection] = set()
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self._gate = asyncio.Event()
        self._gate.set()
        self._tick = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        if self._runner is None:
            raise RuntimeError("FakeDiscord is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        """``http://127.0.0.1:PORT/api/v10``: what ``discord.http.Route.BASE`` takes."""
        return self.base_url + API_PREFIX

    @property
    def gateway_url(self) -> str:
        """``ws://127.0.0.1:PORT/gateway``: ``DiscordWebSocket.DEFAULT_GATEWAY`` (as a yarl.URL)."""
        return f"ws://{self.host}:{self.port}/gateway"

    async def start(self) -> None:
        """Bind and serve in the running loop; ``port`` becomes the bound port."""
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._middleware])
        api, r = API_PREFIX, app.router
        r.add_get(f"{api}/users/@me", self._get_me)
        r.add_post(f"{api}/users/@me/channels", self._create_dm)
        r.add_get(f"{api}/users/{{user_id}}", self._get_user)
        r.add_get(f"{api}/oauth2/applications/@me", self._application)
        r.add_get(f"{api}/applications/@me", self._application)
        r.add_get(f"{api}/gateway", self._get_gateway)
        r.add_get(f"{api}/gateway/bot", self._get_gateway_bot)
        r.add_get(f"{api}/channels/{{channel_id}}", self._get_channel)
        r.add_get(f"{api}/channels/{{channel_id}}/messages", self._history)
        r.add_post(f"{api}/channels/{{channel_id}}/messages", self._create_message)
        msg = f"{api}/channels/{{channel_id}}/messages/{{message_id}}"
        r.add_get(msg, self._get_message)
        r.add_patch(msg, self._edit_message)
        r.add_delete(msg, self._delete_message)
        r.add_put(f"{msg}/reactions/{{emoji}}/@me", self._react)
        r.add_delete(f"{msg}/reactions/{{emoji}}/@me", self._react)
        r.add_post(f"{api}/channels/{{channel_id}}/typing", self._typing)
        r.add_post(
            f"{api}/interactions/{{interaction_id}}/{{token}}/callback", self._interaction_callback
        )
        hook = f"{api}/webhooks/{{application_id}}/{{token}}"
        r.add_post(hook, self._followup)
        r.add_route("GET", f"{hook}/messages/{{message_id}}", self._webhook_message)
        r.add_route("PATCH", f"{hook}/messages/{{message_id}}", self._webhook_message)
        r.add_route("DELETE", f"{hook}/messages/{{message_id}}", self._webhook_message)
        r.add_route("*", f"{api}/{{tail:.*}}", self._unknown)
        for prefix in ("/attachments", "/media/attachments"):
            r.add_get(f"{prefix}/{{channel_id}}/{{attachment_id}}/{{filename}}", self._download)
        r.add_get("/gateway", self._gateway)
        r.add_post("/_fake/user_message", self._control_user_message)
        r.add_post("/_fake/user_voice_message", self._control_user_voice_message)
        r.add_get("/_fake/sent", self._control_sent)
        r.add_get("/_fake/state", self._control_state)
        r.add_post("/_fake/click", self._control_click)
        r.add_get("/_fake/interactions", self._control_interactions)
        r.add_post("/_fake/advance_clock", self._control_advance_clock)
        self._stopping = asyncio.Event()
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Close every websocket (1001), drop hanging requests, close the socket. Idempotent."""
        if self._runner is None:
            return
        for site in list(self._runner.sites):  # first stop accepting (and clients retrying)
            await site.stop()
        self._stopping.set()
        self._gate.set()
        await asyncio.gather(*(c.close(1001, "server stopping") for c in list(self._live)))
        if self._inflight:  # let released handlers finish, else cleanup() waits for them
            await asyncio.wait(list(self._inflight), timeout=1.0)
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ world building

    def add_user(self, username: str, *, user_id: int | None = None, bot: bool = False) -> int:
        """A user (returns its id); the same username gives the same user."""
        if user_id is None and username in self._user_by_name:
            return self._user_by_name[username]
        user = User(user_id or self._ids.next(), username, bot=bot)
        self._users.setdefault(user.id, user)
        self._user_by_name.setdefault(username, user.id)
        return user.id

    def user(self, user_id: int) -> User:
        """A known user by id (``KeyError`` if unknown)."""
        return self._users[user_id]

    def add_guild(self, name: str, *, owner_id: int | None = None) -> int:
        """A guild with an @everyone role, the bot (with its managed role) and the owner."""
        owner = owner_id if owner_id is not None else self.add_user("ada")
        guild_id = self._ids.next()
        bot_role = p.Role(self._ids.next(), self.bot_user.username, p.BOT_ROLE_PERMISSIONS, 1)
        bot_role.managed, bot_role.bot_id = True, self.bot_user.id
        guild = p.Guild(guild_id, name, owner, p.now_iso())
        guild.roles += [p.Role(guild_id, "@everyone"), bot_role]
        self._guilds[guild_id] = guild
        self._join(guild, self.bot_user.id, [bot_role.id], announce=False)
        self._join(guild, owner, announce=False)
        self._dispatch_guild(
            guild_id, "GUILD_CREATE", lambda s: self._guild_payload(guild_id, s), p.GUILDS
        )
        return guild_id

    def add_role(self, guild_id: int, name: str) -> int:
        """A mentionable role (for ``<@&id>`` and ``mention_roles``)."""
        guild = self._guilds[guild_id]
        role = p.Role(self._ids.next(), name, position=len(guild.roles))
        guild.roles.append(role)
        data = {"guild_id": str(guild_id), "role": p.role_payload(role)}
        self._dispatch_guild(guild_id, "GUILD_ROLE_CREATE", lambda _: data, p.GUILDS)
        return role.id

    def add_channel(self, guild_id: int, name: str, *, topic: str | None = None) -> int:
        """A text channel; connected sessions get CHANNEL_CREATE."""
        guild = self._guilds[guild_id]
        position = sum(1 for c in guild.channel_ids if not self._channels[c].is_thread)
        channel = p.Channel(self._ids.next(), p.GUILD_TEXT, name, guild_id, topic=topic)
        channel.position = position
        self._channels[channel.id] = channel
        guild.channel_ids.append(channel.id)
        data = p.channel_payload(channel, self._users)
        self._dispatch_guild(guild_id, "CHANNEL_CREATE", lambda _: data, p.GUILDS)
        return channel.id

    def add_thread(
        self, channel_id: int, name: str, *, private: bool = False, owner_id: int | None = None
    ) -> int:
        """An active thread under a text channel; connected sessions get THREAD_CREATE."""
        parent = self._channels[channel_id]
        if parent.guild_id is None or parent.type != p.GUILD_TEXT:
            raise ValueError(f"channel {channel_id} is not a guild text channel")
        kind = p.PRIVATE_THREAD if private else p.PUBLIC_THREAD
        owner = owner_id if owner_id is not None else self._guilds[parent.guild_id].owner_id
        thread = p.Channel(self._ids.next(), kind, name, parent.guild_id, channel_id, owner)
        self._channels[thread.id] = thread
        self._guilds[parent.guild_id].channel_ids.append(thread.id)
        data = p.channel_payload(thread, self._users) | {"newly_created": True}
        self._dispatch_guild(parent.guild_id, "THREAD_CREATE", lambda _: data, p.GUILDS)
        return thread.id

    def dm_channel(self, user_id: int) -> int:
        """The DM channel between the bot and ``user_id`` (created once; no gateway event)."""
        if user_id not in self._users:
            raise KeyError(f"unknown user {user_id}; add_user() first")
        if user_id not in self._dms:
            channel = p.Channel(self._ids.next(), p.DM, None, recipient_id=user_id)
            self._channels[channel.id] = channel
            self._dms[user_id] = channel.id
        return self._dms[user_id]

    def channel(self, channel_id: int) -> p.Channel:
        """The fake's record of a channel, thread or DM (type, name, guild_id, parent_id...)."""
        return self._channels[channel_id]

    # ------------------------------------------------------------------ injecting messages

    def user_message(
        self,
        channel_id: int,
        content: str,
        *,
        user_id: int | None = None,
        username: str = "ada",
        mentions_bot: bool = False,
        reply_to: int | None = None,
        reply_ping: bool = True,
        attachments: Sequence[AttachmentFile] | None = None,
        flags: int = 0,
    ) -> int:
        """A message from a user: dispatched as MESSAGE_CREATE to every session; returns its id.

        ``user_id`` (default: the user named ``username``) must be the recipient in a DM.
        ``mentions_bot`` prefixes ``<@BOT_ID> `` unless the content already has it; other
        ``<@id>``/``<@&id>`` in the content fill ``mentions``/``mention_roles``. ``reply_to``
        makes a reply (type 19 with ``message_reference`` and ``referenced_message``);
        ``reply_ping`` also mentions the replied-to author, as Discord clients do by default.
        Each attachment is served at its ``url`` (``Attachment.read()``); ``flags`` are the
        message's flags (``IS_VOICE_MESSAGE``).
        """
        channel = self._channels[channel_id]
        author_id = user_id if user_id is not None else self.add_user(username)
        if author_id not in self._users:
            self.add_user(username, user_id=author_id)
        if channel.type == p.DM and channel.recipient_id != author_id:
            raise ValueError(f"user {author_id} is not the recipient of DM {channel_id}")
        if channel.guild_id is not None:
            self._join(self._guilds[channel.guild_id], author_id)
        if mentions_bot and self.bot_user.mention not in content:
            content = f"{self.bot_user.mention} {content}"
        reference = referenced = None
        extra_mentions: list[int] = []
        if reply_to is not None:
            target = self._messages[reply_to]
            reference, referenced = self._reference(reply_to, channel), self._referenced(target)
            if reply_ping:
                extra_mentions.append(target.author_id)
        user_ids = [*self._mentioned_users(content), *extra_mentions]
        role_ids = self._mentioned_roles(content, channel.guild_id)
        message_id = self._ids.next()
        files = [
            self._store_file(channel_id, a.filename, a.data, a.content_type, _voice_fields(a))
            for a in attachments or ()
        ]
        payload = p.message_payload(
            message_id=message_id,
            channel=channel,
            author=self._users[author_id],
            content=content,
            mentions=self._mention_payloads(user_ids, channel.guild_id),
            mention_roles=role_ids,
            mention_everyone=False,
            attachments=[self._attachment_payload(f) for f in files],
            message_reference=reference,
            referenced_message=referenced,
            flags=flags,
        )
        self._record(payload, channel, author_id)
        self._dispatch_message("MESSAGE_CREATE", payload, channel)
        return message_id

    def user_voice_message(
        self,
        channel_id: int,
        data: bytes,
        *,
        duration_secs: float | None = None,
        waveform: str | None = None,
        user_id: int | None = None,
        username: str = "ada",
        reply_to: int | None = None,
    ) -> int:
        """A voice message as Discord's clients send it: no content, flags
        ``IS_VOICE_MESSAGE``, one ``audio/ogg`` attachment named ``voice-message.ogg`` with
        ``duration_secs`` (default: read from the OGG/Opus ``data``, see ``audio.duration``)
        and ``waveform`` (default: one zero amplitude per 100 ms, at most 256). Returns the
        message's id; the rest as ``user_message``."""
        seconds = audio.duration(data) if duration_secs is None else duration_secs
        if seconds is None:
            raise ValueError("duration_secs is needed for audio that is not OGG/Opus")
        if waveform is None:
            waveform = base64.b64encode(bytes(min(256, max(1, round(seconds * 10))))).decode()
        voice = AttachmentFile(VOICE_MESSAGE_FILENAME, data, "audio/ogg", seconds, waveform)
        return self.user_message(
            channel_id,
            "",
            user_id=user_id,
            username=username,
            reply_to=reply_to,
            reply_ping=False,
            attachments=[voice],
            flags=IS_VOICE_MESSAGE,
        )

    def expire_attachment(self, attachment_id: int) -> None:
        """From now on the CDN answers 404 "This content is no longer available." for the
        attachment, as Discord's does for an expired or deleted one."""
        self._files.pop(attachment_id, None)

    # ------------------------------------------------------------------ clicking

    def click(
        self,
        message_id: int,
        custom_id: str,
        *,
        user_id: int | None = None,
        username: str = "ada",
    ) -> InteractionRecord:
        """Click the button ``custom_id`` that message ``message_id`` shows now, as a user
        (default: the one named ``username``): INTERACTION_CREATE goes to every session on
        the message's shard. Returns the record the bot's answers fill in. ``LookupError``
        if the message is gone or shows no such enabled button (Discord only takes clicks
        on components a message has); ``ValueError`` if the user cannot see the message (a
        DM's other party, an ephemeral answer to someone else)."""
        stored = self._messages.get(message_id)
        if stored is None or stored.deleted:
            raise LookupError(f"no message {message_id}")
        component = p.find_component(stored.payload.get("components"), custom_id)
        if component is None or component.get("type") != p.BUTTON or component.get("disabled"):
            raise LookupError(f"message {message_id} shows no enabled button {custom_id!r}")
        channel = self._channels[stored.channel_id]
        clicker = user_id if user_id is not None else self.add_user(username)
        if clicker not in self._users:
            self.add_user(username, user_id=clicker)
        if channel.type == p.DM and channel.recipient_id != clicker:
            raise ValueError(f"user {clicker} is not the recipient of DM {channel.id}")
        if stored.ephemeral_to is not None and stored.ephemeral_to != clicker:
            raise ValueError(f"message {message_id} is visible to {stored.ephemeral_to} only")
        member: JSON | None = None
        app_permissions = p.DM_APP_PERMISSIONS
        if channel.guild_id is not None:
            guild = self._guilds[channel.guild_id]
            self._join(guild, clicker)
            member = p.member_payload(guild.members[clicker], self._users[clicker])
            member["permissions"] = str(self._permissions(guild, clicker))
            app_permissions = self._permissions(guild, self.bot_user.id)
        interaction_id = self._ids.next()
        token = "aW50ZXJhY3Rpb246" + uuid.uuid4().hex + uuid.uuid4().hex
        payload = p.interaction_payload(
            interaction_id=interaction_id,
            token=token,
            application_id=self.bot_user.id,
            custom_id=custom_id,
            component_type=p.BUTTON,
            channel=p.channel_payload(channel, self._users),
            message=copy.deepcopy(stored.payload),
            guild_id=channel.guild_id,
            member=member,
            user=p.user_payload(self._users[clicker]),
            app_permissions=app_permissions,
            attachment_size_limit=self.max_upload_bytes,
        )
        record = InteractionRecord(
            id=interaction_id,
            token=token,
            application_id=self.bot_user.id,
            custom_id=custom_id,
            component_type=p.BUTTON,
            channel_id=channel.id,
            guild_id=channel.guild_id,
            message_id=message_id,
            user_id=clicker,
            created_at=self.now(),
            payload=payload,
        )
        self.interactions.append(record)
        for session in list(self.sessions):
            if self._on_shard(session, channel.guild_id):
                session.push("INTERACTION_CREATE", payload)
        self._notify()
        return record

    def interaction(self, interaction_id: int) -> InteractionRecord:
        """A click by its interaction id (``KeyError`` if unknown)."""
        for record in self.interactions:
            if record.id == interaction_id:
                return record
        raise KeyError(interaction_id)

    async def wait_for_response(
        self, record: InteractionRecord, seconds: float = 10.0
    ) -> InteractionRecord:
        """Wait until the bot's callback for the click was accepted; returns the record."""
        await self.wait_until(lambda: record.acknowledged, seconds, "interaction response")
        return record

    def now(self) -> float:
        """The fake's clock: ``clock()`` plus what ``advance_clock`` added."""
        return self.clock() + self._skew

    def advance_clock(self, seconds: float) -> None:
        """Let ``seconds`` pass for the fake (answer windows, token lifetime) at once."""
        self._skew += seconds
        self._notify()

    # ------------------------------------------------------------------ inspecting

    def sent(self, channel_id: int | None = None) -> list[SentMessage]:
        """Messages the bot created (optionally in one channel), oldest first."""
        return [m for m in self._sent if channel_id is None or m.channel_id == channel_id]

    def message(self, message_id: int) -> JSON:
        """The current message object (REST form) of any message, user's or bot's."""
        return copy.deepcopy(self._messages[message_id].payload)

    async def wait_until(
        self, predicate: Callable[[], bool], seconds: float = 10.0, what: str = "condition"
    ) -> None:
        """Wait until ``predicate()`` holds (re-checked after every request/gateway event)."""
        try:
            async with asyncio.timeout(seconds):
                while not predicate():
                    await self._tick.wait()
        except TimeoutError:
            raise TimeoutError(f"FakeDiscord: no {what} within {seconds}s") from None

    async def wait_for_sent(
        self, count: int, channel_id: int | None = None, seconds: float = 10.0
    ) -> list[SentMessage]:
        """Wait until the bot has sent ``count`` messages (in ``channel_id``); returns them."""
        await self.wait_until(
            lambda: len(self.sent(channel_id)) >= count, seconds, f"{count} sent message(s)"
        )
        return self.sent(channel_id)

    async def wait_for_ready(self, count: int = 1, seconds: float = 10.0) -> GatewaySession:
        """Wait until ``count`` READYs (each with its GUILD_CREATEs) have been sent in total;
        returns the newest session."""
        await self.wait_until(lambda: self.ready_count >= count, seconds, f"{count} READY")
        return self.sessions[-1]

    async def wait_for_resume(self, count: int = 1, seconds: float = 10.0) -> None:
        """Wait until ``count`` RESUMEs (over all sessions) have been answered."""
        await self.wait_until(
            lambda: sum(s.resumes for s in self.sessions) >= count, seconds, f"{count} RESUME(s)"
        )

    # ------------------------------------------------------------------ faults

    def fail_next(self, pattern: str, kind: Fault, times: int | None = 1) -> None:
        """Answer the next ``times`` REST calls matching ``pattern`` with ``kind``
        (``times=None``: every one from then on, until ``clear_faults``).

        ``pattern`` is an fnmatch pattern against ``"METHOD /path"`` (path without
        ``/api/v10``), e.g. ``"POST /channels/*/messages"``; a pattern starting with
        ``/`` matches any method. A channel's id in it scopes the fault to that chat:
        ``f"/channels/{dm}/*"`` fails one chat while the others work.
        """
        self._faults.append(_FaultRule(pattern, kind, times))

    def clear_faults(self) -> None:
        """Forget the faults not yet used, standing ones included."""
        self._faults.clear()

    async def disconnect_all(
        self, code: int = 4000, reason: str = "", *, abort: bool = False
    ) -> None:
        """Close every gateway socket with ``code`` (``abort``: drop the TCP connection without
        a close frame, like a network failure); sessions stay resumable and buffer events.

        discord.py resumes at once after a server's 1000, 1001, 4000-4003, 4005-4009 or an
        abort; 4004 and 4010-4014 are fatal to it (``ConnectionClosed``).
        """
        await asyncio.gather(*(c.close(code, reason, abort) for c in list(self._live)))

    @contextlib.asynccontextmanager
    async def outage(self, code: int = 4000, *, forget: bool = False) -> AsyncIterator[None]:
        """Disconnect everyone and hold new gateway connections before HELLO until exit.

        Messages injected inside are buffered per session and replayed on RESUME::

            async with fake.outage():
                fake.user_message(channel, "while you were away")
            await fake.wait_for_resume()

        ``forget``: the sessions are dropped too, as after an outage too long to resume: the
        client's RESUME gets INVALID_SESSION and it IDENTIFYs afresh (READY again), and
        what was sent meanwhile is only in the channels' history.
        """
        self._gate.clear()
        try:
            await self.disconnect_all(code)
            if forget:
                for session in list(self.sessions):
                    self._forget(session)
            yield
        finally:
            self._gate.set()

    async def invalidate_sessions(self, resumable: bool = False) -> None:
        """Send INVALID_SESSION (op 9) to every connected session; forget them unless resumable.

        discord.py then closes and IDENTIFYs afresh (READY, GUILD_CREATEs, on_ready again).
        """
        for conn in list(self._live):
            if conn.session is not None:
                conn.send_op(INVALID_SESSION, resumable)
                if not resumable:
                    self._forget(conn.session)

    def request_reconnect(self) -> None:
        """Send RECONNECT (op 7) to every connected session; discord.py closes and resumes."""
        for conn in list(self._live):
            if conn.session is not None:
                conn.send_op(RECONNECT, None)

    # ------------------------------------------------------------------ internals: state

    def _notify(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    def _join(
        self, guild: p.Guild, user_id: int, roles: list[int] | None = None, announce: bool = True
    ) -> None:
        """Make ``user_id`` a member; GUILD_MEMBER_ADD goes to GUILD_MEMBERS sessions."""
        if user_id in guild.members:
            return
        guild.members[user_id] = p.Member(user_id, p.now_iso(), roles or [])
        if announce:
            member = p.member_payload(guild.members[user_id], self._users[user_id])
            data = member | {"guild_id": str(guild.id)}
            self._dispatch_guild(guild.id, "GUILD_MEMBER_ADD", lambda _: data, p.GUILD_MEMBERS)

    def _guild_payload(self, guild_id: int, session: GatewaySession) -> JSON:
        """GUILD_CREATE; without GUILD_MEMBERS only the bot is listed, as on Discord."""
        guild = self._guilds[guild_id]
        members = list(guild.members.values())
        if not session.intents & p.GUILD_MEMBERS:
            members = [m for m in members if m.user_id == self.bot_user.id]
        return p.guild_create_payload(guild, self._channels, self._users, members)

    def _mentioned_users(self, content: str) -> list[int]:
        ids = [int(m) for m in USER_MENTION.findall(content)]
        return [i for i in dict.fromkeys(ids) if i in self._users]

    def _mentioned_roles(self, content: str, guild_id: int | None) -> list[int]:
        if guild_id is None:
            return []
        known = {r.id for r in self._guilds[guild_id].roles}
        return [
            i for i in dict.fromkeys(int(m) for m in ROLE_MENTION.findall(content)) if i in known
        ]

    def _mention_payloads(self, user_ids: list[int], guild_id: int | None) -> list[JSON]:
        guild = self._guilds.get(guild_id) if guild_id is not None else None
        unique = dict.fromkeys(user_ids)
        return [
            p.mention_payload(self._users[u], guild.members.get(u) if guild else None)
            for u in unique
        ]

    def _reference(self, message_id: int, channel: p.Channel) -> JSON:
        ref: JSON = {"type": 0, "message_id": str(message_id), "channel_id": str(channel.id)}
        if channel.guild_id is not None:
            ref["guild_id"] = str(channel.guild_id)
        return ref

    def _referenced(self, stored: _Stored) -> JSON | None:
        if stored.deleted:
            return None
        return {k: v for k, v in stored.payload.items() if k != "referenced_message"}

    def _store_file(
        self,
        channel_id: int,
        filename: str,
        data: bytes,
        content_type: str | None,
        extra: JSON | None = None,
    ) -> int:
        attachment_id = self._ids.next()
        kind = content_type or mimetypes.guess_type(filename)[0]
        self._files[attachment_id] = (filename, data, kind, channel_id)
        if extra:
            self._file_extras[attachment_id] = extra
        return attachment_id

    def _attachment_url(self, attachment_id: int, media: bool = False) -> str:
        filename, _, _, channel_id = self._files[attachment_id]
        expires = int(time.time()) + 86400
        query = f"ex={expires:x}&is={int(time.time()):x}&hm={uuid.uuid4().hex}&"
        prefix = "/media/attachments" if media else "/attachments"
        return f"{self.base_url}{prefix}/{channel_id}/{attachment_id}/{quote(filename)}?{query}"

    def _attachment_payload(self, attachment_id: int, description: str | None = None) -> JSON:
        filename, data, kind, _ = self._files[attachment_id]
        url = self._attachment_url(attachment_id)
        proxy = self._attachment_url(attachment_id, media=True)
        payload = p.attachment_payload(
            attachment_id, filename, len(data), content_type=kind, url=url, proxy_url=proxy
        )
        if description is not None:
            payload["description"] = description
        return payload | self._file_extras.get(attachment_id, {})

    def _record(
        self, payload: JSON, channel: p.Channel, author_id: int, ephemeral_to: int | None = None
    ) -> None:
        message_id = int(payload["id"])
        self._messages[message_id] = _Stored(payload, channel.id, author_id, False, ephemeral_to)
        if ephemeral_to is not None:  # not part of the channel
            return
        channel.last_message_id = message_id
        if channel.is_thread:
            channel.message_count += 1

    def _permissions(self, guild: p.Guild, user_id: int) -> int:
        """A member's permissions in the guild (no channel overwrites here)."""
        if user_id == guild.owner_id:
            return p.ALL_PERMISSIONS
        member = guild.members.get(user_id)
        roles = {guild.id, *(member.roles if member else [])}
        total = 0
        for role in guild.roles:
            total |= role.permissions if role.id in roles else 0
        return total

    # ------------------------------------------------------------------ internals: dispatch

    def _on_shard(self, session: GatewaySession, guild_id: int | None) -> bool:
        shard_id, count = session.shard
        if guild_id is None:
            return shard_id == 0
        return (guild_id >> 22) % count == shard_id

    def _dispatch_guild(
        self, guild_id: int, event: str, build: Callable[[GatewaySession], JSON], intent: int
    ) -> None:
        targets = [
            s for s in list(self.sessions) if s.intents & intent and self._on_shard(s, guild_id)
        ]
        if not targets:
            return
        for session in targets:
            session.push(event, build(session))
        self._notify()

    def _gateway_message(self, payload: JSON, channel: p.Channel) -> JSON:
        data = copy.deepcopy(payload)
        if channel.guild_id is not None:
            data["guild_id"] = str(channel.guild_id)
            author = int(data["author"]["id"])
            member = self._guilds[channel.guild_id].members.get(author)
            if member is not None:
                data["member"] = p.member_payload(member)
        return data

    def _dispatch_message(self, event: str, payload: JSON, channel: p.Channel) -> None:
        data = self._gateway_message(payload, channel) if event != "MESSAGE_DELETE" else payload
        intent = p.DIRECT_MESSAGES if channel.guild_id is None else p.GUILD_MESSAGES
        author = int(payload.get("author", {}).get("id", 0))
        mentioned = any(int(u["id"]) == self.bot_user.id for u in payload.get("mentions", []))
        for session in list(self.sessions):
            if not session.intents & intent or not self._on_shard(session, channel.guild_id):
                continue
            visible = (
                session.intents & p.MESSAGE_CONTENT
                or channel.guild_id is None
                or author == self.bot_user.id
                or mentioned
                or event == "MESSAGE_DELETE"
            )
            if visible:
                session.push(event, data)
            else:
                hidden = {"content": "", "embeds": [], "attachments": [], "components": []}
                session.push(event, data | hidden)
        self._notify()

    def _forget(self, session: GatewaySession) -> None:
        with contextlib.suppress(ValueError):
            self.sessions.remove(session)

    # ------------------------------------------------------------------ REST plumbing

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        done = asyncio.get_running_loop().create_future()
        self._inflight.add(done)
        try:
            return await self._handle(request, handler)
        finally:
            done.set_result(None)
            self._inflight.discard(done)

    async def _handle(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        if not request.path.startswith(API_PREFIX + "/"):
            response: web.StreamResponse = await handler(request)
            return response
        path = request.path.removeprefix(API_PREFIX)
        self._bodies[id(request)] = parsed = await self._read_body(request)
        try:
            return await self._api(request, handler, path, parsed.data)
        finally:
            del self._bodies[id(request)]

    async def _api(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Any],
        path: str,
        body: Any,
    ) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = f"{request.method} {resource.canonical if resource else path}"
        fault = self._take_fault(request.method, path)
        self.requests.append(
            RestRequest(
                request.method,
                path,
                dict(request.query),
                body,
                dict(request.headers),
                time.monotonic(),
                type(fault).__name__ if fault else None,
            )
        )
        self._notify()
        if path != "/gateway" and not WEBHOOK_PATH.match(path) and not self._authorized(request):
            return _json({"message": "401: Unauthorized", "code": 0}, 401, {"Via": "1.1 google"})
        if fault is not None:
            return await self._fault_response(request, fault, route)
        response: web.StreamResponse = await handler(request)
        response.headers["Via"] = "1.1 google"
        if 200 <= response.status < 300 and path not in ("/gateway", "/gateway/bot"):
            response.headers.update(self._ratelimit_headers(route, 5, 4, 1.0))
        self._notify()
        return response

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bot ")
        if not header.startswith("Bot ") or not token:
            return False
        return self.token is None or token == self.token

    @staticmethod
    async def _read_body(request: web.Request) -> _Body:
        """The JSON body, or for multipart ``payload_json`` and the ``files[n]`` parts."""
        if request.content_type == "multipart/form-data":
            parsed = _Body({})
            for name, value in (await request.post()).items():
                if isinstance(value, web.FileField):
                    upload = (name, value.filename, value.file.read(), value.content_type)
                    parsed.files.append(upload)
                elif name == "payload_json":
                    parsed.data = json.loads(str(value))
            return parsed
        raw = await request.read()
        try:
            return _Body(json.loads(raw) if raw else None)
        except ValueError:
            return _Body(raw.decode(errors="replace"))

    def _body(self, request: web.Request) -> JSON:
        """The request's JSON object (``{}`` if it sent something else)."""
        data = self._bodies[id(request)].data
        return data if isinstance(data, dict) else {}

    def _take_fault(self, method: str, path: str) -> Fault | None:
        subject = f"{method} {path}"
        for rule in self._faults:
            target = path if rule.pattern.startswith("/") else subject
            if fnmatch.fnmatchcase(target, rule.pattern):
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self._faults.remove(rule)
                return rule.fault
        return None

    @staticmethod
    def _ratelimit_headers(route: str, limit: int, remaining: int, reset: float) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(limit),
            "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": f"{time.time() + reset:.3f}",
            "X-RateLimit-Reset-After": f"{reset:.3f}",
            "X-RateLimit-Bucket": p.bucket_hash(route),
        }

    async def _fault_response(
        self, request: web.Request, fault: Fault, route: str
    ) -> web.StreamResponse:
        match fault:
            case RateLimited(retry_after=after, global_=is_global, scope=scope):
                headers = {"Retry-After": str(math.ceil(after)), "Via": "1.1 google"}
                if is_global:
                    headers |= {"X-RateLimit-Global": "true", "X-RateLimit-Scope": "global"}
                else:
                    headers |= self._ratelimit_headers(route, 5, 0, after)
                    headers["X-RateLimit-Scope"] = scope
                body = {"message": "You are being rate limited.", "retry_after": after}
                return _json(body | {"global": is_global}, 429, headers)
            case ServerError(status=status) if status in (502, 504):
                html = f"<html><head><title>{status}</title></head><body>{status}</body></html>"
                return web.Response(text=html, status=status, content_type="text/html")
            case ServerError(status=status):
                return _json({"message": f"{status}: Internal Server Error", "code": 0}, status)
            case HttpError(status=status, code=code, message=message, errors=errors):
                body = p.error_body(code, message, errors)
                return _json(body, status, {"Via": "1.1 google"})
            case Garbled(body=body):
                return web.Response(
                    body=body.encode(), headers={"Content-Type": "application/json"}
                )
        await self._stopping.wait()  # Hang
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=499)

    # ------------------------------------------------------------------ REST handlers

    async def _unknown(self, request: web.Request) -> web.Response:
        self.unhandled.append(f"{request.method} {request.path.removeprefix(API_PREFIX)}")
        return _json({"message": "404: Not Found", "code": 0}, 404)

    async def _get_me(self, request: web.Request) -> web.Response:
        return _json(p.self_user_payload(self.bot_user))

    async def _get_user(self, request: web.Request) -> web.Response:
        user = self._users.get(_int(request.match_info["user_id"]) or 0)
        if user is None:
            return _error(404, 10013, "Unknown User")
        return _json(p.user_payload(user))

    async def _application(self, request: web.Request) -> web.Response:
        bot = self.bot_user
        owner = self._users[self.add_user("ada")]
        return _json(
            {
                "id": str(bot.id),
                "name": bot.username,
                "icon": None,
                "description": "",
                "summary": "",
                "type": None,
                "hook": True,
                "bot_public": True,
                "bot_require_code_grant": False,
                "verify_key": "0" * 64,
                "flags": self.application_flags,
                "owner": p.user_payload(owner),
                "team": None,
                "bot": p.user_payload(bot),
                "redirect_uris": [],
                "interactions_endpoint_url": None,
                "tags": [],
                "integration_types_config": {"0": {}},
                "approximate_guild_count": len(self._guilds),
            }
        )

    async def _get_gateway(self, request: web.Request) -> web.Response:
        return _json({"url": self.gateway_url})

    async def _get_gateway_bot(self, request: web.Request) -> web.Response:
        limit = {"total": 1000, "remaining": 999, "reset_after": 86_400_000, "max_concurrency": 1}
        return _json({"url": self.gateway_url, "shards": 1, "session_start_limit": limit})

    def _channel_or_404(self, request: web.Request) -> p.Channel | web.Response:
        channel = self._channels.get(_int(request.match_info["channel_id"]) or 0)
        return channel if channel is not None else _error(404, 10003, "Unknown Channel")

    async def _get_channel(self, request: web.Request) -> web.Response:
        channel = self._channel_or_404(request)
        if isinstance(channel, web.Response):
            return channel
        return _json(p.channel_payload(channel, self._users))

    async def _create_dm(self, request: web.Request) -> web.Response:
        body = self._body(request)
        user_id = _int(body.get("recipient_id"))
        if user_id is None:
            return _json(
                p.form_error("recipient_id", "BASE_TYPE_REQUIRED", "This field is required"), 400
            )
        if user_id not in self._users:
            return _error(400, 50007, "Cannot send messages to this user")
        channel = self._channels[self.dm_channel(user_id)]
        return _json(p.channel_payload(channel, self._users))

    async def _typing(self, request: web.Request) -> web.Response:
        channel = self._channel_or_404(request)
        if isinstance(channel, web.Response):
            return channel
        self.typing.append(channel.id)
        return web.Response(status=204)

    def _message_or_404(self, request: web.Request, channel: p.Channel) -> _Stored | web.Response:
        stored = self._messages.get(_int(request.match_info["message_id"]) or 0)
        if (
            stored is None
            or stored.deleted
            or stored.channel_id != channel.id
            or stored.ephemeral_to is not None  # reached through the interaction's webhook only
        ):
            return _error(404, 10008, "Unknown Message")
        return stored

    async def _get_message(self, request: web.Request) -> web.Response:
        channel = self._channel_or_404(request)
        if isinstance(channel, web.Response):
            return channel
        stored = self._message_or_404(request, channel)
        if isinstance(stored, web.Response):
            return stored
        return _json(stored.payload)

    async def _history(self, request: web.Request) -> web.Response:
        channel = self._channel_or_404(request)
        if isinstance(channel, web.Response):
            return channel
        limit = min(max(_int(request.query.get("limit")) or 50, 1), 100)
        before, after = _int(request.query.get("before")), _int(request.query.get("after"))
        ids = sorted(
            (
                i
                for i, s in self._messages.items()
                if s.channel_id == channel.id and not s.deleted and s.ephemeral_to is None
            ),
            reverse=True,
        )
        if before is not None:
            ids = [i for i in ids if i < before]
        if after is not None:
            ids = [i for i in ids if i > after][-limit:]
        return _json([self._messages[i].payload for i in ids[:limit]])

    def _files_of(
        self, request: web.Request, body: JSON, channel_id: int
    ) -> list[SentAttachment] | web.Response:
        """Store the uploaded ``files[n]``, matched to ``attachments[].id == n``."""
        described = {
            _int(a.get("id")): a for a in body.get("attachments") or [] if isinstance(a, dict)
        }
        result: list[SentAttachment] = []
        for name, uploaded_name, data, uploaded_kind in self._bodies[id(request)].files:
            if len(data) > self.max_upload_bytes:
                return _error(413, 40005, "Request entity too large")
            index = _int(name.removeprefix("files[").removesuffix("]"))
            meta = described.get(index, {})
            filename = str(meta.get("filename") or uploaded_name)
            kind = uploaded_kind
            if kind in (None, "application/octet-stream"):
                kind = mimetypes.guess_type(filename)[0] or kind
            attachment_id = self._store_file(channel_id, filename, data, kind)
            url = self._attachment_url(attachment_id)
            result.append(
                SentAttachment(attachment_id, filename, data, kind, url, meta.get("description"))
            )
        return result

    def _pings(
        self, content: str, allowed: JSON | None, reference: _Stored | None, guild_id: int | None
    ) -> tuple[list[int], list[int], bool]:
        """(user ids, role ids, everyone) a bot message pings, after ``allowed_mentions``."""
        users, roles = self._mentioned_users(content), self._mentioned_roles(content, guild_id)
        everyone = "@everyone" in content or "@here" in content
        if allowed is None:
            replied = reference is not None
            parse: set[str] = {"users", "roles", "everyone"}
            allowed_users: set[int] = set()
            allowed_roles: set[int] = set()
        else:
            replied = bool(allowed.get("replied_user"))
            parse = set(allowed.get("parse") or [])
            allowed_users = {int(u) for u in allowed.get("users") or []}
            allowed_roles = {int(r) for r in allowed.get("roles") or []}
        users = [u for u in users if "users" in parse or u in allowed_users]
        roles = [r for r in roles if "roles" in parse or r in allowed_roles]
        if reference is not None and replied and reference.author_id not in users:
            users.append(reference.author_id)
        return users, roles, everyone and "everyone" in parse and guild_id is not None

    async def _create_message(self, request: web.Request) -> web.Response:
        channel = self._channel_or_404(request)
        if isinstance(channel, web.Response):
            return channel
        result = self._post_message(request, channel, self._body(request))
        return result if isinstance(result, web.Response) else _json(result)

    def _post_message(
        self,
        request: web.Request,
        channel: p.Channel,
        body: JSON,
        interaction: InteractionRecord | None = None,
        *,
        loading: bool = False,
    ) -> JSON | web.Response:
        """Create the bot's message from a message body (REST, an interaction's answer or
        follow-up); returns its payload or Discord's error."""
        content = body.get("content")
        content = "" if content is None else str(content)
        if len(content) > MAX_CONTENT:
            msg = f"Must be {MAX_CONTENT} or fewer in length."
            return _json(p.form_error("content", "BASE_TYPE_MAX_LENGTH", msg), 400)
        components = body.get("components")
        if components is not None and (error := p.components_error(components)) is not None:
            return _json(error, 400)
        embeds = [e for e in body.get("embeds") or [] if isinstance(e, dict)]
        if not (
            loading
            or content
            or embeds
            or components
            or self._bodies[id(request)].files
            or body.get("sticker_ids")
            or body.get("poll")
        ):
            return _error(400, 50006, "Cannot send an empty message")
        reference_body = body.get("message_reference")
        stored_ref: _Stored | None = None
        if interaction is not None and interaction.response_type is None:
            # an answer to a click replies to the clicked message
            reference_body = {"message_id": str(interaction.message_id)}
            stored_ref = self._messages[interaction.message_id]
        elif isinstance(reference_body, dict):
            stored_ref = self._messages.get(_int(reference_body.get("message_id")) or 0)
            if stored_ref is None or stored_ref.deleted:
                if reference_body.get("fail_if_not_exists", True):
                    return _json(
                        p.form_error(
                            "message_reference",
                            "MESSAGE_REFERENCE_UNKNOWN_MESSAGE",
                            "Unknown message",
                        ),
                        400,
                    )
                stored_ref = None
        files = self._files_of(request, body, channel.id)
        if isinstance(files, web.Response):
            return files
        allowed = body.get("allowed_mentions")
        allowed = allowed if isinstance(allowed, dict) else None
        users, roles, everyone = self._pings(content, allowed, stored_ref, channel.guild_id)
        message_id = self._ids.next()
        reference = (
            self._reference(int(stored_ref.payload["id"]), self._channels[stored_ref.channel_id])
            if stored_ref
            else None
        )
        flags = _int(body.get("flags")) or 0
        ephemeral_to = None
        if interaction is not None:
            flags = (flags & p.EPHEMERAL) | (p.LOADING if loading else 0)
            ephemeral_to = interaction.user_id if flags & p.EPHEMERAL else None
        payload = p.message_payload(
            message_id=message_id,
            channel=channel,
            author=self.bot_user,
            content=content,
            mentions=self._mention_payloads(users, channel.guild_id),
            mention_roles=roles,
            mention_everyone=everyone,
            attachments=[self._attachment_payload(f.id, f.description) for f in files],
            embeds=embeds,
            message_reference=reference,
            referenced_message=self._referenced(stored_ref) if stored_ref else None,
            tts=bool(body.get("tts")),
            flags=flags,
            nonce=body.get("nonce"),
            components=components,
        )
        if interaction is not None:
            payload |= {
                "webhook_id": str(interaction.application_id),
                "application_id": str(interaction.application_id),
                "interaction_metadata": {
                    "id": str(interaction.id),
                    "type": p.MESSAGE_COMPONENT,
                    "user": p.user_payload(self._users[interaction.user_id]),
                    "authorizing_integration_owners": {"0": str(interaction.guild_id or 0)},
                    "interacted_message_id": str(interaction.message_id),
                },
            }
        self._record(payload, channel, self.bot_user.id, ephemeral_to)
        self._sent.append(
            SentMessage(
                id=message_id,
                channel_id=channel.id,
                content=content,
                allowed_mentions=allowed,
                message_reference=reference_body if isinstance(reference_body, dict) else None,
                attachments=files,
                embeds=embeds,
                mentions=users,
                mention_everyone=everyone,
                payload=body,
                components=list(components or []),
                flags=flags,
                interaction_id=interaction.id if interaction is not None else None,
            )
        )
        if self.echo_own_messages and ephemeral_to is None:
            self._dispatch_message("MESSAGE_CREATE", payload, channel)
        return payload

    async def _edit_message(self, request: web.Request) -> web.Response:
        channel = self._channel_or_404(request)
        if isinstance(channel, web.Response):
            return channel
        stored = self._message_or_404(request, channel)
        if isinstance(stored, web.Response):
            return stored
        if stored.author_id != self.bot_user.id:
            return _error(403, 50005, "Cannot edit a message authored by another user")
        result = self._apply_edit(request, stored, channel, self._body(request))
        return result if isinstance(result, web.Response) else _json(result)

    def _apply_edit(
        self,
        request: web.Request,
        stored: _Stored,
        channel: p.Channel,
        body: JSON,
        *,
        finish_loading: bool = False,
    ) -> JSON | web.Response:
        """Edit the bot's message (REST PATCH, a click's UPDATE_MESSAGE, an ``@original``
        PATCH, which also ends a deferred answer's loading state); returns its payload or
        Discord's error."""
        payload = stored.payload
        if "content" in body:
            content = "" if body["content"] is None else str(body["content"])
            if len(content) > MAX_CONTENT:
                msg = f"Must be {MAX_CONTENT} or fewer in length."
                return _json(p.form_error("content", "BASE_TYPE_MAX_LENGTH", msg), 400)
        components = body.get("components")
        if components is not None and (error := p.components_error(components)) is not None:
            return _json(error, 400)
        files = self._files_of(request, body, channel.id)
        if isinstance(files, web.Response):
            return files
        if "content" in body:
            payload["content"] = content
        if "embeds" in body:
            payload["embeds"] = [e for e in body["embeds"] or [] if isinstance(e, dict)]
        if "components" in body:
            payload["components"] = list(components or [])
        if "attachments" in body:
            keep = {str(a.get("id")) for a in body["attachments"] or [] if isinstance(a, dict)}
            kept = [a for a in payload["attachments"] if a["id"] in keep]
            payload["attachments"] = kept + [
                self._attachment_payload(f.id, f.description) for f in files
            ]
        if "flags" in body:
            kept_flags = payload["flags"] & (p.EPHEMERAL | p.LOADING)  # not the sender's to set
            payload["flags"] = (_int(body["flags"]) or 0) & ~(p.EPHEMERAL | p.LOADING) | kept_flags
        if finish_loading:
            payload["flags"] &= ~p.LOADING
        payload["edited_timestamp"] = p.now_iso()
        sent = next((m for m in self._sent if m.id == int(payload["id"])), None)
        if sent is not None:
            sent.content = payload["content"]
            sent.edits.append(payload["content"])
            sent.edit_payloads.append(body)
            sent.embeds = payload["embeds"]
            sent.components = payload["components"]
            current = {a["id"] for a in payload["attachments"]}
            sent.attachments = [a for a in [*sent.attachments, *files] if str(a.id) in current]
        if stored.ephemeral_to is None:
            self._dispatch_message("MESSAGE_UPDATE", payload, channel)
        return payload

    async def _delete_message(self, request: web.Request) -> web.Response:
        channel = self._channel_or_404(request)
        if isinstance(channel, web.Response):
            return channel
        stored = self._message_or_404(request, channel)
        if isinstance(stored, web.Response):
            return stored
        self._remove(stored, channel)
        return web.Response(status=204)

    def _remove(self, stored: _Stored, channel: p.Channel) -> None:
        stored.deleted = True
        for sent in self._sent:
            if sent.id == int(stored.payload["id"]):
                sent.deleted = True
        if stored.ephemeral_to is not None:
            return
        data: JSON = {"id": stored.payload["id"], "channel_id": str(channel.id)}
        if channel.guild_id is not None:
            data["guild_id"] = str(channel.guild_id)
        self._dispatch_message("MESSAGE_DELETE", data, channel)

    # ------------------------------------------------------------------ interactions

    def _refuse(
        self, record: InteractionRecord, status: int, code: int, message: str
    ) -> web.Response:
        record.refusals.append((status, code))
        self._notify()
        return _error(status, code, message)

    async def _interaction_callback(self, request: web.Request) -> web.Response:
        record = self._answerable(request)
        if isinstance(record, web.Response):
            return record
        body = self._body(request)
        message = self._perform_callback(request, record, body)
        if isinstance(message, web.Response):
            return message
        record.response_type, record.response = int(body["type"]), body
        record.responded_at = self.now()
        self._notify()
        if request.query.get("with_response", "").lower() not in ("1", "true"):
            return web.Response(status=204)
        kind = record.response_type
        callback: JSON = {"id": str(record.id), "type": p.MESSAGE_COMPONENT}
        if record.original_id is not None and kind != p.DEFERRED_UPDATE_MESSAGE:
            callback["response_message_id"] = str(record.original_id)
            callback["response_message_loading"] = kind == p.DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE
            callback["response_message_ephemeral"] = record.ephemeral
        answer: JSON = {"interaction": callback}
        if message is not None and kind in (p.CHANNEL_MESSAGE_WITH_SOURCE, p.UPDATE_MESSAGE):
            answer["resource"] = {"type": kind, "message": message}
        return _json(answer)

    def _answerable(self, request: web.Request) -> InteractionRecord | web.Response:
        """The click a callback answers, or Discord's refusal (unknown, answered, too late,
        a callback type a component interaction cannot take)."""
        wanted = _int(request.match_info["interaction_id"])
        record = next((r for r in self.interactions if r.id == wanted), None)
        if record is None or record.token != request.match_info["token"]:
            return _error(404, 10062, "Unknown interaction")
        if record.acknowledged:
            return self._refuse(record, 400, 40060, "Interaction has already been acknowledged.")
        if self.now() - record.created_at > self.interaction_timeout:
            return self._refuse(record, 404, 10062, "Unknown interaction")
        if self._body(request).get("type") not in p.COMPONENT_CALLBACKS:
            choices = "{" + ", ".join(map(str, p.COMPONENT_CALLBACKS)) + "}"
            msg = f"Value must be one of {choices}."
            return _json(p.form_error("type", "BASE_TYPE_CHOICES", msg), 400)
        return record

    def _perform_callback(
        self, request: web.Request, record: InteractionRecord, body: JSON
    ) -> JSON | web.Response | None:
        """Do what the callback asks; returns the message it posted or edited (None for 6
        and 9), or Discord's error (the click stays unanswered then)."""
        kind, data = body["type"], body.get("data")
        data = data if isinstance(data, dict) else {}
        channel = self._channels[record.channel_id]
        if kind in (p.CHANNEL_MESSAGE_WITH_SOURCE, p.DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE):
            loading = kind == p.DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE
            shown = {"flags": data.get("flags")} if loading else data
            posted = self._post_message(request, channel, shown, record, loading=loading)
            if not isinstance(posted, web.Response):
                record.original_id = int(posted["id"])
            return posted
        if kind not in (p.DEFERRED_UPDATE_MESSAGE, p.UPDATE_MESSAGE):
            return None  # a modal: recorded only
        stored = self._messages[record.message_id]
        if stored.deleted:
            return _error(404, 10008, "Unknown Message")
        edited = (
            self._apply_edit(request, stored, channel, data) if kind == p.UPDATE_MESSAGE else None
        )
        if not isinstance(edited, web.Response):
            record.original_id = record.message_id
        return edited

    def _webhook_record(self, request: web.Request) -> InteractionRecord | web.Response:
        """The click whose token the webhook path carries, while the token is valid."""
        token = request.match_info["token"]
        record = next((r for r in self.interactions if r.token == token), None)
        if record is None or record.application_id != _int(request.match_info["application_id"]):
            return _error(404, 10015, "Unknown Webhook")
        if self.now() - record.created_at > self.interaction_token_ttl:
            return _error(401, 50027, "Invalid Webhook Token")
        return record

    async def _followup(self, request: web.Request) -> web.Response:
        record = self._webhook_record(request)
        if isinstance(record, web.Response):
            return record
        if not record.acknowledged:
            return _error(404, 10015, "Unknown Webhook")
        channel = self._channels[record.channel_id]
        result = self._post_message(request, channel, self._body(request), record)
        if isinstance(result, web.Response):
            return result
        record.followups.append(int(result["id"]))
        self._notify()
        return _json(result)

    async def _webhook_message(self, request: web.Request) -> web.Response:
        record = self._webhook_record(request)
        if isinstance(record, web.Response):
            return record
        name = request.match_info["message_id"]
        message_id = record.original_id if name == "@original" else _int(name)
        stored = self._messages.get(message_id or 0)
        if (
            stored is None
            or stored.deleted
            or message_id not in (record.original_id, *record.followups)
        ):
            return _error(404, 10008, "Unknown Message")
        channel = self._channels[stored.channel_id]
        if request.method == "GET":
            return _json(stored.payload)
        if request.method == "DELETE":
            self._remove(stored, channel)
            return web.Response(status=204)
        result = self._apply_edit(
            request, stored, channel, self._body(request), finish_loading=True
        )
        return result if isinstance(result, web.Response) else _json(result)

    async def _react(self, request: web.Request) -> web.Response:
        channel = self._channel_or_404(request)
        if isinstance(channel, web.Response):
            return channel
        stored = self._message_or_404(request, channel)
        if isinstance(stored, web.Response):
            return stored
        emoji = request.match_info["emoji"]
        added = request.method == "PUT"
        self.reactions.append(Reaction(channel.id, int(stored.payload["id"]), emoji, added))
        return web.Response(status=204)

    async def _download(self, request: web.Request) -> web.Response:
        self.downloads.append(request.path)
        found = self._files.get(_int(request.match_info["attachment_id"]) or 0)
        if found is None:
            return web.Response(status=404, text="This content is no longer available.")
        _, data, kind, _ = found
        return web.Response(body=data, content_type=kind or "application/octet-stream")

    # ------------------------------------------------------------------ gateway

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        wants_zlib = query.get("compress") == "zlib-stream" and self.compress
        info = GatewayConnection(query, "zlib-stream" if wants_zlib else None)
        ws = web.WebSocketResponse(timeout=2.0, max_msg_size=0)
        await ws.prepare(request)
        conn = _Connection(ws, info, request.transport)
        self.connections.append(info)
        self._live.add(conn)
        writer = asyncio.create_task(conn.run_writer())
        try:
            if query.get("v", "10") != "10":
                await conn.close(4012, "Invalid API version")
            elif query.get("encoding", "json") != "json":
                await conn.close(4002, "Error while decoding payload.")
            elif await self._wait_gate():
                await self._serve(conn)
        finally:
            self._live.discard(conn)
            if not conn.server_closed:
                code = ws.close_code
                info.close_code, info.closed_by = None if code is None else int(code), "client"
            session = conn.session
            if session is not None and session._conn is conn:
                session._conn = None
                if not conn.server_closed and ws.close_code in (1000, 1001):
                    self._forget(session)  # a client's clean close ends its session
            conn.finish()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            if conn.server_closed and request.transport is not None:
                request.transport.close()  # don't linger for a close reply that may never come
            self._notify()
        return ws

    async def _wait_gate(self) -> bool:
        """Hold a new connection during an ``outage``; False if the fake is stopping."""
        while not self._gate.is_set() and not self._stopping.is_set():
            gate = asyncio.ensure_future(self._gate.wait())
            stop = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait([gate, stop], return_when=asyncio.FIRST_COMPLETED)
            gate.cancel()
            stop.cancel()
        return not self._stopping.is_set()

    async def _serve(self, conn: _Connection) -> None:
        trace = ['["gateway-prd-fake-0",{"micros":0.0}]']
        conn.send_op(HELLO, {"heartbeat_interval": self.heartbeat_interval_ms, "_trace": trace})
        async for msg in conn.ws:
            if msg.type is not web.WSMsgType.TEXT:
                await conn.close(4002, "Error while decoding payload.")
                return
            try:
                frame = json.loads(msg.data)
                op = int(frame["op"])
            except (ValueError, KeyError, TypeError):
                await conn.close(4002, "Error while decoding payload.")
                return
            conn.info.ops.append(op)
            await self._on_op(conn, op, frame.get("d"))
            self._notify()

    async def _on_op(self, conn: _Connection, op: int, data: Any) -> None:
        if op == HEARTBEAT:
            self.heartbeats += 1
            conn.send_op(HEARTBEAT_ACK, None)
        elif op == IDENTIFY:
            await self._identify(conn, data if isinstance(data, dict) else {})
        elif op == RESUME:
            await self._resume(conn, data if isinstance(data, dict) else {})
        elif conn.session is None:
            await conn.close(4003, "Not authenticated.")
        elif op == PRESENCE_UPDATE:
            self.presences.append(data)
        elif op == REQUEST_MEMBERS:
            self._members_chunk(conn.session, data if isinstance(data, dict) else {})
        elif op == VOICE_STATE_UPDATE:
            pass
        else:
            await conn.close(4001, "Unknown opcode.")

    def _token_ok(self, token: Any) -> bool:
        return isinstance(token, str) and bool(token) and self.token in (None, token)

    async def _identify(self, conn: _Connection, data: JSON) -> None:
        if conn.session is not None:
            await conn.close(4005, "Already authenticated.")
            return
        if not self._token_ok(data.get("token")):
            await conn.close(4004, "Authentication failed.")
            return
        intents = data.get("intents")
        if not isinstance(intents, int) or intents < 0:
            await conn.close(4013, "Invalid intent(s).")
            return
        if intents & p.PRIVILEGED_INTENTS and not self.privileged_intents:
            await conn.close(4014, "Disallowed intent(s).")
            return
        shard_data = data.get("shard") or [0, 1]
        shard = (int(shard_data[0]), int(shard_data[1]))
        if not 0 <= shard[0] < shard[1]:
            await conn.close(4010, "Invalid shard.")
            return
        session = GatewaySession(uuid.uuid4().hex, data, intents, shard)
        conn.session, session._conn = session, conn
        guilds = [g for g in self._guilds if self._on_shard(session, g)]
        ready: JSON = {
            "v": 10,
            "user": p.self_user_payload(self.bot_user),
            "user_settings": {},
            "session_type": "normal",
            "session_id": session.session_id,
            "resume_gateway_url": self.gateway_url,
            "guilds": [{"id": str(g), "unavailable": True} for g in guilds],
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "guild_join_requests": [],
            "geo_ordered_rtc_regions": ["us-east", "us-central"],
            "auth": {},
            "application": {"id": str(self.bot_user.id), "flags": self.application_flags},
            "_trace": ['["gateway-prd-fake-0",{"micros":0.0}]'],
        }
        if "shard" in data:
            ready["shard"] = list(shard)
        session.push("READY", ready)
        if intents & p.GUILDS:
            for guild_id in guilds:
                session.push("GUILD_CREATE", self._guild_payload(guild_id, session))
        self.sessions.append(session)
        self.ready_count += 1

    async def _resume(self, conn: _Connection, data: JSON) -> None:
        session = next((s for s in self.sessions if s.session_id == data.get("session_id")), None)
        if session is None or not self._token_ok(data.get("token")) or conn.session is not None:
            conn.send_op(INVALID_SESSION, False)
            return
        seq = _int(data.get("seq")) or 0
        if seq > session.seq:
            await conn.close(4007, "Invalid seq.")
            return
        old = session._conn
        conn.session, session._conn = session, conn
        if old is not None and old is not conn:
            old.session = None
            task = asyncio.create_task(old.close(4000, "Session resumed elsewhere."))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        for frame in session.frames:
            if frame["s"] > seq:
                conn.send(frame)
        session.resumes += 1
        session.push("RESUMED", {"_trace": ['["gateway-prd-fake-0",{"micros":0.0}]']})

    def _members_chunk(self, session: GatewaySession, data: JSON) -> None:
        guild = self._guilds.get(_int(data.get("guild_id")) or 0)
        if guild is None:
            return
        members = list(guild.members.values())
        query = data.get("query")
        if data.get("user_ids"):
            wanted = {int(u) for u in data["user_ids"]}
            members = [m for m in members if m.user_id in wanted]
        elif query:
            members = [m for m in members if self._users[m.user_id].username.startswith(query)]
        if limit := _int(data.get("limit")):
            members = members[:limit]
        chunk: JSON = {
            "guild_id": str(guild.id),
            "members": [p.member_payload(m, self._users[m.user_id]) for m in members],
            "chunk_index": 0,
            "chunk_count": 1,
            "not_found": [],
        }
        if data.get("nonce"):
            chunk["nonce"] = data["nonce"]
        session.push("GUILD_MEMBERS_CHUNK", chunk)

    # ------------------------------------------------------------------ HTTP control API

    async def _control_user_message(self, request: web.Request) -> web.Response:
        body = await request.json()
        options = {
            k: body[k] for k in ("user_id", "username", "mentions_bot", "reply_to") if k in body
        }
        message_id = self.user_message(int(body["channel_id"]), str(body["content"]), **options)
        return web.json_response({"id": str(message_id)})

    async def _control_user_voice_message(self, request: web.Request) -> web.Response:
        body = await request.json()
        names = ("duration_secs", "waveform", "user_id", "username", "reply_to")
        options = {k: body[k] for k in names if k in body}
        data = base64.b64decode(body["content_base64"])
        message_id = self.user_voice_message(int(body["channel_id"]), data, **options)
        return web.json_response({"id": str(message_id)})

    async def _control_sent(self, request: web.Request) -> web.Response:
        channel = _int(request.query.get("channel_id"))
        return web.json_response([_sent_json(m) for m in self.sent(channel)])

    async def _control_click(self, request: web.Request) -> web.Response:
        body = await request.json()
        user = _int(body.get("user_id"))
        record = self.click(
            int(body["message_id"]),
            str(body["custom_id"]),
            user_id=user,
            username=str(body.get("username", "ada")),
        )
        return web.json_response({"id": str(record.id), "token": record.token})

    async def _control_interactions(self, request: web.Request) -> web.Response:
        return web.json_response([_interaction_json(r) for r in self.interactions])

    async def _control_advance_clock(self, request: web.Request) -> web.Response:
        self.advance_clock(float((await request.json())["seconds"]))
        return web.json_response({"ok": True})

    async def _control_state(self, request: web.Request) -> web.Response:
        guilds = [
            {
                "id": str(g.id),
                "name": g.name,
                "channels": [
                    {"id": str(c), "name": self._channels[c].name, "type": self._channels[c].type}
                    for c in g.channel_ids
                ],
            }
            for g in self._guilds.values()
        ]
        sessions = [
            {"session_id": s.session_id, "seq": s.seq, "connected": s.connected}
            for s in self.sessions
        ]
        dms = {str(user): str(channel) for user, channel in self._dms.items()}
        state = {"bot_user_id": str(self.bot_user.id), "guilds": guilds, "dms": dms}
        return web.json_response(state | {"sessions": sessions, "typing": self.typing})


def _sent_json(message: SentMessage) -> JSON:
    return {
        "id": str(message.id),
        "channel_id": str(message.channel_id),
        "content": message.content,
        "allowed_mentions": message.allowed_mentions,
        "message_reference": message.message_reference,
        "mentions": [str(u) for u in message.mentions],
        "attachments": [a.filename for a in message.attachments],
        "edits": message.edits,
        "deleted": message.deleted,
        "components": message.components,
        "ephemeral": message.ephemeral,
        "interaction_id": str(message.interaction_id) if message.interaction_id else None,
    }


def _interaction_json(record: InteractionRecord) -> JSON:
    return {
        "id": str(record.id),
        "custom_id": record.custom_id,
        "message_id": str(record.message_id),
        "channel_id": str(record.channel_id),
        "user_id": str(record.user_id),
        "response_type": record.response_type,
        "response": record.response,
        "ephemeral": record.ephemeral,
        "original_id": str(record.original_id) if record.original_id else None,
        "followups": [str(m) for m in record.followups],
        "refusals": [list(r) for r in record.refusals],
    }


async def _serve(fake: FakeDiscord, guild_name: str, channel_names: Sequence[str]) -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    async with fake:
        guild = fake.add_guild(guild_name)
        channels: Mapping[str, str] = {
            name: str(fake.add_channel(guild, name)) for name in channel_names
        }
        info = {
            "api_base": fake.api_base,
            "gateway_url": fake.gateway_url,
            "bot_user_id": str(fake.bot_user.id),
            "guild_id": str(guild),
            "channels": channels,
        }
        print(json.dumps(info), flush=True)
        await stopped.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: ``python -m tests.fakes.discord [--port N] [--guild NAME] [--channel NAME]...``."""
    parser = argparse.ArgumentParser(description="Fake Discord REST API and gateway.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", help="the only bot token accepted (default: any)")
    parser.add_argument("--guild", default="home", help="name of the guild to create")
    parser.add_argument("--channel", action="append", help="text channel(s) to create")
    parser.add_argument("--heartbeat-ms", type=int, default=41250)
    parser.add_argument(
        "--interaction-timeout", type=float, default=3.0, help="seconds to answer a click"
    )
    args = parser.parse_args(argv)
    fake = FakeDiscord(
        host=args.host,
        port=args.port,
        token=args.token,
        heartbeat_interval_ms=args.heartbeat_ms,
        interaction_timeout=args.interaction_timeout,
    )
    asyncio.run(_serve(fake, args.guild, args.channel or ["general"]))


if __name__ == "__main__":
    main()
