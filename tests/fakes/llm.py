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

Audio, as OpenAI serves it (litellm's ``atranscription``/``aspeech`` with ``openai/``,
``groq/``, ``hosted_vllm/`` and the other OpenAI-compatible providers send exactly this)::

    fake.add_transcript(voice_note_bytes, "hello there")  # keyed by the bytes' sha256
    # litellm.atranscription(model="openai/whisper-1", file=("v.ogg", data, "audio/ogg"),
    #                        api_base=fake.base_url, api_key="k")  -> .text == "hello there"
    fake.script_for("whisper-1", RateLimit(2))  # faults for audio are scripted per model

``POST /audio/transcriptions`` takes OpenAI's multipart upload (``file`` with a filename,
``model``, optional ``language``, ``prompt``, ``response_format`` json|text|srt|
verbose_json|vtt, ``timestamp_granularities[]``, ``temperature``), refuses what OpenAI
refuses with its error bodies (no file or model, a file over 25 MB, a file name whose
extension is not an audio format, a malformed language, a format other than json or text
for the ``gpt-4o`` models) and answers the text the upload's sha256 is mapped to in
``transcripts`` (else ``default_transcript``; if None, OpenAI's 400 for an audio it cannot
decode), with the audio's duration read from a WAV or OGG/Opus file. A ``Text`` reply
scripted for the model answers its content instead; ``Echo(delay=...)`` answers from the
table, late.
``POST /audio/speech`` takes ``{model, input, voice, response_format?, speed?}`` and
answers ``speech_audio(input, ...)`` with OpenAI's Content-Type (``opus``: a real OGG/Opus
file). Both are recorded in ``audio_requests``, not in ``requests``; both take their faults
and delays from the queue of their model (``script_for``), never from the shared queue of
the chat replies. ``POST /_fake/transcripts`` takes ``{"text", "sha256" | "content_base64"}``,
``GET /_fake/audio_requests`` lists the audio requests; a script file may hold
``"transcripts": {sha256: text}`` and ``"default_transcript"``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import io
import json
import math
import re
import signal
import struct
import time
import uuid
import wave
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import msgspec
import orjson
from aiohttp import web

from tests.fakes import audio

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
    cost_header: str | None = field(default=None, kw_only=True)  # x-litellm-response-cost


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
    """Tool calls (optionally after some text); finish_reason "tool_calls". ``cost``: as
    ``Text``'s."""

    calls: Sequence[Call]
    content: str | None = None
    cost: float | None = field(default=None, kw_only=True)


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


def _error(
    status: int,
    message: str,
    type_: str,
    code: str | None,
    *,
    param: str | None = None,
    **headers: str,
) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
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


# ---- audio: /audio/transcriptions and /audio/speech ------------------------------------

