"""python-telegram-bot's HTTP requests made with aiohttp instead of httpx.

PTB's own `HTTPXRequest` spent more CPU per Bot API call than the rest of a reply's
delivery (httpx, httpcore, h11 and anyio for every sendMessage); aiohttp is already how
nanobot talks to models and Discord. PTB still does everything above the transport: the
parameters, the status codes and their errors (`BadRequest`, `RetryAfter`, …).
"""

from __future__ import annotations

import re
from typing import Any, Final, TypedDict

import aiohttp
import orjson
from telegram.error import NetworkError, TelegramError, TimedOut
from telegram.request import BaseRequest, RequestData

from nanobot.proxies import env_proxy

# PTB marks a timeout a call did not give with this value (its class is not public API).
_NOT_GIVEN: Final = type(BaseRequest.DEFAULT_NONE)


class Timeouts(TypedDict):
    """PTB's four timeouts, in seconds (None: no limit)."""

    connect_timeout: float | None
    read_timeout: float | None
    write_timeout: float | None
    pool_timeout: float | None


class AiohttpRequest(BaseRequest):
    """A `BaseRequest` over one aiohttp session, for the Bot API at `base_url`.

    Timeouts are PTB's four: `connect` and `pool` together bound getting a connection (aiohttp
    does not tell the two apart), `read` bounds each wait for the server, and all four
    together bound the whole request (aiohttp has no write timeout of its own). A timeout
    raises `TimedOut`, any other transport failure `NetworkError`. The proxy is the one the
    environment names for `base_url` (as httpx would use it), looked up once.
    """

    def __init__(
        self,
        base_url: str,
        *,
        pool_size: int,
        connect_timeout: float | None,
        read_timeout: float | None,
        write_timeout: float | None,
        pool_timeout: float | None,
        media_write_timeout: float | None = 20.0,
    ) -> None:
        self._pool_size = pool_size
        self._timeouts = (connect_timeout, read_timeout, write_timeout, pool_timeout)
        self._media_write_timeout = media_write_timeout
        self._proxy = env_proxy(base_url)
        self._session: aiohttp.ClientSession | None = None

    @property
    def read_timeout(self) -> float | None:
        """The read timeout used when a call passes none."""
        return self._timeouts[1]

    async def initialize(self) -> None:
        """Open the session; idempotent."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size),
                headers={"User-Agent": self.USER_AGENT},
            )

    async def shutdown(self) -> None:
        """Close the session; idempotent."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    @staticmethod
    def parse_json_payload(payload: bytes) -> dict[str, Any]:
        """The Bot API's answer as a dict; raises `TelegramError` if it is not JSON."""
        try:
            parsed = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise TelegramError("Invalid server response") from exc
        if not isinstance(parsed, dict):
            raise TelegramError("Invalid server response")
        return parsed

    async def do_request(  # noqa: PLR0917 - the signature is PTB's
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: object = BaseRequest.DEFAULT_NONE,
        write_timeout: object = BaseRequest.DEFAULT_NONE,
        connect_timeout: object = BaseRequest.DEFAULT_NONE,
        pool_timeout: object = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        """Make one request; returns the status code and the body, whatever the status
        (a Bot API answer that says it failed with the status of its failure: `_status_of`).

        A timeout is seconds, None (no limit) or PTB's `DEFAULT_NONE` (the request's own).
        """
        if self._session is None:
            raise RuntimeError("AiohttpRequest is not initialized")
        fields = request_data.json_parameters if request_data is not None else {}
        files = request_data is not None and request_data.contains_files
        default_write = self._media_write_timeout if files else self._timeouts[2]
        connect, read, write, pool = (
            _seconds(given, default)
            for given, default in zip(
                (connect_timeout, read_timeout, write_timeout, pool_timeout),
                (self._timeouts[0], self._timeouts[1], default_write, self._timeouts[3]),
                strict=True,
            )
        )
        timeout = aiohttp.ClientTimeout(
            total=_sum(connect, pool, write, read),
            connect=_sum(connect, pool),
            sock_read=read,
        )
        try:
            async with self._session.request(
                method, url, data=_body(request_data, fields), timeout=timeout, proxy=self._proxy
            ) as reply:
                body = await reply.read()
        except TimeoutError as exc:  # before ClientError: aiohttp's timeouts are both
            raise TimedOut from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise NetworkError(f"aiohttp.{type(exc).__name__}: {exc}") from exc
        # PTB POSTs Bot API calls and GETs files (whose bytes are no answer to read).
        return (_status_of(reply.status, body) if method == "POST" else reply.status), body


# An unescaped `"ok": false` anywhere in a body (in a message's text the quotes are escaped).
_NOT_OK = re.compile(rb'(?<!\\)"ok"\s*:\s*false')
_BAD_GATEWAY = 502


def _status_of(status: int, body: bytes) -> int:
    """The status PTB should see for a Bot API call's answer: a 2xx whose body says
    `"ok": false` is the error it reports, with its `error_code` (502 when it gives none, or
    none of 4xx/5xx), and a 2xx that is not a JSON object at all (a proxy's page) is a 502.

    PTB reads any 2xx as a success and takes its `result` (a `KeyError` when there is none,
    which no caller expects); as an error status it raises its usual error for it instead
    (`BadRequest` with the description, `NetworkError` for a 502), which delivery retries
    or gives up like any other. Costs one regular expression search per answer.
    """
    if not 200 <= status < 300:
        return status
    if not body.lstrip().startswith(b"{"):
        return _BAD_GATEWAY
    if _NOT_OK.search(body) is None:
        return status
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return status  # PTB says "Invalid server response"
    if not isinstance(parsed, dict) or parsed.get("ok") is not False:
        return status
    return _error_code(parsed.get("error_code"))


def _error_code(code: object) -> int:
    """The HTTP status of a Bot API `error_code`: 502 for one that is none (absent, not a
    number, outside 400-599)."""
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        return code
    return _BAD_GATEWAY


def _body(
    request_data: RequestData | None, fields: dict[str, str]
) -> aiohttp.FormData | dict[str, str] | None:
    """The form PTB's httpx request would send (`fields`: its JSON-encoded parameters):
    urlencoded, or multipart with files."""
    if request_data is None:
        return None
    if not request_data.contains_files:
        return fields
    form = aiohttp.FormData(quote_fields=False)
    for name, value in fields.items():
        form.add_field(name, value)
    for name, (filename, content, mimetype) in request_data.multipart_data.items():
        form.add_field(name, content, filename=filename, content_type=mimetype)
    return form


def _seconds(given: object, default: float | None) -> float | None:
    """A timeout a call gave, else `default`."""
    if isinstance(given, _NOT_GIVEN):
        return default
    if given is None or isinstance(given, float):
        return given
    if isinstance(given, int):
        return float(given)
    raise TypeError(f"a timeout is seconds or None, not {given!r}")


def _sum(*timeouts: float | None) -> float | None:
    """The timeouts added up; None (no limit) if any of them is."""
    if any(timeout is None for timeout in timeouts):
        return None
    return sum(timeout for timeout in timeouts if timeout is not None)
