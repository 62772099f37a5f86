"""A scriptable fake of the OpenAI chat completions API, speaking the real wire format.

In process (it serves in the caller's loop, so a subprocess the test awaits can reach it)::

    async with FakeLLM() as fake:
        fake.script(ToolCalls([Call("read_file", {"path": "a.txt"})]), Text("done"))
        ...  # litellm: model="openai/fake-model", api_base=fake.base_url
        assert fake.requests[0].model == "fake-model"

Standalone: ``python -m tests.fakes.llm --port 0 --script replies.json`` prints the
base URL as its first stdout line and serves until SIGTERM. A script is a JSON list of
replies or ``{"replies": [...], "models": {"name": [...]}, "default": {...}}``; a reply
is ``{"type": "<class name>", **fields}``, e.g. ``{"type": "Text", "content": "hi"}``.
``POST /_fake/script`` takes ``{"replies": [...], "model"?: ...}``; ``GET
/_fake/requests`` lists the recorded requests (path, body, headers, received_at).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import re
import signal
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import msgspec
import orjson
from aiohttp import web

JSON = dict[str, Any]
CONTEXT_LENGTH_MESSAGE = (
    "This model's maximum context length is 8192 tokens. However, your messages resulted in "
    "9000 tokens. Please reduce the length of the messages."
)


@dataclass(frozen=True)
class Reply:
    """Base of all scripted replies. ``delay``: seconds before the first byte (None: global)."""

    delay: float | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class Text(Reply):
    """An assistant text reply; streamed word by word, finish_reason "stop". ``cost``: the
    price in USD the server reports in its ``usage`` (as OpenRouter and LiteLLM's proxy do);
    None leaves it out, as OpenAI does."""

    content: str
    cost: float | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class Echo(Reply):
    """Replies ``prefix + <text of the last user message>`` (the default reply)."""

    prefix: str = "echo: "


@dataclass(frozen=True)
class Call:
    """One tool call. ``arguments`` is a dict (JSON-encoded) or a raw string sent verbatim."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        """The arguments string exactly as it goes on the wire."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(dict(self.arguments))


@dataclass(frozen=True)
class ToolCalls(Reply):
    """Tool calls (optionally after some text); finish_reason "tool_calls"."""

    calls: Sequence[Call]
    content: str | None = None


@dataclass(frozen=True)
class ToolThenText(Reply):
    """``ToolCalls([call])``, or ``Text(text)`` when the request's last message is a tool
    result: one tool round per user message, whatever order concurrent chats call in."""

    call: Call
    text: str


@dataclass(frozen=True)
class RateLimit(Reply):
    """HTTP 429 with ``Retry-After`` (whole seconds, rounded up) and ``retry-after-ms``."""

    retry_after_seconds: float = 1.0


@dataclass(frozen=True)
class ServerError(Reply):
    """An HTTP 5xx (or any status) with an OpenAI-style ``server_error`` body."""

    status: int = 500
    message: str = "The server had an error while processing your request. Sorry about that!"


@dataclass(frozen=True)
class ContextLengthError(Reply):
    """HTTP 400 with OpenAI's exact ``context_length_exceeded`` body."""


@dataclass(frozen=True)
class ErrorBody(Reply):
    """An HTTP error in any server's own shape: ``status`` with ``body`` as its JSON (a
    string is sent as it is), e.g. llama.cpp's ``exceed_context_size_error`` or Ollama's
    ``{"error": "prompt too long; ..."}``."""

    status: int
    body: Any


@dataclass(frozen=True)
class StreamError(Reply):
    """A failure after the answer began: a streamed request gets HTTP 200, ``content`` in
    chunks, then ``data: {"error": error}`` and the end of the stream (as vLLM, llama.cpp
    and LiteLLM's proxy send it); a request for a whole answer gets the error as an HTTP
    error of the status in ``error["code"]`` (500 without one)."""

    error: JSON
    content: str = ""


@dataclass(frozen=True)
class AuthError(Reply):
    """HTTP 401 with OpenAI's ``invalid_api_key`` body."""


@dataclass(frozen=True)
class Hang(Reply):
    """Accept the request and never answer; the connection is dropped when the server stops."""


@dataclass(frozen=True)
class Disconnect(Reply):
    """Send a partial response (one chunk plus half of the next), then drop the connection."""

    content: str = "partial"


@dataclass(frozen=True)
class Cut(Reply):
    """A stream that ends early but cleanly: the first ``chunks`` chunks of ``content``
    (its role chunk counts), then the end of the response, with no ``finish_reason`` and
    no ``data: [DONE]`` (as a proxy that lost its upstream may send it). A request for a
    whole answer gets its JSON body cut the same way: half of it, and the end."""

    content: str = "The whole answer would have been much longer than this."
    chunks: int = 2


_KINDS: dict[str, type[Reply]] = {
    k.__name__: k
    for k in (Text, Echo, ToolCalls, RateLimit, ServerError, ContextLengthError, AuthError, Hang)
}
_KINDS |= {"ErrorBody": ErrorBody, "StreamError": StreamError}
_KINDS["ToolThenText"] = ToolThenText
_KINDS["Disconnect"] = Disconnect
_KINDS["Cut"] = Cut


def reply_from_json(obj: Mapping[str, Any]) -> Reply:
    """Build a reply from ``{"type": <class name>, **fields}``.

    ``ToolCalls`` takes ``"calls": [{"name", "arguments", "id"?}]``; ``ToolThenText``
    takes ``"call": {...}`` and ``"text"``.
    """
    data = dict(obj)
    kind = data.pop("type")
    if kind == "ToolCalls":
        data["calls"] = [Call(**c) for c in data["calls"]]
    elif kind == "ToolThenText":
        data["call"] = Call(**data["call"])
    return _KINDS[kind](**data)


@dataclass(frozen=True)
class RecordedRequest:
    """One request as received: path, raw JSON body, headers, ``time.monotonic()`` arrival.

    ``body`` is the parsed JSON, parsed on first use: the server itself reads only what it
    answers from (see ``_Head``).
    """

    path: str
    raw: bytes
    headers: dict[str, str]
    received_at: float

    @functools.cached_property
    def body(self) -> JSON:
        body: JSON = orjson.loads(self.raw)
        return body

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def messages(self) -> list[JSON]:
        return list(self.body.get("messages", []))

    @property
    def tools(self) -> list[JSON]:
        return list(self.body.get("tools") or [])


class _Head(msgspec.Struct):
    """What the fake answers from. Decoding into it checks that the whole body is JSON but
    builds no objects for the rest: each message stays raw bytes until one is needed (the
    last user message for an echo). The fake plays a model that answers in 0 ms, so that
    benchmarks time the client (parsing a 60 KiB transcript whole took ~0.1 ms more).
    """

    model: Any = ""
    stream: Any = False
    stream_options: Any = None
    messages: list[msgspec.Raw] = []


_HEAD = msgspec.json.Decoder(_Head)


def _error(status: int, message: str, type_: str, code: str | None, **headers: str) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def _fault(reply: Reply, request: web.Request) -> web.Response | None:
    """The HTTP error response for a fault reply, or None for a successful reply."""
    match reply:
        case RateLimit(retry_after_seconds=seconds):
            msg = "Rate limit reached for requests. Please try again later."
            headers = {
                "Retry-After": str(math.ceil(seconds)),
                "retry-after-ms": str(round(seconds * 1000)),
            }
            return _error(429, msg, "rate_limit_error", "rate_limit_exceeded", **headers)
        case ServerError(status=status, message=message):
            return _error(status, message, "server_error", None)
        case ContextLengthError():
            code = "context_length_exceeded"
            return _error(400, CONTEXT_LENGTH_MESSAGE, "invalid_request_error", code)
        case ErrorBody(status=status, body=body):
            text = body if isinstance(body, str) else json.dumps(body)
            return web.Response(status=status, text=text, content_type="application/json")
        case AuthError():
            key = request.headers.get("Authorization", "").removeprefix("Bearer ")
            msg = (
                f"Incorrect API key provided: {key}. You can find your API key at "
                "https://platform.openai.com/account/api-keys."
            )
            return _error(401, msg, "invalid_request_error", "invalid_api_key")
    return None


def _message(raw: msgspec.Raw) -> JSON:
    message = orjson.loads(memoryview(raw))
    return message if isinstance(message, dict) else {}


def _last_user_text(messages: Sequence[msgspec.Raw]) -> str:
    for message in map(_message, reversed(messages)):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def _pieces(text: str, parts: int) -> list[str]:
    size = max(1, math.ceil(len(text) / parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _stream_deltas(content: str, calls: list[JSON]) -> list[JSON]:
    """The ``delta`` objects of a stream: role, words of ``content``, then each call's deltas."""
    deltas: list[JSON] = [{"content": word} for word in re.findall(r"\S*\s*", content) if word]
    for index, call in enumerate(calls):
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        first = {**call, "index": index, "function": {"name": name, "arguments": ""}}
        deltas.append({"tool_calls": [first]})
        deltas += [
            {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            for piece in _pieces(arguments, 4)
        ]
    if content or not calls:
        deltas.insert(0, {"role": "assistant", "content": ""})
    else:  # like OpenAI, the role rides on the first tool-call delta
        deltas[0] = {"role": "assistant", "content": None, **deltas[0]}
    return deltas


class _Closable(Protocol):
    async def aclose(self) -> None: ...


_C = TypeVar("_C", bound=_Closable)


class FakeLLM:
    """An OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1.

    Each request consumes one reply: first from the queue for its ``model``
    (see ``script_for``), then from the shared queue (``script``), else
    ``default_reply`` (``Echo()``). ``delay`` is the global latency before the
    first byte; ``chunk_delay`` the pause between streamed chunks. ``stop()``
    releases hanging and delayed requests (dropping their connections), so it
    returns promptly.

    ``requests`` holds every request (its whole body too), or only the newest
    ``keep_requests``: a benchmark sending thousands of long transcripts would
    otherwise grow this process by hundreds of MiB, and the fresh memory (page
    faults) made each long request measurably slower to serve than a short one.
    """

    def __init__(
        self,
        *replies: Reply,
        host: str = "127.0.0.1",
        port: int = 0,
        delay: float = 0.0,
        chunk_delay: float = 0.0,
        default_reply: Reply | None = None,
        keep_requests: int | None = None,
    ) -> None:
        if keep_requests is not None and keep_requests < 1:
            raise ValueError(f"keep_requests must be at least 1, not {keep_requests}")
        self.host, self.port = host, port
        self.delay, self.chunk_delay = delay, chunk_delay
        self.default_reply: Reply = default_reply or Echo()
        self.requests: list[RecordedRequest] = []
        self.keep_requests = keep_requests
        self._received = 0
        self._queue: deque[Reply] = deque(replies)
        self._by_model: dict[str, deque[Reply]] = {}
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self._arrived = asyncio.Condition()
        self._clients: list[_Closable] = []

    def script(self, *replies: Reply) -> None:
        """Append replies to the shared queue, consumed in order, one per request."""
        self._queue.extend(replies)

    def script_for(self, model: str, *replies: Reply) -> None:
        """Append replies for requests whose body ``model`` equals ``model``.

        A leading ``openai/`` is stripped, since litellm sends ``foo`` for ``openai/foo``.
        """
        self._by_model.setdefault(model.removeprefix("openai/"), deque()).extend(replies)

    def load_script(self, data: Any) -> None:
        """Load a JSON script: a list of replies or ``{"replies", "models", "default"}``."""
        if isinstance(data, list):
            data = {"replies": data}
        self.script(*(reply_from_json(r) for r in data.get("replies", [])))
        for model, replies in data.get("models", {}).items():
            self.script_for(model, *(reply_from_json(r) for r in replies))
        if "default" in data:
            self.default_reply = reply_from_json(data["default"])

    @property
    def pending(self) -> int:
        """Scripted replies not yet consumed (all queues)."""
        return len(self._queue) + sum(len(q) for q in self._by_model.values())

    @property
    def request_count(self) -> int:
        """Requests received so far, including those no longer kept in ``requests``."""
        return self._received

    async def wait_for_requests(self, count: int, seconds: float = 5.0) -> None:
        """Wait until ``count`` requests have arrived; ``TimeoutError`` after ``seconds``."""
        async with asyncio.timeout(seconds), self._arrived:
            await self._arrived.wait_for(lambda: self._received >= count)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: what litellm takes as ``api_base``."""
        if self._runner is None:
            raise RuntimeError("FakeLLM is not started")
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> None:
        """Bind and serve in the running loop; ``port`` becomes the bound port."""
        app = web.Application(client_max_size=64 * 1024 * 1024)  # long agent transcripts
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/chat/completions", self._completions)
            app.router.add_get(f"{prefix}/models", self._models)
        app.router.add_post("/_fake/script", self._control_script)
        app.router.add_get("/_fake/requests", self._control_requests)
        self._stopping = asyncio.Event()
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])

    def owns(self, client: _C) -> _C:
        """`client` (a provider, a transport: anything with `aclose()`), closed when this
        server stops, before it does: a test's client of it needs no teardown of its own."""
        self._clients.append(client)
        return client

    async def stop(self) -> None:
        """Close the clients it `owns`, release pending requests, drop their connections,
        close the socket. Idempotent."""
        clients, self._clients = self._clients, []
        for client in clients:
            await client.aclose()
        if self._runner is None:
            return
        self._stopping.set()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server stops first; returns False if it is stopping."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), seconds)
        return not self._stopping.is_set()

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            head = _HEAD.decode(raw)
        except msgspec.DecodeError:  # not JSON, not an object, or messages not an array
            msg = "We could not parse the JSON body of your request."
            return _error(400, msg, "invalid_request_error", None)
        async with self._arrived:
            self.requests.append(
                RecordedRequest(request.path, raw, dict(request.headers), time.monotonic())
            )
            self._received += 1
            if self.keep_requests is not None and len(self.requests) > self.keep_requests:
                del self.requests[: -self.keep_requests]
            self._arrived.notify_all()
        model = str(head.model)
        queue = self._by_model.get(model)
        reply = queue.popleft() if queue else self._queue.popleft() if self._queue else None
        reply = reply or self.default_reply
        delay = self.delay if reply.delay is None else reply.delay
        if isinstance(reply, Hang) or not await self._sleep(delay):
            await self._stopping.wait()
            return self._abort(request)
        if (fault := _fault(reply, request)) is not None:
            return fault
        try:
            return await self._succeed(request, head, reply, len(raw))
        except ConnectionError:  # the client went away mid-stream
            return web.Response(status=499)

    async def _succeed(
        self, request: web.Request, asked: _Head, reply: Reply, size: int
    ) -> web.StreamResponse:
        """Answer with ``reply`` (Text, Echo, ToolCalls, ToolThenText, Disconnect, Cut or
        StreamError), streamed
        if asked. ``size``: the request body's length in bytes; a quarter of it is the prompt's
        token count (not re-encoding the messages keeps long requests cheap to serve)."""
        if isinstance(reply, Echo):
            reply = Text(reply.prefix + _last_user_text(asked.messages))
        elif isinstance(reply, ToolThenText):
            messages = asked.messages
            after_tool = bool(messages) and _message(messages[-1]).get("role") == "tool"
            reply = Text(reply.text) if after_tool else ToolCalls([reply.call])
        content = (reply.content or "") if isinstance(reply, Text | ToolCalls) else ""
        calls: list[JSON] = [
            {
                "id": c.id or f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments_json()},
            }
            for c in (reply.calls if isinstance(reply, ToolCalls) else ())
        ]
        prompt = max(1, size // 4)
        completion = max(1, len(content + "".join(c["function"]["arguments"] for c in calls)) // 4)
        usage: JSON = {"prompt_tokens": prompt, "completion_tokens": completion}
        usage["total_tokens"] = prompt + completion
        if isinstance(reply, Text) and reply.cost is not None:
            usage["cost"] = reply.cost
        base: JSON = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "created": int(time.time()),
            "model": str(asked.model),
            "system_fingerprint": "fp_fake",
        }
        finish = "tool_calls" if calls else "stop"
        stream = bool(asked.stream)
        if isinstance(reply, Disconnect):
            return await self._disconnect(request, base, reply.content, stream)
        if isinstance(reply, Cut):
            return await self._cut(request, base, reply, stream)
        if isinstance(reply, StreamError):
            return await self._fail_midway(request, base, reply, stream)
        if not stream:
            message: JSON = {"role": "assistant", "content": content or None, "refusal": None}
            message |= {"tool_calls": calls} if calls else {}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            return web.json_response(
                {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
            )
        options = asked.stream_options if isinstance(asked.stream_options, dict) else {}
        include_usage = bool(options.get("include_usage"))
        head: JSON = {**base, "object": "chat.completion.chunk"}
        head |= {"usage": None} if include_usage else {}  # OpenAI: null but on the last chunk
        deltas = [*_stream_deltas(content, calls), {}]
        chunks: list[JSON] = [
            {**head, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}]}
            for d in deltas
        ]
        chunks[-1]["choices"][0]["finish_reason"] = finish
        chunks += [{**head, "choices": [], "usage": usage}] if include_usage else []
        response = await self._start(request)
        for i, chunk in enumerate(chunks):
            if i and not await self._sleep(self.chunk_delay):
                return self._abort(request, response)
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _disconnect(
        self, request: web.Request, base: JSON, content: str, stream: bool
    ) -> web.StreamResponse:
        """Send a chunk and half of the next (or half a JSON body), then drop the connection."""
        delta = {"role": "assistant", "content": content}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        chunk = json.dumps({**base, "object": "chat.completion.chunk", "choices": [choice]})
        payload = f"data: {chunk}\n\ndata: {chunk}" if stream else chunk
        response = await self._start(request, stream, len(payload))
        await response.write(payload[: len(payload) * 3 // 4].encode())
        return self._abort(request, response)

    async def _cut(
        self, request: web.Request, base: JSON, reply: Cut, stream: bool
    ) -> web.StreamResponse:
        """Send the first chunks of ``reply`` (or half a JSON body) and end the response."""
        head: JSON = {**base, "object": "chat.completion.chunk"}
        if not stream:
            message = {"role": "assistant", "content": reply.content}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            body = json.dumps({**base, "object": "chat.completion", "choices": [choice]})
            cut = body[: len(body) // 2].encode()
            response = await self._start(request, False, len(cut))
            await response.write(cut)
            await response.write_eof()
            return response
        response = await self._start(request)
        for delta in _stream_deltas(reply.content, [])[: reply.chunks]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            await response.write(b"data: " + json.dumps({**head, "choices": [choice]}).encode())
            await response.write(b"\n\n")
        await response.write_eof()
        return response

    async def _fail_midway(
        self, request: web.Request, base: JSON, reply: StreamError, stream: bool
    ) -> web.StreamResponse:
        """Stream ``reply.content``, then its error (see ``StreamError``)."""
        if not stream:
            code = reply.error.get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            return web.json_response({"error": reply.error}, status=status)
        head: JSON = {**base, "object": "chat.completion.chunk"}
        response = await self._start(request)
        for delta in _stream_deltas(reply.content, []) if reply.content else []:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            chunk = {**head, "choices": [choice]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: " + json.dumps({"error": reply.error}).encode() + b"\n\n")
        await response.write_eof()
        return response

    @staticmethod
    async def _start(
        request: web.Request, stream: bool = True, length: int | None = None
    ) -> web.StreamResponse:
        """Send the headers of an SSE stream (or of a JSON body of ``length`` bytes)."""
        kind = "text/event-stream; charset=utf-8" if stream else "application/json"
        response = web.StreamResponse(headers={"Content-Type": kind, "Cache-Control": "no-cache"})
        response.content_length = None if stream else length
        await response.prepare(request)
        return response

    @staticmethod
    def _abort(
        request: web.Request, response: web.StreamResponse | None = None
    ) -> web.StreamResponse:
        """Drop the connection without completing the response."""
        if request.transport is not None:
            request.transport.abort()
        return response if response is not None else web.Response(status=499)

    async def _models(self, request: web.Request) -> web.Response:
        names = sorted({"fake-model", *self._by_model, *(r.model for r in self.requests)} - {""})
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "fake"} for n in names]
        return web.json_response({"object": "list", "data": data})

    async def _control_script(self, request: web.Request) -> web.Response:
        data = await request.json()
        replies = [reply_from_json(r) for r in data.get("replies", [])]
        if data.get("model"):
            self.script_for(data["model"], *replies)
        else:
            self.script(*replies)
        return web.json_response({"pending": self.pending})

    async def _control_requests(self, request: web.Request) -> web.Response:
        return web.json_response(
            [
                {"path": r.path, "body": r.body, "headers": r.headers, "received_at": r.received_at}
                for r in self.requests
            ]
        )


async def _serve(fake: FakeLLM) -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    async with fake:
        print(fake.base_url, flush=True)
        await stopped.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: ``python -m tests.fakes.llm [--port N] [--script FILE] [--delay S]
    [--keep-requests N]``."""
    parser = argparse.ArgumentParser(description="Fake OpenAI chat completions server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", type=Path, help="JSON file with scripted replies")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between chunks")
    parser.add_argument(
        "--keep-requests",
        type=int,
        metavar="N",
        help="keep only the newest N requests for /_fake/requests (default: all)",
    )
    args = parser.parse_args(argv)
    fake = FakeLLM(
        host=args.host,
        port=args.port,
        delay=args.delay,
        chunk_delay=args.chunk_delay,
        keep_requests=args.keep_requests,
    )
    if args.script:
        fake.load_script(json.loads(args.script.read_text(encoding="utf-8")))
    asyncio.run(_serve(fake))


if __name__ == "__main__":
    main()
