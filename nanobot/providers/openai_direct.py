"""The direct transport: nanobot speaks the OpenAI chat-completions streaming protocol
itself, over aiohttp.

For OpenAI-compatible servers only (vLLM, llama.cpp, LM Studio, Ollama's /v1, OpenAI). It
costs a small fraction of litellm's CPU per call, and its import does not load litellm;
parameters are sent as given, with none of litellm's per-vendor translation. Retries,
fallbacks, token counting, the context window, vision and prices are the provider's.

`agent.transport: auto` (the default) uses it only for the calls litellm would make
unchanged, and litellm for every other (`routes.Routes`): to `agent.api_base`, or without
one to OpenAI's API where litellm would send them (`openai_api_base`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

from nanobot.errors import ProviderError, ProviderErrorKind
from nanobot.providers._stream import Assembler, looks_like_overflow, retry_after
from nanobot.providers.base import Call, Completion, DeltaHandler
from nanobot.proxies import env_proxy

_DETAIL_LIMIT = 500  # characters of the server's error message kept in ours
OPENAI_API = "https://api.openai.com/v1"
# Where LiteLLM's proxy says what an answer cost, when its `usage` does not.
COST_HEADER = "x-litellm-response-cost"
# The headers litellm's OpenAI client adds from the environment, and their variables.
_ENV_HEADERS = (
    ("OpenAI-Organization", ("OPENAI_ORGANIZATION", "OPENAI_ORG_ID")),
    ("OpenAI-Project", ("OPENAI_PROJECT_ID",)),
)


def openai_api_base() -> str:
    """Where litellm sends an OpenAI model's calls when given no `api_base`: the
    environment's OPENAI_BASE_URL, else OPENAI_API_BASE, else OpenAI's API."""
    return os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE") or OPENAI_API


class DirectTransport:
    """A `Transport` whose calls go straight to `{api_base}/chat/completions`.

    Every model it is given is sent to that endpoint, without a leading `openai/`, through
    the proxy the environment names for it when built (as litellm's httpx would), with
    `api_key` as a bearer token, else (`key_from_env`, as litellm would take it)
    OPENAI_API_KEY's, with the organization and project headers litellm's client would take
    from the environment too. `needs_key`, for a server that takes no call without a key
    (OpenAI's), says where to set one: `missing_key` then tells when there is none, and a
    call fails at once. One aiohttp session, opened on the first call in the running loop;
    `aclose()` closes it, and a later call opens a new one (so use one event loop at a time,
    and close the transport before its loop ends).

    Raises:
        ValueError: `api_base` is missing.
    """

    def __init__(
        self,
        api_base: str | None,
        *,
        api_key: str | None = None,
        key_from_env: bool = False,
        needs_key: str | None = None,
        request_timeout: float = 120.0,
    ) -> None:
        if not api_base:
            raise ValueError(
                "the direct transport needs api_base: the URL of an OpenAI-compatible API, "
                "e.g. http://localhost:8000/v1"
            )
        self._url = f"{api_base.rstrip('/')}/chat/completions"
        self._timeout = request_timeout
        self._key = api_key or (os.environ.get("OPENAI_API_KEY") if key_from_env else None)
        self._headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
        if self._key:
            self._headers["Authorization"] = f"Bearer {self._key}"
        for header, names in _ENV_HEADERS if key_from_env else ():
            value = next((os.environ[n] for n in names if os.environ.get(n)), None)
            if value is not None:
                self._headers[header] = value
        self._needs_key = needs_key
        self._proxy = env_proxy(self._url)
        self._session: aiohttp.ClientSession | None = None

    def prepare(self) -> None:
        """Nothing to load: the session opens in the loop of the first call."""

    def missing_key(self, model: str) -> str | None:
        """Why no call can be made for want of an API key ("no API key for openai: set
        agent.api_key or OPENAI_API_KEY"), or None: always None without `needs_key`."""
        if self._key or self._needs_key is None:
            return None
        return f"no API key for openai: set {self._needs_key}"

    async def aclose(self) -> None:
        """Close the HTTP session; calls still streaming fail as "unavailable"."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # Concurrency is bounded by the agent's turn limit, not by the pool.
                connector=aiohttp.TCPConnector(limit=0),
                # A stream may rightly run for minutes; only silence that long is a failure.
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self._timeout, sock_read=self._timeout
                ),
            )
        return self._session

    async def stream(self, call: Call, on_delta: DeltaHandler | None) -> Completion:
        """See `Transport.stream`. Cancellation closes the HTTP response. Without the key it
        needs, fails at once (`auth`), without a request."""
        model = call.model
        if (problem := self.missing_key(model)) is not None:
            raise ProviderError("auth", f"{model}: {problem}", model=model)
        body: dict[str, Any] = {
            "model": model.removeprefix("openai/"),
            "messages": list(call.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": call.max_tokens,
            "temperature": call.temperature,
        }
        if call.tools:
            body["tools"] = list(call.tools)
        assembler = Assembler(on_delta)
        try:
            # orjson: a long window is tens of KiB of JSON per call, and the standard
            # library's encoder took longer over it than all of nanobot's turn besides.
            request = self._client().post(
                self._url, data=orjson.dumps(body), headers=self._headers, proxy=self._proxy
            )
            async with request as reply:
                if reply.status >= 400:
                    raise await self._http_error(model, reply)
                await self._read_stream(model, reply, assembler)
                assembler.header_cost(reply.headers.get(COST_HEADER))
        except TimeoutError as exc:  # before ClientError: aiohttp's timeouts are both
            message = f"{model}: no answer for {self._timeout:g}s"
            raise ProviderError("timeout", message, model=model) from exc
        except (aiohttp.ClientError, OSError) as exc:
            message = f"{model}: {type(exc).__name__}: {exc}"
            raise ProviderError("unavailable", message, model=model) from exc
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            # A JSON chunk of a shape no OpenAI-compatible server sends.
            message = f"{model}: a chunk of an unexpected shape: {type(exc).__name__}: {exc}"
            raise ProviderError("bad_request", message, model=model) from exc
        return assembler.result(model, assembler.usage)

    async def _read_stream(
        self, model: str, reply: aiohttp.ClientResponse, assembler: Assembler
    ) -> None:
        lines = _Lines()
        async for data in reply.content.iter_any():
            for payload in lines.feed(data):
                if payload == b"[DONE]":
                    return
                chunk = _decode(payload, model)
                if chunk.get("error") is not None:
                    raise self._stream_error(model, chunk["error"])
                assembler.add_json(chunk)
        if not assembler.finished:
            message = f"{model}: the stream ended before the answer did"
            raise ProviderError("unavailable", message, model=model)

    async def _http_error(self, model: str, reply: aiohttp.ClientResponse) -> ProviderError:
        text = (await reply.read()).decode("utf-8", "replace")
        kind = _kind_for_status(reply.status, text)
        wait = retry_after(reply) if kind == "rate_limited" else None
        message = f"{model}: HTTP {reply.status}: {self._redact(_server_message(text))}"
        return ProviderError(kind, message, model=model, retry_after=wait)

    def _stream_error(self, model: str, error: object) -> ProviderError:
        status = _error_status(error)
        text = json.dumps(error)
        message = f"{model}: error in the stream ({status}): {self._redact(_server_message(text))}"
        return ProviderError(_kind_for_status(status, text), message, model=model)

    def _redact(self, text: str) -> str:
        # OpenAI, and so the servers copying it, quote a refused key back in the message.
        if self._key:
            text = text.replace(self._key, "<api_key>")
        return text


class _Lines:
    """Splits a server-sent-events byte stream into the payloads of its `data:` lines.

    One JSON document per `data:` line is what every OpenAI-compatible server sends, so
    lines are not joined into multi-line events; blank lines, comments (`:`) and other fields
    are skipped.
    """

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads of the lines `data` completes, in order; a partial line waits."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return [line[5:].strip() for line in lines if line.startswith(b"data:")]


def _decode(payload: bytes, model: str) -> dict[str, Any]:
    try:
        chunk = orjson.loads(payload)
    except ValueError:
        chunk = None
    if not isinstance(chunk, dict):
        # Bytes that are not a chunk come from a broken server or proxy mid-answer, not from
        # our request: "unavailable" retries, then moves on to a fallback.
        shown = payload[:_DETAIL_LIMIT].decode("utf-8", "replace")
        message = f"{model}: the stream carried something that is not a JSON chunk: {shown!r}"
        raise ProviderError("unavailable", message, model=model)
    return chunk


def _kind_for_status(status: int, body: str) -> ProviderErrorKind:
    """The error kind of an HTTP status, given the body the server sent with it.

    A request too long for the model is an overflow whatever the status: servers say so
    with 400 (OpenAI, vLLM, llama.cpp, Ollama) or 500 (a proxy passing an upstream error
    on), and retrying it unchanged would only fail again.
    """
    if status == 429:
        return "rate_limited"
    if status in (401, 403):
        return "auth"
    if status != 408 and looks_like_overflow(body):
        return "context_overflow"
    if status == 408 or status >= 500:
        return "unavailable"
    return "bad_request"


def _error_status(error: object) -> int:
    """The HTTP status an `{"error": ...}` object sent mid-stream stands for."""
    if not isinstance(error, Mapping):
        return 500
    code = error.get("code")
    if isinstance(code, str) and code.isdigit():  # LiteLLM's proxy sends "400"
        code = int(code)
    if isinstance(code, int) and 400 <= code < 600:
        return code
    words = f"{error.get('type')} {code}".lower()
    for marker, status in (
        ("rate_limit", 429),
        ("api_key", 401),
        ("auth", 401),
        ("permission", 403),
        ("context_length", 400),
        ("invalid_request", 400),
    ):
        if marker in words:
            return status
    return 500  # the server accepted the request and then failed: its fault


def _server_message(text: str) -> str:
    """The server's own error message from an error body, else the body, shortened."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict) and error.get("message"):
        text = str(error["message"])
    elif isinstance(error, str):
        text = error
    text = " ".join(text.split())
    return text if len(text) <= _DETAIL_LIMIT else text[: _DETAIL_LIMIT - 1] + "…"