TRANSCRIPTION_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
# What OpenAI takes, judged by the uploaded file's name (a local whisper server takes more:
# set ``FakeLLM.audio_formats = None``).
OPENAI_AUDIO_FORMATS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "wav", "webm")
OPENAI_VOICES = frozenset(
    {
        "alloy",
        "ash",
        "ballad",
        "coral",
        "echo",
        "fable",
        "nova",
        "onyx",
        "sage",
        "shimmer",
        "verse",
        "marin",
        "cedar",
    }
)
# The Content-Type OpenAI answers each speech ``response_format`` with.
SPEECH_FORMATS = {
    "mp3": "audio/mpeg",
    "opus": "audio/opus",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
MAX_AUDIO_BYTES = 25 * 1024 * 1024  # OpenAI's upload limit
MAX_SPEECH_INPUT = 4096  # characters
SPEECH_RATE = 15.0  # characters a second at speed 1: how long the fake's speech lasts
_LANGUAGES = {
    "en": "english",
    "de": "german",
    "fr": "french",
    "es": "spanish",
    "it": "italian",
    "nl": "dutch",
    "pt": "portuguese",
    "ru": "russian",
    "ja": "japanese",
    "zh": "chinese",
}


@dataclass(frozen=True)
class TranscriptionRequest:
    """One ``POST /audio/transcriptions`` that passed the checks: the upload's ``filename``,
    ``content_type`` (as its part declared it) and bytes, every other form field as sent
    (in order; ``timestamp_granularities[]`` may repeat), headers, ``time.monotonic()``."""

    path: str
    model: str
    filename: str
    content_type: str | None
    data: bytes
    fields: list[tuple[str, str]]
    headers: dict[str, str]
    received_at: float

    def field(self, name: str) -> str | None:
        """The last value of form field ``name``, None if it was not sent."""
        values = [value for key, value in self.fields if key == name]
        return values[-1] if values else None

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def sha256(self) -> str:
        return audio.digest(self.data)

    @property
    def language(self) -> str | None:
        return self.field("language")

    @property
    def prompt(self) -> str | None:
        return self.field("prompt")

    @property
    def response_format(self) -> str:
        return self.field("response_format") or "json"


@dataclass(frozen=True)
class SpeechRequest:
    """One ``POST /audio/speech`` that passed the checks: its JSON body, headers, time."""

    path: str
    body: JSON
    headers: dict[str, str]
    received_at: float

    @property
    def model(self) -> str:
        return str(self.body["model"])

    @property
    def input(self) -> str:
        return str(self.body["input"])

    @property
    def voice(self) -> str:
        return str(self.body["voice"])

    @property
    def response_format(self) -> str:
        return str(self.body.get("response_format") or "mp3")

    @property
    def speed(self) -> float:
        return float(self.body.get("speed") or 1.0)


AudioRequest = TranscriptionRequest | SpeechRequest


def speech_audio(text: str, response_format: str = "mp3", speed: float = 1.0) -> bytes:
    """The bytes ``FakeLLM`` answers ``/audio/speech`` with: ``len(text) / SPEECH_RATE /
    speed`` seconds (at least 0.2) of audio. ``opus``: a real OGG/Opus file of silence (see
    ``audio.ogg_opus``; its serial number comes from the text, so two texts differ); ``wav``
    and ``pcm``: a 24 kHz tone whose pitch comes from the text (pcm: the samples alone, 16-bit
    little-endian, as OpenAI sends them); ``mp3``: silent frames. ``aac`` and ``flac`` are
    only their format's header (an ADTS header; ``fLaC`` and a STREAMINFO block, no frames):
    enough for a check of the type, not audio a player decodes."""
    seconds = max(0.2, len(text) / SPEECH_RATE / speed)
    seed = int(audio.digest(text.encode())[:8], 16)
    if response_format == "opus":
        return audio.ogg_opus(seconds, serial=seed)
    if response_format in ("wav", "pcm"):
        made = audio.wav(seconds, rate=24_000, tone_hz=220 + seed % 440)
        if response_format == "wav":
            return made
        with wave.open(io.BytesIO(made)) as read:
            return bytes(read.readframes(read.getnframes()))
    if response_format == "mp3":
        return audio.mp3(seconds)
    if response_format == "aac":
        return b"\xff\xf1\x58\x40\x02\x1f\xfc" + bytes(9)  # ADTS: AAC LC, 24 kHz, mono, 16 bytes
    samples = round(seconds * 24_000)
    info = struct.pack(">HH", 4096, 4096) + bytes(6)  # block sizes; frame sizes unknown
    info += ((24_000 << 44) | (0 << 41) | (15 << 36) | samples).to_bytes(8, "big") + bytes(16)
    return b"fLaC" + b"\x80" + len(info).to_bytes(3, "big") + info


def _missing(*names: str) -> web.Response:
    """OpenAI's 400 for required multipart fields that were not sent (its pydantic message)."""
    count = f"{len(names)} validation error{'s' if len(names) > 1 else ''}"
    lines = "".join(f"\nbody -> {n}\n  field required (type=value_error.missing)" for n in names)
    return _error(400, f"{count} for Request{lines}", "invalid_request_error", None)


def _invalid(param: str, value: object, allowed: Sequence[str]) -> web.Response:
    listed = ", ".join(f"'{a}'" for a in allowed[:-1]) + f", and '{allowed[-1]}'"
    message = f"Invalid value: '{value}'. Supported values are: {listed}."
    return _error(400, message, "invalid_request_error", "invalid_value", param=param)


def _timestamp(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{hours:02}:{minutes:02}:{rest // 1000:02}{separator}{rest % 1000:03}"


def _transcription_body(
    text: str, seconds: float, asked: TranscriptionRequest
) -> tuple[bytes, str]:
    """The body and Content-Type of a transcription in the ``response_format`` asked for,
    with the usage OpenAI reports: seconds for whisper, tokens for the gpt-4o models."""
    usage: JSON = {"type": "duration", "seconds": math.ceil(seconds)}
    if asked.model.startswith("gpt-4o"):
        heard, written = math.ceil(seconds * 10), max(1, len(text) // 4)
        usage = {"type": "tokens", "input_tokens": heard, "output_tokens": written}
        usage |= {"input_token_details": {"audio_tokens": heard, "text_tokens": 0}}
        usage["total_tokens"] = heard + written
    match asked.response_format:
        case "text":
            return (text + "\n").encode(), "text/plain; charset=utf-8"
        case "srt":
            cue = f"1\n{_timestamp(0, ',')} --> {_timestamp(seconds, ',')}\n{text}\n\n"
            return cue.encode(), "text/plain; charset=utf-8"
        case "vtt":
            cue = f"WEBVTT\n\n{_timestamp(0, '.')} --> {_timestamp(seconds, '.')}\n{text}\n\n"
            return cue.encode(), "text/plain; charset=utf-8"
        case "verbose_json":
            granularities = [v for k, v in asked.fields if k == "timestamp_granularities[]"]
            body: JSON = {
                "task": "transcribe",
                "language": _LANGUAGES.get(asked.language or "en", "english"),
                "duration": round(seconds, 2),
                "text": text,
            }
            if "word" in granularities:
                words = text.split() or [""]
                step = seconds / len(words)
                body["words"] = [
                    {"word": w, "start": round(i * step, 2), "end": round((i + 1) * step, 2)}
                    for i, w in enumerate(words)
                ]
            if "segment" in granularities or not granularities:
                body["segments"] = [
                    {
                        "id": 0,
                        "seek": 0,
                        "start": 0.0,
                        "end": round(seconds, 2),
                        "text": f" {text}",
                        "tokens": [50364 + i for i in range(len(text.split()))],
                        "temperature": 0.0,
                        "avg_logprob": -0.25,
                        "compression_ratio": 1.0,
                        "no_speech_prob": 0.01,
                    }
                ]
            return orjson.dumps(body | {"usage": usage}), "application/json"
    return orjson.dumps({"text": text, "usage": usage}), "application/json"


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
    """An OpenAI-compatible server on 127.0.0.1: ``/v1/chat/completions``, ``/v1/models``,
    ``/v1/audio/transcriptions`` and ``/v1/audio/speech`` (each also without ``/v1``).

    Each request consumes one reply: first from the queue for its ``model``
    (see ``script_for``), then from the shared queue (``script``), else
    ``default_reply`` (``Echo()``). ``delay`` is the global latency before the
    first byte (of audio answers too); ``chunk_delay`` the pause between streamed chunks. ``stop()``
    releases hanging and delayed requests (dropping their connections), so it
    returns promptly.

    Audio (see the module's docstring): ``transcripts`` maps an upload's sha256 to its
    text (``add_transcript``), ``default_transcript`` answers any other upload (None: a
    400); ``audio_formats`` are the file name extensions a transcription accepts and
    ``voices`` the speech voices (None: any, as a local server takes), ``max_audio_bytes``
    the largest upload. ``audio_requests`` keeps them all, apart from ``requests``.

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
        self.transcripts: dict[str, str] = {}
        self.default_transcript: str | None = None
        self.audio_formats: Sequence[str] | None = OPENAI_AUDIO_FORMATS
        self.voices: frozenset[str] | None = OPENAI_VOICES
        self.max_audio_bytes = MAX_AUDIO_BYTES
        self.audio_requests: list[AudioRequest] = []

    def script(self, *replies: Reply) -> None:
        """Append replies to the shared queue, consumed in order, one per request."""
        self._queue.extend(replies)

    def script_for(self, model: str, *replies: Reply) -> None:
        """Append replies for requests whose body ``model`` equals ``model`` (chat, and the
        only queue audio requests take from).

        A leading ``openai/`` is stripped, since litellm sends ``foo`` for ``openai/foo``.
        """
        self._by_model.setdefault(model.removeprefix("openai/"), deque()).extend(replies)

    def load_script(self, data: Any) -> None:
        """Load a JSON script: a list of replies or ``{"replies", "models", "default",
        "transcripts", "default_transcript"}``."""
        if isinstance(data, list):
            data = {"replies": data}
        self.script(*(reply_from_json(r) for r in data.get("replies", [])))
        for model, replies in data.get("models", {}).items():
            self.script_for(model, *(reply_from_json(r) for r in replies))
        if "default" in data:
            self.default_reply = reply_from_json(data["default"])
        self.transcripts |= data.get("transcripts", {})
        if "default_transcript" in data:
            self.default_transcript = data["default_transcript"]

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
            app.router.add_post(f"{prefix}/audio/transcriptions", self._transcriptions)
            app.router.add_post(f"{prefix}/audio/speech", self._speech)
        app.router.add_post("/_fake/script", self._control_script)
        app.router.add_get("/_fake/requests", self._control_requests)
        app.router.add_post("/_fake/transcripts", self._control_transcripts)
        app.router.add_get("/_fake/audio_requests", self._control_audio_requests)
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
        if isinstance(reply, Text | ToolCalls) and reply.cost is not None:
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
                {**base, "object": "chat.completion", "choices": [choice], "usage": usage},
                headers=_cost_header(reply),
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
        response = await self._start(request, headers=_cost_header(reply))
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
        request: web.Request,
        stream: bool = True,
        length: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> web.StreamResponse:
        """Send the headers of an SSE stream (or of a JSON body of ``length`` bytes)."""
        kind = "text/event-stream; charset=utf-8" if stream else "application/json"
        sent = {"Content-Type": kind, "Cache-Control": "no-cache", **(headers or {})}
        response = web.StreamResponse(headers=sent)
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

    # ---- audio ---------------------------------------------------------------------------

    def add_transcript(self, data: bytes, text: str) -> str:
        """Answer ``text`` for an upload of exactly ``data``; returns its key in
        ``transcripts`` (``audio.digest(data)``)."""
        key = audio.digest(data)
        self.transcripts[key] = text
        return key

    @property
    def transcription_requests(self) -> list[TranscriptionRequest]:
        return [r for r in self.audio_requests if isinstance(r, TranscriptionRequest)]

    @property
    def speech_requests(self) -> list[SpeechRequest]:
        return [r for r in self.audio_requests if isinstance(r, SpeechRequest)]

    async def wait_for_audio_requests(self, count: int, seconds: float = 5.0) -> None:
        """Wait until ``audio_requests`` holds ``count``; ``TimeoutError`` after ``seconds``."""
        async with asyncio.timeout(seconds), self._arrived:
            await self._arrived.wait_for(lambda: len(self.audio_requests) >= count)

    async def _record_audio(self, recorded: AudioRequest) -> Reply | None:
        """Keep ``recorded`` and take the reply scripted for its model (None: none is)."""
        async with self._arrived:
            self.audio_requests.append(recorded)
            self._arrived.notify_all()
        queue = self._by_model.get(recorded.model)
        return queue.popleft() if queue else None

    async def _audio_reply(
        self, request: web.Request, reply: Reply | None
    ) -> web.StreamResponse | Reply | None:
        """Play the delay and any fault of ``reply``: a response to send as it is, else the
        reply (or None) for the caller to answer from."""
        delay = self.delay if reply is None or reply.delay is None else reply.delay
        if isinstance(reply, Hang) or not await self._sleep(delay):
            await self._stopping.wait()
            return self._abort(request)
        if reply is not None and (fault := _fault(reply, request)) is not None:
            return fault
        if isinstance(reply, StreamError):
            code = reply.error.get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            return web.json_response({"error": reply.error}, status=status)
        return reply

    async def _whole(
        self, request: web.Request, reply: Reply | None, body: bytes, content_type: str
    ) -> web.StreamResponse:
        """Send ``body``, or for ``Disconnect`` three quarters of it and drop the connection,
        for ``Cut`` half of it, ended cleanly."""
        if not isinstance(reply, Disconnect | Cut):
            return web.Response(body=body, headers={"Content-Type": content_type})
        response = web.StreamResponse(headers={"Content-Type": content_type})
        response.content_length = len(body) if isinstance(reply, Disconnect) else len(body) // 2
        await response.prepare(request)
        if isinstance(reply, Disconnect):
            await response.write(body[: len(body) * 3 // 4])
            return self._abort(request, response)
        await response.write(body[: len(body) // 2])
        await response.write_eof()
        return response

    async def _transcriptions(self, request: web.Request) -> web.StreamResponse:
        recorded = await self._upload(request)
        if isinstance(recorded, web.Response):
            return recorded
        reply = await self._audio_reply(request, await self._record_audio(recorded))
        if isinstance(reply, web.StreamResponse):
            return reply
        text = reply.content if isinstance(reply, Text) else None
        text = text if text is not None else self.transcripts.get(recorded.sha256)
        text = text if text is not None else self.default_transcript
        if text is None:
            message = "Audio file might be corrupted or unsupported"
            return _error(400, message, "invalid_request_error", "invalid_value", param="file")
        seconds = audio.duration(recorded.data)
        seconds = seconds if seconds is not None else 0.4 * max(1, len(text.split()))
        body, content_type = _transcription_body(text, seconds, recorded)
        return await self._whole(request, reply, body, content_type)

    async def _upload(self, request: web.Request) -> TranscriptionRequest | web.Response:
        """The transcription asked for, or OpenAI's error for a request it refuses."""
        if request.content_type != "multipart/form-data":
            message = (
                f"Invalid Content-Type header ({request.content_type}), expected "
                "multipart/form-data. (HINT: If you're using curl, you can pass -F "
                "'file=@<path>' to upload a file.)"
            )
            return _error(400, message, "invalid_request_error", None)
        try:  # aiohttp refuses a body over the app's client_max_size, 64 MiB
            form = await request.post()
        except ValueError:  # a broken multipart body
            return _error(400, "Could not parse multipart form", "invalid_request_error", None)
        upload = form.get("file")
        if missing := [name for name in ("file", "model") if name not in form]:
            return _missing(*missing)
        if not isinstance(upload, web.FileField):
            message = (
                "1 validation error for Request\nbody -> file\n  Expected UploadFile, "
                f"received: {type(upload)} (type=value_error)"
            )
            return _error(400, message, "invalid_request_error", None)
        data = upload.file.read()
        if len(data) > self.max_audio_bytes:
            return self._too_large(request.content_length or len(data))
        fields = [(k, v) for k, v in form.items() if k != "file" and isinstance(v, str)]
        recorded = TranscriptionRequest(
            request.path,
            str(form["model"]),
            upload.filename,
            upload.content_type,
            data,
            fields,
            dict(request.headers),
            time.monotonic(),
        )
        return self._check_transcription(recorded) or recorded

    def _check_transcription(self, asked: TranscriptionRequest) -> web.Response | None:
        """OpenAI's 400 for a request it would not transcribe, or None."""
        if asked.response_format not in TRANSCRIPTION_FORMATS:
            return _invalid("response_format", asked.response_format, TRANSCRIPTION_FORMATS)
        if asked.model.startswith("gpt-4o") and asked.response_format not in ("json", "text"):
            message = (
                f"response_format '{asked.response_format}' is not compatible with model "
                f"'{asked.model}'. Use 'json' or 'text' instead."
            )
            code = "unsupported_value"
            return _error(400, message, "invalid_request_error", code, param="response_format")
        suffix = asked.filename.rsplit(".", 1)[-1].lower() if "." in asked.filename else ""
        if self.audio_formats is not None and suffix not in self.audio_formats:
            listed = ", ".join(f"'{f}'" for f in self.audio_formats)
            message = f"Invalid file format. Supported formats: [{listed}]"
            return _error(400, message, "invalid_request_error", None)
        language = asked.language
        if language is not None and not re.fullmatch(r"[a-z]{2,3}", language):
            message = (
                f"Invalid language '{language}'. Language parameter must be specified in "
                "ISO-639-1 format."
            )
            return _error(400, message, "invalid_request_error", None, param="language")
        return None

    def _too_large(self, size: int) -> web.Response:
        message = (
            f"Maximum content size limit ({self.max_audio_bytes}) exceeded ({size} bytes read)"
        )
        return _error(413, message, "server_error", None)

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            msg = "We could not parse the JSON body of your request."
            return _error(400, msg, "invalid_request_error", None)
        for name in ("model", "input", "voice"):
            if name not in body:
                message = f"Missing required parameter: '{name}'."
                code = "missing_required_parameter"
                return _error(400, message, "invalid_request_error", code, param=name)
        if (refusal := self._check_speech(body)) is not None:
            return refusal
        recorded = SpeechRequest(request.path, body, dict(request.headers), time.monotonic())
        reply = await self._audio_reply(request, await self._record_audio(recorded))
        if isinstance(reply, web.StreamResponse):
            return reply
        made = speech_audio(recorded.input, recorded.response_format, recorded.speed)
        return await self._whole(request, reply, made, SPEECH_FORMATS[recorded.response_format])

    def _check_speech(self, body: JSON) -> web.Response | None:
        """OpenAI's 400 for a speech request it would refuse, or None."""
        text, voice = body["input"], body["voice"]
        if not isinstance(text, str) or len(text) > MAX_SPEECH_INPUT:
            length = len(text) if isinstance(text, str) else 0
            message = (
                f"string too long. Expected a string with maximum length {MAX_SPEECH_INPUT}, "
                f"but got a string with length {length} instead."
            )
            code = "string_above_max_length"
            return _error(400, message, "invalid_request_error", code, param="input")
        if self.voices is not None and voice not in self.voices:
            return _invalid("voice", voice, sorted(self.voices))
        response_format = body.get("response_format") or "mp3"
        if response_format not in SPEECH_FORMATS:
            return _invalid("response_format", response_format, list(SPEECH_FORMATS))
        speed = body.get("speed", 1.0)
        if not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
            message = f"Invalid 'speed': {speed}. Expected a number from 0.25 to 4.0."
            return _error(400, message, "invalid_request_error", "invalid_value", param="speed")
        return None

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

    async def _control_transcripts(self, request: web.Request) -> web.Response:
        data = await request.json()
        if "content_base64" in data:
            key = self.add_transcript(base64.b64decode(data["content_base64"]), data["text"])
        else:
            key = str(data["sha256"])
            self.transcripts[key] = data["text"]
        return web.json_response({"sha256": key})

    async def _control_audio_requests(self, request: web.Request) -> web.Response:
        listed: list[JSON] = []
        for r in self.audio_requests:
            common: JSON = {"path": r.path, "model": r.model, "headers": r.headers}
            common["received_at"] = r.received_at
            if isinstance(r, SpeechRequest):
                listed.append({"kind": "speech", "body": r.body, **common})
            else:
                upload: JSON = {"filename": r.filename, "content_type": r.content_type}
                upload |= {"size": r.size, "sha256": r.sha256, "fields": r.fields}
                listed.append({"kind": "transcription", **upload, **common})
        return web.json_response(listed)


async def _serve(fake: FakeLLM) -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    async with fake:
        print(fake.base_url, flush=True)
        await stopped.wait()


def _cost_header(reply: Reply) -> dict[str, str]:
    """The header a LiteLLM proxy says an answer's cost in, where `reply` has one."""
    if isinstance(reply, Text) and reply.cost_header is not None:
        return {"x-litellm-response-cost": reply.cost_header}
    return {}


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
