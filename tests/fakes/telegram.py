"""A fake Telegram Bot API server that python-telegram-bot (PTB) talks to via ``base_url``.

In process (it serves in the caller's loop, so a gateway the test runs can reach it)::

    async with FakeTelegram() as fake:
        app = (Application.builder().token(DEFAULT_TOKEN)  # any "123:abc" token works
               .base_url(f"{fake.base_url}/bot").base_file_url(f"{fake.base_url}/file/bot")
               .build())
        ...  # add an echoing handler, start the app and its updater's polling
        fake.user_message(42, "a < b", user_id=42)
        [reply] = await fake.wait_for_sent(1, chat_id=42)
        assert reply.visible == "echo: a < b"  # reply.text is the HTML as sent

Requests arrive as ``POST /bot<token>/<method>`` (JSON, urlencoded or multipart; form
values may be JSON strings) and file downloads as ``GET /file/bot<token>/<file_path>``;
answers are ``{"ok": true, "result": ...}`` or Telegram's error object. Implemented:
getMe, getUpdates (long polling, offsets, a newer long poll terminates the older one with
409 as Telegram does, and 409 while a webhook is set), set/deleteWebhook and getWebhookInfo
(see below), set/delete/getMyCommands, sendMessage and editMessageText (HTML validated, see
``_telegram_html``), sendMessageDraft, sendChatAction, getFile, sendPhoto/Document/Voice/
Audio/Video, deleteMessage, editMessageReplyMarkup, answerCallbackQuery, setMessageReaction.
Method names are case-insensitive; an unknown one gets Telegram's 404 "Not Found".

Inline keyboards (``reply_markup`` with ``inline_keyboard``) are validated as Telegram does
(``callback_data`` at most 64 bytes, else 400 "BUTTON_DATA_INVALID"; a button with no action,
an empty ``callback_data`` included, is refused as a "text button") and kept on the message;
an edit without ``reply_markup``, or with an empty keyboard, removes it, as on Telegram. A test
presses a button with ``press_button`` (a ``callback_query`` update, as Telegram sends it);
answerCallbackQuery accepts one answer per query, within ``callback_timeout`` seconds of the
press (Telegram's unpublished window; the fake's clock is injectable and ``advance_clock``
moves it), and refuses a second one, a late one or an unknown id with Telegram's 400 "query
is too old and response timeout expired or query ID is invalid".

A webhook (setWebhook) is posted every pending update, oldest first, one at a time, as JSON
with the secret token in ``X-Telegram-Bot-Api-Secret-Token``; a 2xx acknowledges it, anything
else has it posted again after ``webhook_retry`` seconds (``deliveries`` lists every attempt,
getWebhookInfo shows the last error). Like Telegram, setWebhook takes only HTTPS URLs on ports
443, 80, 88 or 8443 whose host resolves: ``route_webhook`` plays the reverse proxy that takes a
public origin to a local server (see ``_telegram_webhook``). ``post_update`` posts one body
(any bytes, any secret) at once, outside the queue.

Users send files as Telegram's clients do: ``user_document``, ``user_photo``, ``user_voice``
(a voice note, with a caption if given), ``user_audio`` (a music file) and
``user_video_note``; each file is served by getFile and ``/file/bot<token>/<file_path>``,
and getFile refuses one over 20 MB with "Bad Request: file is too big" (its declared
``file_size`` may exceed the bytes the test holds).

Standalone: ``python -m tests.fakes.telegram [--port N] [--token T]`` prints the base URL
and serves until SIGTERM. Control API: ``POST /_fake/<user_message|user_photo|user_document|
user_voice|user_audio|user_video_note|user_callback>`` with the keyword arguments as JSON
(``content_base64`` for bytes) returns ``{"update_id"}``; ``POST /_fake/press_button``
returns the query's ``{"id", "update_id"}``, ``GET /_fake/callbacks`` lists the presses and
their answers, ``POST /_fake/advance_clock`` takes ``{"seconds"}``, ``POST
/_fake/route_webhook`` ``{"public", "local"}``, ``GET /_fake/deliveries`` lists the webhook's
posts;
``POST /_fake/fail_next`` takes ``{"method", "fault": {"type": "RateLimited",
"retry_after": 2}, "times", "chat_id"}`` (``"times": null``: until ``POST
/_fake/clear_faults``); ``POST /_fake/offline`` takes ``{"offline": bool}``;
``GET /_fake/sent[?chat_id=]``, ``/_fake/actions``, ``/_fake/requests`` and
``/_fake/updates`` (unconfirmed) list what happened.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import json
import re
import signal
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Required, Self, TypedDict, Unpack

import aiohttp
from aiohttp import web

from tests.fakes import audio
from tests.fakes._telegram_html import HtmlError, parse_html, utf16_len
from tests.fakes._telegram_webhook import Delivery, Routes, Webhook, post, refusal

JSON = dict[str, Any]
DEFAULT_TOKEN = "7000000001:AAFakeTokenForNanobotTests_0123456789"
CONFLICT = (
    "Conflict: terminated by other getUpdates request; "
    "make sure that only one bot instance is running"
)
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup "
    "are exactly the same as a current content and reply markup of the message"
)
QUERY_INVALID = "Bad Request: query is too old and response timeout expired or query ID is invalid"
MAX_TEXT, MAX_CAPTION, MAX_DOWNLOAD = 4096, 1024, 20 * 1024 * 1024
MAX_CALLBACK_DATA, MAX_CALLBACK_ANSWER = 64, 200  # bytes, characters
_BUTTON = "Bad Request: can't parse inline keyboard button: "
# The fields that give an inline button its action; one of them is required.
BUTTON_ACTIONS = (
    "url",
    "callback_data",
    "web_app",
    "login_url",
    "switch_inline_query",
    "switch_inline_query_current_chat",
    "switch_inline_query_chosen_chat",
    "copy_text",
    "callback_game",
    "pay",
)
CHAT_ACTIONS = frozenset(
    [
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    ]
)
MEDIA = {"photo": "photos", "document": "documents", "voice": "voice", "audio": "music"}
MEDIA |= {"video": "videos", "video_note": "video_notes"}
_TOKEN = re.compile(r"\d+:[\w-]+")
_INJECT = (  # the control API's ``POST /_fake/<name>`` that inject a user's update
    "user_message",
    "user_photo",
    "user_document",
    "user_voice",
    "user_audio",
    "user_video_note",
    "user_callback",
)
_COMMAND = re.compile(r"(?<![\w/<>])/\w{1,64}(?:@\w{3,32})?(?![\w/<>])", re.ASCII)
_MENTION = re.compile(r"(?<!\w)@\w{2,32}(?!\w)", re.ASCII)


@dataclass(frozen=True)
class Fault:
    """Base of the faults ``fail_next`` injects."""


@dataclass(frozen=True)
class RateLimited(Fault):
    """429 "Too Many Requests: retry after N" with ``parameters.retry_after`` (PTB: RetryAfter)."""

    retry_after: int = 1


@dataclass(frozen=True)
class ServerError(Fault):
    """A 5xx: 500 "Internal Server Error", 502 "Bad Gateway"... (PTB: NetworkError)."""

    status: int = 500


@dataclass(frozen=True)
class ApiError(Fault):
    """Any Telegram error, e.g. ``ApiError(403, "Forbidden: bot was blocked by the user")``;
    ``parameters`` as Telegram adds them (``{"migrate_to_chat_id": -100…}``: PTB's
    ChatMigrated)."""

    status: int = 400
    description: str = "Bad Request"
    parameters: JSON | None = None


@dataclass(frozen=True)
class Hang(Fault):
    """Hold the request until the client gives up or the server stops (PTB: TimedOut)."""


@dataclass(frozen=True)
class Disconnect(Fault):
    """Close the connection without a response (PTB: NetworkError)."""


@dataclass(frozen=True)
class Slow(Fault):
    """Perform the method, then answer after ``seconds``: a client that gave up meanwhile
    sees TimedOut although the message was sent (the real duplicate-on-retry hazard)."""

    seconds: float = 10.0


@dataclass(frozen=True)
class Garbled(Fault):
    """Answer ``{"ok": true, "result": result}`` without performing the method: a reply of
    the wrong shape (the default, ``true``, where a message was due)."""

    result: Any = True


@dataclass(frozen=True)
class Refusal200(Fault):
    """Answer HTTP 200 without performing the method, with ``body`` as it is: a dict or list
    as JSON (``{"ok": false, "error_code": 400, "description": ...}``, or ``{"ok": false}``
    with no fields), a string as raw bytes (a body that is not JSON). Seen from proxies and
    from Telegram itself under load."""

    body: Any = field(default_factory=lambda: {"ok": False})


_FAULTS: dict[str, type[Fault]] = {
    k.__name__: k
    for k in (RateLimited, ServerError, ApiError, Hang, Disconnect, Slow, Garbled, Refusal200)
}


def fault_from_json(obj: Mapping[str, Any]) -> Fault:
    """Build a fault from ``{"type": <class name>, **fields}``."""
    data = dict(obj)
    return _FAULTS[data.pop("type")](**data)


@dataclass(frozen=True)
class User:
    """A Telegram user (``fake.bot`` is the bot's own)."""

    id: int
    first_name: str
    username: str | None = None
    is_bot: bool = False

    def json(self) -> JSON:
        out: JSON = {"id": self.id, "is_bot": self.is_bot, "first_name": self.first_name}
        return out | ({"username": self.username} if self.username else {})


@dataclass(frozen=True)
class SentFile:
    """A file the bot sent: uploaded bytes, or ``url``/``file_id`` it referred to."""

    kind: str  # photo, document, voice, audio, video
    file_id: str
    filename: str | None
    mime_type: str | None
    content: bytes
    url: str | None = None


@dataclass(frozen=True)
class Revision:
    """An earlier version of an edited message."""

    text: str
    visible: str
    parse_mode: str | None
    entities: list[JSON]
    reply_markup: JSON | None


@dataclass
class SentMessage:
    """A message the bot sent, in its current state. ``text`` is as sent (for media: the
    caption), ``visible`` what the user sees (tags stripped, entities decoded)."""

    chat_id: int
    message_id: int
    method: str
    text: str
    visible: str
    parse_mode: str | None
    entities: list[JSON]
    thread_id: int | None = None
    reply_to: int | None = None
    reply_markup: JSON | None = None
    file: SentFile | None = None
    history: list[Revision] = field(default_factory=list)  # oldest first
    deleted: bool = False
    sent_at: float = field(default_factory=time.monotonic)

    @property
    def edited(self) -> bool:
        return bool(self.history)

    @property
    def keyboard(self) -> list[list[JSON]]:
        """The rows of the inline keyboard shown now (``[]``: none)."""
        return list((self.reply_markup or {}).get("inline_keyboard") or [])

    @property
    def buttons(self) -> list[JSON]:
        """The inline buttons shown now, row after row (``[]``: none)."""
        return [button for row in self.keyboard for button in row]

    def json(self) -> JSON:
        """JSON-ready form (file content as base64) for the control API."""
        data = asdict(self)
        if self.file is not None:
            data["file"]["content"] = base64.b64encode(self.file.content).decode()
        return data


@dataclass(frozen=True)
class CallbackAnswer:
    """The bot's answer (answerCallbackQuery) to a button press."""

    text: str | None
    show_alert: bool
    url: str | None
    cache_time: int | None
    at: float  # the fake's clock


@dataclass
class CallbackQuery:
    """A button press (``callback_query`` update) and what became of it.

    ``pressed_at`` and ``answer.at`` are on the fake's clock; ``refusals`` counts the
    answerCallbackQuery calls for this query that were refused (second or late answers).
    """

    id: str
    update_id: int
    chat_id: int
    message_id: int
    user_id: int
    data: str
    pressed_at: float
    answer: CallbackAnswer | None = None
    refusals: int = 0

    @property
    def answered(self) -> bool:
        return self.answer is not None


@dataclass(frozen=True)
class ChatAction:
    chat_id: int
    action: str
    thread_id: int | None
    at: float


@dataclass(frozen=True)
class ApiCall:
    """One Bot API request: method as sent, parameters (uploads as their filename), time."""

    method: str
    params: JSON
    at: float


class Origin(TypedDict, total=False):
    """Who sends a user message and where: keyword arguments of the ``user_*`` methods.

    A topic message (``is_topic``) goes to a forum supergroup; like Telegram it carries
    ``message_thread_id``, ``is_topic_message`` and, unless ``reply_to`` is given, a
    ``reply_to_message`` that is the topic's creation service message.
    """

    user_id: Required[int]
    username: str | None
    first_name: str
    chat_type: str  # private (default), group, supergroup, channel
    chat_title: str | None
    thread_id: int | None
    is_topic: bool
    reply_to: int | None  # message_id in the chat (the bot's or a user's)
    message_id: int | None


@dataclass
class _Chat:
    json: JSON
    messages: dict[int, JSON] = field(default_factory=dict)
    last_id: int = 0

    def next_id(self) -> int:
        self.last_id += 1
        return self.last_id


@dataclass(frozen=True)
class _File:
    file_id: str
    unique_id: str
    path: str
    content: bytes
    size: int  # as Telegram declares it: the content's length unless a test says otherwise


@dataclass(frozen=True)
class _Upload:
    filename: str | None
    content: bytes
    mime_type: str | None


class _Drop(Exception):
    """Close the connection without an answer (the server is going away)."""


class _Fail(Exception):
    """A Telegram error answer raised from inside a method."""

    def __init__(self, status: int, description: str, parameters: JSON | None = None) -> None:
        super().__init__(description)
        self.status, self.description, self.parameters = status, description, parameters


def _error(status: int, description: str, parameters: JSON | None = None) -> web.Response:
    body: JSON = {"ok": False, "error_code": status, "description": description}
    return web.json_response(
        body | ({"parameters": parameters} if parameters else {}), status=status
    )


def _answer_200(body: Any) -> web.Response:
    """HTTP 200 with `body`: a string as it is (as a proxy's page comes), anything else as
    JSON."""
    if isinstance(body, str):
        return web.Response(text=body, content_type="text/html")
    return web.json_response(body)


def _user_entities(text: str) -> list[JSON]:
    """The bot_command and mention entities Telegram detects in a user's text."""
    found = [(m, "bot_command") for m in _COMMAND.finditer(text)]
    found += [(m, "mention") for m in _MENTION.finditer(text)]
    found.sort(key=lambda pair: pair[0].start())
    return [
        {"type": kind, "offset": utf16_len(text[: m.start()]), "length": utf16_len(m.group())}
        for m, kind in found
    ]


def _stripped(message: JSON) -> JSON:
    """A message as embedded in ``reply_to_message`` (Telegram nests one level only)."""
    return {k: v for k, v in message.items() if k != "reply_to_message"}


def _keep_revision(record: SentMessage) -> None:
    """Remember a message's current state before an edit changes it."""
    record.history.append(
        Revision(
            record.text, record.visible, record.parse_mode, record.entities, record.reply_markup
        )
    )


def _reply_markup(markup: Any) -> JSON | None:
    """``reply_markup`` as Telegram keeps it: an inline keyboard validated, None for none (an
    empty inline keyboard removes the keyboard). Other markups (reply keyboards, ForceReply,
    ReplyKeyboardRemove) are kept as sent."""
    if markup in (None, "", {}):
        return None
    if not isinstance(markup, dict):
        raise _Fail(400, "Bad Request: can't parse reply keyboard markup JSON object")
    if "inline_keyboard" not in markup:
        return markup
    rows = markup["inline_keyboard"]
    if not isinstance(rows, list):
        raise _Fail(400, 'Bad Request: field "inline_keyboard" must be of type Array')
    for row in rows:
        if not isinstance(row, list):
            raise _Fail(400, 'Bad Request: field "inline_keyboard" must be an Array of Arrays')
        for button in row:
            _check_button(button)
    return markup if any(rows) else None


def _check_button(button: Any) -> None:
    """Refuse an inline keyboard button as Telegram does."""
    if not isinstance(button, dict):
        raise _Fail(400, _BUTTON + "InlineKeyboardButton must be an Object")
    if "text" not in button:
        raise _Fail(400, _BUTTON + 'Can\'t find field "text"')
    if not isinstance(button["text"], str):
        raise _Fail(400, _BUTTON + 'Field "text" must be of type String')
    data = button.get("callback_data")
    if data is not None and not isinstance(data, str):
        raise _Fail(400, _BUTTON + 'Field "callback_data" must be of type String')
    if data is not None and len(data.encode()) > MAX_CALLBACK_DATA:
        raise _Fail(400, "Bad Request: BUTTON_DATA_INVALID")
    actions = [
        k
        for k in BUTTON_ACTIONS
        if k in button and (button[k] is True if k == "pay" else button[k] not in (None, ""))
    ]
    if not actions:  # an empty callback_data counts as none
        raise _Fail(400, _BUTTON + "Text buttons are unallowed in the inline keyboard")


class _Params:
    """Request parameters: JSON values, or strings (maybe JSON-encoded) from forms."""

    def __init__(self, values: Mapping[str, Any], uploads: Mapping[str, _Upload]) -> None:
        self.values, self.uploads = dict(values), dict(uploads)

    def string(self, name: str) -> str | None:
        value = self.values.get(name)
        return None if value is None else str(value)

    def integer(self, name: str, *, required: bool = False) -> int | None:
        value = self.values.get(name)
        if value is None or value == "":
            if required:
                raise _Fail(400, f"Bad Request: {name} is empty")
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            raise _Fail(400, f"Bad Request: invalid {name} specified") from None

    def parsed(self, name: str) -> Any:
        value = self.values.get(name)
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                raise _Fail(400, f"Bad Request: can't parse {name} JSON object") from None
        return value

    def flag(self, name: str) -> bool:
        return self.parsed(name) in (True, "true", "True", 1)

    def chat_id_or_none(self) -> int | None:
        """The ``chat_id`` named, if it is a number (for scoping faults)."""
        value = self.values.get("chat_id")
        try:
            return int(value) if value not in (None, "") else None
        except (TypeError, ValueError):
            return None

    def chat_id(self) -> int:
        value = self.values.get("chat_id")
        if value is None or value == "":
            raise _Fail(400, "Bad Request: chat_id is empty")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise _Fail(400, "Bad Request: chat not found") from None


class FakeTelegram:
    """A Telegram Bot API server on 127.0.0.1 holding chats, updates and files.

    ``valid_token``: the constructor's token, else the first well-formed token seen; a
    request with another token gets 401 "Unauthorized", a malformed one 404 "Not Found".
    ``strict_html``: reject a bare ``&`` in HTML (Telegram keeps it; its docs forbid it).
    ``offline = True`` drops every Bot API connection until set back to False.
    ``conflicts`` counts the long polls a newer one ended with 409 (two pollers at once).
    ``callback_timeout``: seconds after a press within which answerCallbackQuery is accepted
    (None: no limit). ``clock`` (default ``time.monotonic``) times presses and answers;
    ``advance_clock`` moves the fake's time on without waiting. ``webhook_retry``: seconds
    before an update the webhook did not take is posted again.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        bot_id: int = 7000000001,
        bot_username: str = "nanobot_test_bot",
        strict_html: bool = True,
        callback_timeout: float | None = 15.0,
        clock: Callable[[], float] | None = None,
        webhook_retry: float = 1.0,
    ) -> None:
        self.host, self.port = host, port
        self.callback_timeout = callback_timeout
        self.clock: Callable[[], float] = clock or time.monotonic
        self._skew = 0.0
        self.valid_token = token
        self.bot = User(bot_id, "Nanobot Test", bot_username, is_bot=True)
        self.strict_html = strict_html
        self._offline = False
        self.requests: list[ApiCall] = []
        self.downloads: list[str] = []  # file paths asked for under /file/bot<token>/
        self.actions: list[ChatAction] = []
        self.commands: list[JSON] = []
        self.webhook: Webhook | None = None  # as setWebhook set it
        self.webhook_routes = Routes()
        self.webhook_retry = webhook_retry
        self.webhook_timeout = 30.0  # seconds a post waits for its answer
        self.deliveries: list[Delivery] = []  # every post to the webhook, oldest first
        self._acknowledged: dict[int, JSON] = {}  # updates the webhook answered with a 2xx
        self._delivering: asyncio.Task[None] | None = None
        self._sent: list[SentMessage] = []
        self._chats: dict[int, _Chat] = {}
        self._updates: list[JSON] = []
        self._last_update_id = 500_000_000
        self._allowed: set[str] = set()
        self._files: dict[str, _File] = {}
        # (method or "*", chat id or None) → faults: queued (each used once), standing
        self._faults: dict[tuple[str, int | None], deque[Fault]] = {}
        self._standing: dict[tuple[str, int | None], Fault] = {}
        self._callbacks: dict[str, CallbackQuery] = {}
        self._long_poll = 0  # generation of the long poll being held, 0 if none
        # Long polls ended by a newer one (409 Conflict): two pollers at once, as Telegram
        # sees a second process polling the same bot.
        self.conflicts = 0
        self._generation = 0
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None

    # ---- lifecycle -------------------------------------------------------------------

    @property
    def offline(self) -> bool:
        """While True every Bot API request (and a held long poll) loses its connection."""
        return self._offline

    @offline.setter
    def offline(self, value: bool) -> None:
        self._offline = value
        self._changed()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``; PTB takes ``{base_url}/bot`` and ``{base_url}/file/bot``."""
        if self._runner is None:
            raise RuntimeError("FakeTelegram is not started")
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve in the running loop; ``port`` becomes the bound port."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        app.router.add_route("*", "/_fake/{name}", self._control)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        self._stopping = asyncio.Event()
        # handler_cancellation: a client that gives up (PTB timeout, updater.stop())
        # cancels its request here too, so a dropped long poll no longer holds the slot.
        self._runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Drop held requests (long polls, hangs), close the socket. Idempotent."""
        if self._runner is None:
            return
        self._stopping.set()
        self._changed()
        await self._stop_delivering()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- control: inject ---------------------------------------------------------------

    def user_message(
        self,
        chat_id: int,
        text: str,
        *,
        entities: list[JSON] | None = None,
        **origin: Unpack[Origin],
    ) -> int:
        """Enqueue a user's text message; returns its update_id. ``entities`` default to the
        bot_command and mention entities Telegram would detect."""
        entities = _user_entities(text) if entities is None else entities
        return self._user_update(chat_id, {"text": text, "entities": entities}, origin)

    def user_document(
        self,
        chat_id: int,
        *,
        filename: str,
        content: bytes,
        mime_type: str = "application/octet-stream",
        caption: str | None = None,
        file_size: int | None = None,
        **origin: Unpack[Origin],
    ) -> int:
        """Enqueue a document message; the bytes are downloadable via getFile.

        ``file_size`` (here and in ``user_voice``, ``user_audio``, ``user_video_note``) is
        the size Telegram declares, ``len(content)`` by default: over 20 MB, getFile refuses
        the file ("file is too big"), so a test needs no 20 MB of bytes to see it."""
        stored = self._store_file("document", content, filename, file_size)
        doc = self._file_json(stored) | {"file_name": filename, "mime_type": mime_type}
        return self._user_update(chat_id, {"document": doc, **self._caption(caption)}, origin)

    def user_photo(
        self,
        chat_id: int,
        *,
        content: bytes,
        width: int = 1280,
        height: int = 960,
        caption: str | None = None,
        **origin: Unpack[Origin],
    ) -> int:
        """Enqueue a photo: a thumbnail and the full size (last, largest), same bytes."""
        sizes = []
        for scale in (16, 1):
            stored = self._store_file("photo", content, "photo.jpg")
            dims = {"width": max(1, width // scale), "height": max(1, height // scale)}
            sizes.append(self._file_json(stored) | dims)
        return self._user_update(chat_id, {"photo": sizes, **self._caption(caption)}, origin)

    def user_voice(
        self,
        chat_id: int,
        *,
        content: bytes,
        duration: int = 1,
        mime_type: str = "audio/ogg",
        caption: str | None = None,
        file_size: int | None = None,
        **origin: Unpack[Origin],
    ) -> int:
        """Enqueue a voice note (OGG/Opus in real life, ``voice/file_N.oga`` for getFile)."""
        stored = self._store_file("voice", content, "voice.oga", file_size)
        voice = self._file_json(stored) | {"duration": duration, "mime_type": mime_type}
        return self._user_update(chat_id, {"voice": voice, **self._caption(caption)}, origin)

    def user_audio(
        self,
        chat_id: int,
        *,
        content: bytes,
        filename: str = "audio.mp3",
        duration: int = 1,
        mime_type: str = "audio/mpeg",
        performer: str | None = None,
        title: str | None = None,
        caption: str | None = None,
        file_size: int | None = None,
        **origin: Unpack[Origin],
    ) -> int:
        """Enqueue an audio file (a music file the client shows with a player, not a voice
        note): Bot API ``Audio`` with ``file_name``, ``mime_type``, ``performer``, ``title``."""
        stored = self._store_file("audio", content, filename, file_size)
        fields = {"duration": duration, "performer": performer, "title": title}
        fields |= {"file_name": filename, "mime_type": mime_type}
        track = self._file_json(stored) | {k: v for k, v in fields.items() if v is not None}
        return self._user_update(chat_id, {"audio": track, **self._caption(caption)}, origin)

    def user_video_note(
        self,
        chat_id: int,
        *,
        content: bytes,
        duration: int = 1,
        length: int = 384,
        file_size: int | None = None,
        **origin: Unpack[Origin],
    ) -> int:
        """Enqueue a video note (a round video, MPEG-4 in real life): Bot API ``VideoNote``
        with ``length`` (its diameter in pixels) and ``duration``; it never has a caption."""
        stored = self._store_file("video_note", content, "video.mp4", file_size)
        note = self._file_json(stored) | {"length": length, "duration": duration}
        return self._user_update(chat_id, {"video_note": note}, origin)

    def user_callback(
        self,
        chat_id: int,
        message_id: int,
        data: str,
        *,
        user_id: int,
        username: str | None = None,
        first_name: str = "Ada",
    ) -> int:
        """Enqueue a ``callback_query`` with any ``data`` for a message, as a modified client
        could send it (no button needs to carry it); returns the update_id. ``press_button``
        presses a button that is shown."""
        user = User(user_id, first_name, username)
        return self._press(chat_id, message_id, data, user).update_id

    def press_button(
        self,
        chat_id: int,
        message_id: int,
        *,
        user_id: int,
        text: str | None = None,
        data: str | None = None,
        username: str | None = None,
        first_name: str = "Ada",
    ) -> CallbackQuery:
        """Press the inline button labelled ``text`` (or carrying ``data``) that the message
        shows now, as user ``user_id``: a ``callback_query`` update with the message as it is,
        delivered by getUpdates. Returns the query (its ``id`` is what answerCallbackQuery
        takes). ``LookupError`` if the message is gone or shows no such callback button."""
        if (text is None) == (data is None):
            raise ValueError("give the button's text or its data, not both")
        chat = self._chats.get(chat_id)
        message = chat.messages.get(message_id) if chat else None
        if message is None:
            raise LookupError(f"no message {message_id} in chat {chat_id}")
        rows = (message.get("reply_markup") or {}).get("inline_keyboard") or []
        found = [
            b
            for row in rows
            for b in row
            if "callback_data" in b
            and (b["text"] == text if data is None else b["callback_data"] == data)
        ]
        if not found:
            raise LookupError(f"message {message_id} shows no callback button {text or data!r}")
        user = User(user_id, first_name, username)
        return self._press(chat_id, message_id, found[0]["callback_data"], user)

    def _press(self, chat_id: int, message_id: int, data: str, user: User) -> CallbackQuery:
        message = self._chats[chat_id].messages[message_id]
        query_id = str(uuid.uuid4().int % 10**19)
        body = {
            "id": query_id,
            "from": user.json(),
            "message": copy.deepcopy(message),
            "chat_instance": str(abs(chat_id) * 7919),
            "data": data,
        }
        update_id = self._enqueue({"callback_query": body})
        query = CallbackQuery(query_id, update_id, chat_id, message_id, user.id, data, self.now())
        self._callbacks[query_id] = query
        return query

    def now(self) -> float:
        """The fake's clock: ``clock()`` plus what ``advance_clock`` added."""
        return self.clock() + self._skew

    def advance_clock(self, seconds: float) -> None:
        """Let ``seconds`` pass for the fake (answer windows) without waiting."""
        self._skew += seconds
        self._changed()

    def fail_next(
        self, method: str, kind: Fault, times: int | None = 1, *, chat_id: int | None = None
    ) -> None:
        """Answer the next ``times`` calls of ``method`` (``"*"``: any; ``"file"``: downloads)
        with ``kind`` instead of performing them; ``times=None``: every call from then on,
        until ``clear_faults``. With ``chat_id``, only calls naming that chat count (and
        take their faults before the unscoped ones): one chat fails, the others do not."""
        key = (method.lower(), chat_id)
        if times is None:
            self._standing[key] = kind
        else:
            self._faults.setdefault(key, deque()).extend([kind] * times)

    def clear_faults(self, chat_id: int | None = None) -> None:
        """Forget the faults not yet used (those of ``chat_id`` only, if given)."""
        for table in (self._faults, self._standing):
            for key in [k for k in table if chat_id is None or k[1] == chat_id]:
                del table[key]

    def route_webhook(self, public: str, local: str) -> None:
        """Play the reverse proxy: what is posted to ``public``'s origin (a webhook URL, or
        ``https://host[:port]``) goes to ``local`` (``http://127.0.0.1:PORT``), path
        unchanged. setWebhook refuses a URL whose host has no route (it does not resolve)."""
        self.webhook_routes.add(public, local)

    async def post_update(
        self,
        body: JSON | bytes | int,
        *,
        secret_token: str | None = None,
        use_secret: bool = True,
    ) -> int | None:
        """Post one body to the webhook now, outside the queue (nothing is retried or
        acknowledged): an update, any bytes, or the id of an update the webhook took before
        (posted again as it was, as Telegram does when it lost the answer). It carries the
        webhook's secret token, or ``secret_token`` if given, or none with
        ``use_secret=False``. Returns the status (None: no answer). ``RuntimeError`` if no
        webhook is set."""
        if self.webhook is None:
            raise RuntimeError("no webhook is set")
        target = self.webhook_routes.target(self.webhook.url)
        assert target is not None  # setWebhook checked it
        if isinstance(body, int):
            body = self._acknowledged[body]
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        secret = (secret_token or self.webhook.secret_token) if use_secret else None
        timeout = aiohttp.ClientTimeout(total=self.webhook_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            status, _ = await post(session, target, data, secret)
        return status

    # ---- control: observe --------------------------------------------------------------

    @property
    def webhook_url(self) -> str:
        """The webhook's URL ("" when none is set: updates wait for getUpdates)."""
        return self.webhook.url if self.webhook is not None else ""

    def sent(self, chat_id: int | None = None) -> list[SentMessage]:
        """Messages the bot sent (in their current state, deleted ones flagged), in order."""
        return [m for m in self._sent if chat_id is None or m.chat_id == chat_id]

    @property
    def callback_queries(self) -> list[CallbackQuery]:
        """Every button press (``press_button``/``user_callback``), oldest first."""
        return list(self._callbacks.values())

    def callback_query(self, query_id: str) -> CallbackQuery:
        """A press by its id (``KeyError`` if unknown)."""
        return self._callbacks[query_id]

    async def wait_for_answer(
        self, query: CallbackQuery | str, seconds: float = 10.0
    ) -> CallbackAnswer:
        """Wait until the bot answered the press (answerCallbackQuery); returns the answer."""
        record = self._callbacks[query if isinstance(query, str) else query.id]
        await self.wait_for(lambda: record.answer is not None, seconds)
        assert record.answer is not None
        return record.answer

    def calls(self, method: str) -> list[ApiCall]:
        """The recorded requests of one method (case-insensitive)."""
        return [r for r in self.requests if r.method.lower() == method.lower()]

    @property
    def pending_updates(self) -> list[JSON]:
        """Updates not yet confirmed by an offset."""
        return list(self._updates)

    @property
    def polling(self) -> bool:
        """Whether a getUpdates long poll is being held right now."""
        return self._long_poll != 0

    async def wait_for(self, predicate: Callable[[], bool], seconds: float = 10.0) -> None:
        """Wait until ``predicate()`` holds (checked on every change); TimeoutError after
        ``seconds``."""
        async with asyncio.timeout(seconds):
            while not predicate():
                await self._wake.wait()

    async def wait_for_sent(
        self, count: int, chat_id: int | None = None, seconds: float = 10.0
    ) -> list[SentMessage]:
        """Wait until the bot has sent ``count`` messages (to ``chat_id``); returns them all."""
        await self.wait_for(lambda: len(self.sent(chat_id)) >= count, seconds)
        return self.sent(chat_id)

    # ---- the webhook --------------------------------------------------------------------

    def _webhook_updates(self) -> list[JSON]:
        return [u for u in self._updates if not self._allowed or self._kind(u) in self._allowed]

    async def _deliver(self) -> None:
        """While a webhook is set, post the oldest pending update to it, one at a time, in
        order; a 2xx acknowledges it, anything else has it posted again after
        ``webhook_retry`` seconds (later updates wait behind it)."""
        timeout = aiohttp.ClientTimeout(total=self.webhook_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while (webhook := self.webhook) is not None and not self._stopping.is_set():
                pending = self._webhook_updates()
                if not pending or self.offline:
                    await self._wake.wait()
                    continue
                update = pending[0]
                target = self.webhook_routes.target(webhook.url)
                assert target is not None  # setWebhook checked it
                body = json.dumps(update).encode()
                status, error = await post(session, target, body, webhook.secret_token)
                self.deliveries.append(Delivery(update["update_id"], status, error))
                if error is None:
                    self._updates = [u for u in self._updates if u is not update]
                    self._acknowledged[update["update_id"]] = update
                else:
                    webhook.last_error_date, webhook.last_error_message = int(time.time()), error
                self._changed()
                if error is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), self.webhook_retry)

    async def _stop_delivering(self) -> None:
        task, self._delivering = self._delivering, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task])

    # ---- state helpers -----------------------------------------------------------------

    def _changed(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    def _enqueue(self, update: JSON) -> int:
        self._last_update_id += 1
        self._updates.append({"update_id": self._last_update_id, **update})
        self._changed()
        return self._last_update_id

    def _chat(
        self, chat_id: int, chat_type: str = "", title: str | None = None, user: User | None = None
    ) -> _Chat:
        """The chat, created on first use (a bot-initiated send: private if id > 0)."""
        if chat_id in self._chats:
            return self._chats[chat_id]
        chat_type = chat_type or ("private" if chat_id > 0 else "supergroup")
        data: JSON = {"id": chat_id, "type": chat_type}
        if chat_type == "private":
            data["first_name"] = user.first_name if user else "Ada"
            data |= {"username": user.username} if user and user.username else {}
        else:
            data["title"] = title or "Test group"
        self._chats[chat_id] = _Chat(data)
        return self._chats[chat_id]

    def _user_update(self, chat_id: int, fields: JSON, origin: Origin) -> int:
        user = User(origin["user_id"], origin.get("first_name", "Ada"), origin.get("username"))
        is_topic = origin.get("is_topic", False)
        chat_type = origin.get("chat_type", "private")
        chat_type = "supergroup" if is_topic and chat_type == "private" else chat_type
        chat = self._chat(chat_id, chat_type, origin.get("chat_title"), user)
        if is_topic:
            chat.json["is_forum"] = True
        message_id = origin.get("message_id") or chat.next_id()
        chat.last_id = max(chat.last_id, message_id)
        fields = {k: v for k, v in fields.items() if v not in (None, [])}
        message: JSON = {
            "message_id": message_id,
            "from": user.json(),
            "chat": dict(chat.json),
            "date": int(time.time()),
        }
        if (thread_id := origin.get("thread_id")) is not None:
            message["message_thread_id"] = thread_id
            message |= {"is_topic_message": True} if is_topic else {}
        reply_to = origin.get("reply_to")
        if reply_to is not None:
            if reply_to not in chat.messages:
                raise ValueError(f"no message {reply_to} in chat {chat_id} to reply to")
            message["reply_to_message"] = _stripped(chat.messages[reply_to])
        elif is_topic and thread_id is not None:  # Telegram: the topic's creation message
            message["reply_to_message"] = {
                "message_id": thread_id,
                "from": user.json(),
                "chat": dict(chat.json),
                "date": int(time.time()) - 3600,
                "message_thread_id": thread_id,
                "forum_topic_created": {"name": f"Topic {thread_id}", "icon_color": 7322096},
                "is_topic_message": True,
            }
        message |= fields
        chat.messages[message_id] = message
        return self._enqueue({"message": message})

    def _store_file(
        self, kind: str, content: bytes, filename: str | None, size: int | None = None
    ) -> _File:
        token = uuid.uuid4().hex
        suffix = filename.rsplit(".", 1)[-1] if filename and "." in filename else "bin"
        path = f"{MEDIA.get(kind, 'documents')}/file_{len(self._files)}.{suffix}"
        size = len(content) if size is None else size
        stored = _File(f"BQACAgIAAxkBAAI{token}", f"AgAD{token[:12]}", path, content, size)
        self._files[stored.file_id] = stored
        return stored

    @staticmethod
    def _file_json(stored: _File) -> JSON:
        return {
            "file_id": stored.file_id,
            "file_unique_id": stored.unique_id,
            "file_size": stored.size,
        }

    @staticmethod
    def _caption(caption: str | None) -> JSON:
        return {"caption": caption, "caption_entities": _user_entities(caption or "")}

    def _take_fault(self, method: str, chat_id: int | None = None) -> Fault | None:
        """The fault for this call: the chat's before everyone's, the method's before "*",
        queued ones before standing ones."""
        chats = (chat_id, None) if chat_id is not None else (None,)
        for key in ((m, c) for c in chats for m in (method.lower(), "*")):
            if queue := self._faults.get(key):
                return queue.popleft()
            if (standing := self._standing.get(key)) is not None:
                return standing
        return None

    # ---- HTTP plumbing -----------------------------------------------------------------

    def _check_token(self, token: str) -> web.Response | None:
        if not _TOKEN.fullmatch(token):
            return _error(404, "Not Found")
        if self.valid_token is None:
            self.valid_token = token
        return None if token == self.valid_token else _error(401, "Unauthorized")

    @staticmethod
    def _abort(request: web.Request) -> web.Response:
        """Drop the connection without an answer."""
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=499)

    async def _fault(self, request: web.Request, fault: Fault) -> web.Response | None:
        """The answer for an injected fault, or None to proceed (Slow)."""
        match fault:
            case RateLimited(retry_after=seconds):
                desc = f"Too Many Requests: retry after {seconds}"
                return _error(429, desc, {"retry_after": seconds})
            case ServerError(status=status):
                names = {500: "Internal Server Error", 502: "Bad Gateway"}
                return _error(status, names.get(status, "Service Unavailable"))
            case ApiError(status=status, description=description, parameters=parameters):
                return _error(status, description, parameters)
            case Garbled(result=result):
                return web.json_response({"ok": True, "result": result})
            case Refusal200(body=body):
                return _answer_200(body)
            case Hang():
                await self._stopping.wait()
        return self._abort(request) if isinstance(fault, Hang | Disconnect) else None

    @staticmethod
    async def _read_params(request: web.Request) -> _Params:
        values: JSON = dict(request.query)
        uploads: dict[str, _Upload] = {}
        if request.content_type == "application/json":
            body = await request.json() if request.can_read_body else {}
            values |= body if isinstance(body, dict) else {}
        elif request.can_read_body:
            for name, value in (await request.post()).items():
                if isinstance(value, web.FileField):
                    content = value.file.read()
                    uploads[name] = _Upload(value.filename, content, value.content_type)
                else:
                    values[name] = value
        return _Params(values, uploads)

    async def _api(self, request: web.Request) -> web.StreamResponse:
        if self.offline:
            return self._abort(request)
        if (denied := self._check_token(request.match_info["token"])) is not None:
            return denied
        method = request.match_info["method"]
        try:
            params = await self._read_params(request)
        except ValueError:
            return _error(400, "Bad Request: can't parse JSON")
        recorded = dict(params.values)
        recorded |= {k: f"<upload {u.filename}>" for k, u in params.uploads.items()}
        self.requests.append(ApiCall(method, recorded, time.monotonic()))
        self._changed()
        delay = 0.0
        if (fault := self._take_fault(method, params.chat_id_or_none())) is not None:
            if (answer := await self._fault(request, fault)) is not None:
                return answer
            delay = fault.seconds if isinstance(fault, Slow) else 0.0
        return await self._perform(request, method, params, delay)

    async def _perform(
        self, request: web.Request, method: str, params: _Params, delay: float
    ) -> web.Response:
        """Run the method's ``_m_`` handler; answer after ``delay`` (a Slow fault)."""
        handler = getattr(self, f"_m_{method.lower()}", None)
        if handler is None:
            return _error(404, "Not Found")
        try:
            result = await handler(params)
        except _Fail as fail:
            return _error(fail.status, fail.description, fail.parameters)
        except _Drop:
            return self._abort(request)
        finally:
            self._changed()
        if delay:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
        return web.json_response({"ok": True, "result": result})

    async def _download(self, request: web.Request) -> web.StreamResponse:
        if self.offline:
            return self._abort(request)
        if (denied := self._check_token(request.match_info["token"])) is not None:
            return denied
        if (fault := self._take_fault("file")) is not None and (
            answer := await self._fault(request, fault)
        ) is not None:
            return answer
        path = request.match_info["path"]
        self.downloads.append(path)
        self._changed()
        for stored in self._files.values():
            if stored.path == path:
                return web.Response(body=stored.content, content_type="application/octet-stream")
        return _error(404, "Not Found")

    async def _not_found(self, request: web.Request) -> web.Response:
        return _error(404, "Not Found")

    # ---- Bot API methods (``_m_<lowercase name>``) --------------------------------------

    async def _m_getme(self, p: _Params) -> JSON:
        return self.bot.json() | {
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
        }

    async def _m_getupdates(self, p: _Params) -> Any:
        if self.webhook is not None:
            raise _Fail(
                409,
                "Conflict: can't use getUpdates method while webhook is active; "
                "use deleteWebhook to delete the webhook first",
            )
        offset, limit = p.integer("offset") or 0, min(max(p.integer("limit") or 100, 1), 100)
        timeout = float(p.string("timeout") or 0)
        if offset < 0:  # -N: only the last N updates survive
            self._updates = self._updates[offset:]
        elif offset:
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
        if (allowed := p.parsed("allowed_updates")) is not None:
            self._allowed = set(allowed)

        def deliverable() -> list[JSON]:
            wanted = [
                u for u in self._updates if not self._allowed or self._kind(u) in self._allowed
            ]
            return wanted[:limit]

        if deliverable() or timeout <= 0:
            return deliverable()
        # Like Telegram: a new long poll terminates the one being held (409 goes to the old one)
        self._generation += 1
        generation = self._long_poll = self._generation
        self._changed()
        try:
            with contextlib.suppress(TimeoutError):
                await self.wait_for(
                    lambda: (
                        self._long_poll != generation
                        or self._stopping.is_set()
                        or self.offline
                        or bool(deliverable())
                    ),
                    timeout,
                )
            superseded = self._long_poll != generation
        finally:
            if self._long_poll == generation:
                self._long_poll = 0
        if self._stopping.is_set() or self.offline:
            raise _Drop
        if superseded:
            self.conflicts += 1
            raise _Fail(409, CONFLICT)
        return deliverable()

    @staticmethod
    def _kind(update: JSON) -> str:
        return next(k for k in update if k != "update_id")

    async def _m_deletewebhook(self, p: _Params) -> bool:
        if p.flag("drop_pending_updates"):
            self._updates.clear()
        self.webhook = None
        await self._stop_delivering()
        return True

    async def _m_setwebhook(self, p: _Params) -> bool:
        url = p.string("url") or ""
        if not url:  # Telegram: an empty url removes the webhook
            return await self._m_deletewebhook(p)
        secret = p.string("secret_token")
        if (refused := refusal(url, secret, self.webhook_routes)) is not None:
            raise _Fail(400, refused)
        connections = min(max(p.integer("max_connections") or 40, 1), 100)
        self.webhook = Webhook(url, secret, connections)
        if (allowed := p.parsed("allowed_updates")) is not None:
            self._allowed = set(allowed)
        if p.flag("drop_pending_updates"):
            self._updates.clear()
        if self._delivering is None or self._delivering.done():
            self._delivering = asyncio.create_task(self._deliver(), name="fake-telegram-webhook")
        return True

    async def _m_getwebhookinfo(self, p: _Params) -> JSON:
        if self.webhook is None:
            pending = len(self._updates)
            return {"url": "", "has_custom_certificate": False, "pending_update_count": pending}
        return self.webhook.info(len(self._webhook_updates()), self._allowed)

    async def _m_setmycommands(self, p: _Params) -> bool:
        self.commands = list(p.parsed("commands") or [])
        return True

    async def _m_deletemycommands(self, p: _Params) -> bool:
        self.commands = []
        return True

    async def _m_getmycommands(self, p: _Params) -> list[JSON]:
        return self.commands

    def _formatted(self, p: _Params, name: str, limit: int) -> tuple[str, str, list[JSON]]:
        """(raw, visible, entities) of ``text``/``caption`` under ``parse_mode``."""
        raw = p.string(name) or ""
        mode = (p.string("parse_mode") or "").lower()
        entities_name = "entities" if name == "text" else "caption_entities"
        visible, entities = raw, list(p.parsed(entities_name) or [])
        if mode == "html":
            try:
                parsed = parse_html(raw, strict=self.strict_html)
            except HtmlError as exc:
                raise _Fail(400, f"Bad Request: can't parse entities: {exc}") from None
            visible, entities = parsed.text, parsed.entities
        elif mode not in ("", "markdown", "markdownv2"):  # Markdown is not validated here
            raise _Fail(400, "Bad Request: unsupported parse_mode")
        if utf16_len(visible) > limit:
            what = "message is too long" if name == "text" else "message caption is too long"
            raise _Fail(400, f"Bad Request: {what}")
        return raw, visible, entities

    def _new_message(self, p: _Params, body: JSON) -> tuple[_Chat, JSON]:
        """Build and store the bot's message in the chat named by ``chat_id``."""
        chat = self._chat(p.chat_id())
        markup = _reply_markup(p.parsed("reply_markup"))  # refused before an id is taken
        thread_id = p.integer("message_thread_id")
        reply = p.parsed("reply_parameters") or {}
        reply_to = p.integer("reply_to_message_id") or reply.get("message_id")
        lenient = p.flag("allow_sending_without_reply") or reply.get("allow_sending_without_reply")
        if reply_to is not None and reply_to not in chat.messages and not lenient:
            raise _Fail(400, "Bad Request: message to be replied not found")
        message: JSON = {
            "message_id": chat.next_id(),
            "from": self.bot.json(),
            "chat": dict(chat.json),
            "date": int(time.time()),
        }
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            message |= {"is_topic_message": True} if chat.json.get("is_forum") else {}
        if reply_to in chat.messages:
            message["reply_to_message"] = _stripped(chat.messages[reply_to])
        message |= {k: v for k, v in body.items() if v not in (None, [], "")}
        if markup:
            message["reply_markup"] = markup
        chat.messages[message["message_id"]] = message
        return chat, message

    async def _m_sendmessage(self, p: _Params) -> JSON:
        raw, visible, entities = self._formatted(p, "text", MAX_TEXT)
        if not visible.strip():
            raise _Fail(400, "Bad Request: message text is empty")
        chat, message = self._new_message(p, {"text": visible, "entities": entities})
        self._record(
            p, chat, message, method="sendMessage", raw=raw, visible=visible, entities=entities
        )
        return message

    def _record(
        self,
        p: _Params,
        chat: _Chat,
        message: JSON,
        *,
        method: str,
        raw: str,
        visible: str,
        entities: list[JSON],
        file: SentFile | None = None,
    ) -> None:
        reply = message.get("reply_to_message") or {}
        self._sent.append(
            SentMessage(
                chat_id=chat.json["id"],
                message_id=message["message_id"],
                method=method,
                text=raw,
                visible=visible,
                parse_mode=p.string("parse_mode"),
                entities=entities,
                thread_id=message.get("message_thread_id"),
                reply_to=reply.get("message_id"),
                reply_markup=message.get("reply_markup"),
                file=file,
            )
        )

    def _own_message(self, p: _Params, missing: str) -> tuple[_Chat, JSON, SentMessage]:
        chat_id, message_id = p.chat_id(), p.integer("message_id", required=True)
        chat = self._chats.get(chat_id)
        message = chat.messages.get(message_id or 0) if chat else None
        if chat is None or message is None:
            raise _Fail(400, f"Bad Request: {missing}")
        record = next(
            (m for m in self._sent if (m.chat_id, m.message_id) == (chat_id, message_id)), None
        )
        if record is None:
            raise _Fail(400, "Bad Request: message can't be edited")
        return chat, message, record

    async def _m_editmessagetext(self, p: _Params) -> JSON:
        _, message, record = self._own_message(p, "message to edit not found")
        if "text" not in message:
            raise _Fail(400, "Bad Request: there is no text in the message to edit")
        raw, visible, entities = self._formatted(p, "text", MAX_TEXT)
        if not visible.strip():
            raise _Fail(400, "Bad Request: message text is empty")
        markup = _reply_markup(p.parsed("reply_markup"))
        if (visible, entities, markup) == (
            message["text"],
            message.get("entities", []),
            message.get("reply_markup"),
        ):
            raise _Fail(400, NOT_MODIFIED)
        _keep_revision(record)
        record.text, record.visible, record.entities = raw, visible, entities
        record.parse_mode, record.reply_markup = p.string("parse_mode"), markup
        message |= {"text": visible, "edit_date": int(time.time())}
        message.pop("entities", None)
        message.pop("reply_markup", None)
        message |= ({"entities": entities} if entities else {}) | (
            {"reply_markup": markup} if markup else {}
        )
        return message

    async def _m_editmessagereplymarkup(self, p: _Params) -> JSON:
        _, message, record = self._own_message(p, "message to edit not found")
        markup = _reply_markup(p.parsed("reply_markup"))
        if markup == message.get("reply_markup"):
            raise _Fail(400, NOT_MODIFIED)
        _keep_revision(record)
        record.reply_markup = markup
        message["edit_date"] = int(time.time())
        message.pop("reply_markup", None)
        message |= {"reply_markup": markup} if markup else {}
        return message

    async def _m_deletemessage(self, p: _Params) -> bool:
        chat_id, message_id = p.chat_id(), p.integer("message_id", required=True)
        chat = self._chats.get(chat_id)
        if chat is None or chat.messages.pop(message_id or 0, None) is None:
            raise _Fail(400, "Bad Request: message to delete not found")
        for record in self._sent:
            if (record.chat_id, record.message_id) == (chat_id, message_id):
                record.deleted = True
        return True

    async def _m_sendmessagedraft(self, p: _Params) -> bool:
        self._chat(p.chat_id())
        self._formatted(p, "text", MAX_TEXT)  # an empty draft shows "Thinking..."
        return True

    async def _m_sendchataction(self, p: _Params) -> bool:
        chat_id, action = p.chat_id(), p.string("action") or ""
        if action not in CHAT_ACTIONS:
            raise _Fail(400, "Bad Request: wrong parameter action in request")
        thread_id = p.integer("message_thread_id")
        self.actions.append(ChatAction(chat_id, action, thread_id, time.monotonic()))
        return True

    async def _m_getfile(self, p: _Params) -> JSON:
        stored = self._files.get(p.string("file_id") or "")
        if stored is None:
            raise _Fail(400, "Bad Request: invalid file_id")
        if stored.size > MAX_DOWNLOAD:
            raise _Fail(400, "Bad Request: file is too big")
        return self._file_json(stored) | {"file_path": stored.path}

    async def _send_media(self, p: _Params, kind: str) -> JSON:
        value = p.string(kind) or ""
        upload = p.uploads.get(value.removeprefix("attach://")) or p.uploads.get(kind)
        url = None
        if upload is not None:
            content, filename, mime = upload.content, upload.filename, upload.mime_type
        elif value in self._files:
            content, filename, mime = self._files[value].content, None, None
        elif value.startswith(("http://", "https://")):
            content, filename, mime, url = b"", value.rsplit("/", 1)[-1], None, value
        elif value:
            raise _Fail(400, "Bad Request: wrong file identifier/HTTP URL specified")
        else:
            raise _Fail(400, f"Bad Request: there is no {kind} in the request")
        raw, visible, entities = self._formatted(p, "caption", MAX_CAPTION)
        stored = self._store_file(kind, content, filename)
        info = self._file_json(stored)
        if kind == "photo":
            media: Any = [info | {"width": 1280, "height": 960}]
        else:
            info |= {"file_name": filename} if filename and kind != "voice" else {}
            info |= {"mime_type": mime} if mime else {}
            if kind in ("voice", "audio", "video"):  # as sent, else as Telegram reads it
                seconds = p.integer("duration") or round(audio.duration(content) or 1)
                info["duration"] = max(1, seconds)
            media = info | ({"width": 640, "height": 480} if kind == "video" else {})
        body = {kind: media, "caption": visible, "caption_entities": entities}
        chat, message = self._new_message(p, body)
        file = SentFile(kind, stored.file_id, filename, mime, content, url)
        method = f"send{kind.title()}"
        self._record(
            p, chat, message, method=method, raw=raw, visible=visible, entities=entities, file=file
        )
        return message

    async def _m_sendphoto(self, p: _Params) -> JSON:
        return await self._send_media(p, "photo")

    async def _m_senddocument(self, p: _Params) -> JSON:
        return await self._send_media(p, "document")

    async def _m_sendvoice(self, p: _Params) -> JSON:
        return await self._send_media(p, "voice")

    async def _m_sendaudio(self, p: _Params) -> JSON:
        return await self._send_media(p, "audio")

    async def _m_sendvideo(self, p: _Params) -> JSON:
        return await self._send_media(p, "video")

    async def _m_answercallbackquery(self, p: _Params) -> bool:
        query = self._callbacks.get(p.string("callback_query_id") or "")
        if query is None:
            raise _Fail(400, QUERY_INVALID)
        late = self.callback_timeout is not None and (
            self.now() - query.pressed_at > self.callback_timeout
        )
        if query.answer is not None or late:
            query.refusals += 1
            raise _Fail(400, QUERY_INVALID)
        text = p.string("text")
        if text is not None and len(text) > MAX_CALLBACK_ANSWER:
            raise _Fail(400, "Bad Request: MESSAGE_TOO_LONG")
        url, cache_time = p.string("url"), p.integer("cache_time")
        query.answer = CallbackAnswer(text, p.flag("show_alert"), url, cache_time, self.now())
        return True

    async def _m_setmessagereaction(self, p: _Params) -> bool:
        p.chat_id()
        return True

    # ---- HTTP control API ----------------------------------------------------------------

    async def _control(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if request.method == "GET":
            chat_id = request.query.get("chat_id")
            listing: dict[str, Callable[[], list[Any]]] = {
                "sent": lambda: [m.json() for m in self.sent(int(chat_id) if chat_id else None)],
                "actions": lambda: [asdict(a) for a in self.actions],
                "requests": lambda: [asdict(r) for r in self.requests],
                "updates": lambda: self.pending_updates,
                "callbacks": lambda: [asdict(q) for q in self.callback_queries],
                "deliveries": lambda: [asdict(d) for d in self.deliveries],
            }
            return (
                web.json_response(listing[name]()) if name in listing else _error(404, "Not Found")
            )
        body: JSON = await request.json()
        if "content_base64" in body:
            body["content"] = base64.b64decode(body.pop("content_base64"))
        if name in _INJECT:
            return web.json_response({"update_id": getattr(self, name)(**body)})
        if name == "press_button":
            query = self.press_button(**body)
            return web.json_response({"id": query.id, "update_id": query.update_id})
        if name == "advance_clock":
            self.advance_clock(float(body["seconds"]))
        elif name == "fail_next":
            fault = fault_from_json(body["fault"])
            self.fail_next(body["method"], fault, body.get("times", 1), chat_id=body.get("chat_id"))
        elif name == "clear_faults":
            self.clear_faults(body.get("chat_id"))
        elif name == "offline":
            self.offline = bool(body["offline"])
        elif name == "route_webhook":
            self.route_webhook(body["public"], body["local"])
        else:
            return _error(404, "Not Found")
        return web.json_response({"ok": True})


async def _serve(fake: FakeTelegram) -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    async with fake:
        print(fake.base_url, flush=True)
        await stopped.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: ``python -m tests.fakes.telegram [--port N] [--token T] [--bot-username U]``."""
    parser = argparse.ArgumentParser(description="Fake Telegram Bot API server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", help="the only accepted token (default: the first seen)")
    parser.add_argument("--bot-username", default="nanobot_test_bot")
    parser.add_argument(
        "--callback-timeout", type=float, default=15.0, help="seconds to answer a button press"
    )
    args = parser.parse_args(argv)
    fake = FakeTelegram(
        token=args.token,
        host=args.host,
        port=args.port,
        bot_username=args.bot_username,
        callback_timeout=args.callback_timeout,
    )
    asyncio.run(_serve(fake))


if __name__ == "__main__":
    main()
