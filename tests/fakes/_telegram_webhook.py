"""The fake Telegram's webhook side: what setWebhook accepts, and one delivery of an update.

Telegram posts each update to the webhook URL as JSON, with the secret token (when one was
set) in ``X-Telegram-Bot-Api-Secret-Token``; any 2xx answer acknowledges it, anything else
(or no answer) has it posted again later. The URL must be public HTTPS, which a test cannot
serve: ``Routes`` plays the reverse proxy, sending what is posted to a public origin
(``https://bot.example.test``) to a local server (``http://127.0.0.1:PORT``), path unchanged.
A host with no route does not resolve, as for Telegram.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import aiohttp

JSON = dict[str, Any]
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
PORTS = (443, 80, 88, 8443)
_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")
NOT_HTTPS = "Bad Request: bad webhook: An HTTPS URL must be provided for webhook"
BAD_PORT = "Bad Request: bad webhook: Webhook can be set up only on ports 80, 88, 443 or 8443"
UNRESOLVED = "Bad Request: bad webhook: Failed to resolve host: Name or service not known"
BAD_SECRET = "Bad Request: secret token contains unallowed characters"


@dataclass
class Webhook:
    """The webhook as set: where updates go, and how the last attempt fared."""

    url: str
    secret_token: str | None = None
    max_connections: int = 40
    last_error_date: int | None = None
    last_error_message: str | None = None

    def info(self, pending: int, allowed: set[str]) -> JSON:
        """getWebhookInfo's answer."""
        out: JSON = {
            "url": self.url,
            "has_custom_certificate": False,
            "pending_update_count": pending,
            "max_connections": self.max_connections,
        }
        if allowed:
            out["allowed_updates"] = sorted(allowed)
        if self.last_error_date is not None:
            out |= {"last_error_date": self.last_error_date}
            out |= {"last_error_message": self.last_error_message}
        return out


@dataclass(frozen=True)
class Delivery:
    """One attempt to post an update: the HTTP status (None: no answer) and, unless it was
    a 2xx, what Telegram's getWebhookInfo would say about it."""

    update_id: int
    status: int | None
    error: str | None
    at: float = field(default_factory=time.monotonic)

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class Routes:
    """The reverse proxy in front of the bot: public origin → local base URL."""

    def __init__(self) -> None:
        self._to: dict[str, str] = {}

    def add(self, public: str, local: str) -> None:
        """Send what is posted to `public`'s origin (scheme, host, port) to `local`."""
        self._to[_origin(public)] = local.rstrip("/")

    def target(self, url: str) -> str | None:
        """Where a post to `url` really goes; None if its host does not resolve."""
        local = self._to.get(_origin(url))
        if local is None:
            return None
        parts = urlsplit(url)
        return local + (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _origin(url: str) -> str:
    parts = urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{parts.port or default}"


def refusal(url: str, secret_token: str | None, routes: Routes) -> str | None:
    """Why Telegram would refuse setWebhook with these (None: it accepts them)."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        return NOT_HTTPS
    if (parts.port or 443) not in PORTS:
        return BAD_PORT
    if routes.target(url) is None:
        return UNRESOLVED
    if secret_token is not None and not _SECRET.fullmatch(secret_token):
        return BAD_SECRET
    return None


async def post(
    session: aiohttp.ClientSession, target: str, body: bytes, secret_token: str | None
) -> tuple[int | None, str | None]:
    """POST `body` as Telegram does; the status (None: no answer) and the error Telegram
    would note (None after a 2xx)."""
    headers = {"Content-Type": "application/json"}
    if secret_token is not None:
        headers[SECRET_HEADER] = secret_token
    try:
        async with session.post(target, data=body, headers=headers) as response:
            await response.read()
            status = response.status
    except TimeoutError:
        return None, "Read timeout expired"
    except aiohttp.ClientError as exc:
        return None, f"Connection failed: {exc}"
    if 200 <= status < 300:
        return status, None
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
    return status, f"Wrong response from the webhook: {status} {phrase}".rstrip()
