"""The litellm transport: calls to any model litellm knows, or any OpenAI-compatible endpoint.

The only module that imports litellm, and only when a call goes through it: importing it
takes seconds, and neither the CLI's quick commands, nor deciding routes, nor the direct
transport pay for it. The first call imports it in a thread if `prepare` did not, so that
the event loop goes on meanwhile. Public litellm APIs only.
"""

from __future__ import annotations

import asyncio
import os
from functools import cache
from types import ModuleType
from typing import Any

from loguru import logger

from nanobot.errors import ProviderError, ProviderErrorKind
from nanobot.providers._stream import Assembler, looks_like_overflow, retry_after
from nanobot.providers.base import Call, Completion, DeltaHandler


@cache
def _litellm() -> ModuleType:
    # Without this, importing litellm fetches a price list from the internet.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # The stderr handler litellm installs at import (removed below) prints only what is
    # critical meanwhile: its lines reach nanobot's sinks through the stdlib instead.
    os.environ["LITELLM_LOG"] = "CRITICAL"
    import litellm  # noqa: TID251 - this is the one place allowed to

    from nanobot import log

    # litellm prints some lines itself unless told not to (`set_verbose`, deprecated, stays
    # off), and its import put a stderr handler on its loggers and set httpx's level:
    # route them back through nanobot's sinks and redactor.
    litellm.suppress_debug_info = True
    log.route_libraries()
    litellm.telemetry = False
    litellm.drop_params = True  # a setting the model does not take is dropped, not an error
    # Where litellm counts tokens itself, it would fetch a tokenizer from Hugging Face for
    # Llama, Cohere and Claude models (and again after every failure, offline). The daemon
    # reaches only what its config names.
    litellm.disable_hf_tokenizer_download = True
    return litellm


class LiteLLMTransport:
    """A `Transport` that makes every call through `litellm.acompletion`: streamed when
    someone watches the answer being written (`on_delta`), else asked for whole, since
    litellm spends some 250 µs of CPU on each streamed chunk.

    `request_timeout` bounds the connection and, when streaming, each silence between
    chunks; an answer asked for whole arrives all at once, so its wait is bounded by
    `answer_timeout` instead (at least `request_timeout`).

    `api_key` and `api_base` go with the calls to models of `home_model`'s provider (as
    litellm places them): a fallback of another provider is reached with that provider's own
    settings (its usual environment variables), never with our key, nor to our server.
    litellm owns its HTTP clients; there is nothing to close.
    """

    def __init__(
        self,
        home_model: str,
        *,
        api_key: str | None = None,
        api_base: str | None = None,
        request_timeout: float = 120.0,
        answer_timeout: float = 600.0,
    ) -> None:
        self._home = home_model
        self._api_key = api_key
        self._api_base = api_base
        self._timeout = request_timeout
        self._answer_timeout = max(answer_timeout, request_timeout)
        self._missing: dict[str, str | None] = {}  # model → `missing_key`'s answer

    def prepare(self) -> None:
        """Import litellm (seconds)."""
        _litellm()

    async def aclose(self) -> None:
        """Nothing to release: litellm owns its HTTP clients."""

    def missing_key(self, model: str) -> str | None:
        """Why no call to `model` can be made for want of an API key, in one line ("no API
        key for openai: set agent.api_key or OPENAI_API_KEY"), or None. Imports litellm.

        Only providers whose credential is an API key variable are checked (not cloud
        logins such as AWS, Vertex or Azure's), by litellm's own list of what each needs.
        """
        if model in self._missing:
            return self._missing[model]
        own = self.own_endpoint(model)
        problem = None
        if not (own and self._api_key):
            try:
                missing = list(_litellm().validate_environment(model)["missing_keys"])
            except Exception:  # noqa: BLE001 - litellm cannot place it: the call will say why
                missing = []
            if missing and all(name.endswith("_API_KEY") for name in missing):
                names = " or ".join((["agent.api_key"] if own else []) + missing)
                problem = f"no API key for {_provider(model) or model}: set {names}"
                if own and self._api_base:
                    problem += " (any value, if the server at agent.api_base needs none)"
        self._missing[model] = problem
        return problem

    async def stream(self, call: Call, on_delta: DeltaHandler | None) -> Completion:
        """See `Transport.stream`; every failure litellm raises is classified here. A model
        without an API key fails at once (`auth`), without a request."""
        if not _litellm.cache_info().currsize:
            await asyncio.to_thread(_litellm)  # seconds of import, off the event loop
        if (problem := self.missing_key(call.model)) is not None:
            raise ProviderError("auth", f"{call.model}: {problem}", model=call.model)
        try:
            return await self._stream(call, on_delta)
        except ProviderError:
            raise  # ours, classified already
        except Exception as exc:  # every litellm failure is classified here, once
            raise _classify(exc, call.model) from exc

    async def _stream(self, call: Call, on_delta: DeltaHandler | None) -> Completion:
        litellm = _litellm()
        kwargs: dict[str, Any] = {
            "model": call.model,
            "messages": list(call.messages),
            "max_tokens": call.max_tokens,
            "temperature": call.temperature,
            "max_retries": 0,  # retries are ours: litellm's would hide Retry-After and fallbacks
        }
        if call.tools:
            kwargs["tools"] = list(call.tools)
        if self.own_endpoint(call.model):
            if self._api_key:
                kwargs["api_key"] = self._api_key
            if self._api_base:
                kwargs["api_base"] = self._api_base
        assembler = Assembler(on_delta)
        if on_delta is None:
            kwargs["timeout"] = _timeouts(self._timeout, read=self._answer_timeout)
            answer = await litellm.acompletion(**kwargs)
            _read_chunk(answer, assembler)
            assembler.header_cost(_header_cost(answer))
            return assembler.result(call.model, assembler.usage)
        kwargs.update(stream=True, stream_options={"include_usage": True}, timeout=self._timeout)
        stream = await litellm.acompletion(**kwargs)
        try:
            async for chunk in stream:
                _read_chunk(chunk, assembler)
        finally:
            await _close(stream)
        if not _answer_ended(stream, assembler):
            # As the direct transport says it: the retries and fallbacks take it from here.
            message = f"{call.model}: the stream ended before the answer did"
            raise ProviderError("unavailable", message, model=call.model)
        assembler.header_cost(_header_cost(stream))
        return assembler.result(call.model, assembler.usage)

    def own_endpoint(self, model: str) -> bool:
        """Whether `model` is reached with the configured key and base: `home_model`'s
        provider's."""
        return model == self._home or _provider(model) == _provider(self._home)


async def transcribe(
    model: str,
    audio: bytes,
    filename: str,
    *,
    api_key: str | None = None,
    api_base: str | None = None,
    language: str | None = None,
    seconds: float = 120.0,
) -> str:
    """The text spoken in `audio` (named `filename`: servers tell the format by its
    extension), by litellm's transcription API (OpenAI's `/audio/transcriptions`, Groq's,
    or any OpenAI-compatible server at `api_base`), each request within `seconds` (litellm's
    HTTP timeout). Imports litellm (in a thread) the first time. One attempt: the caller
    retries.

    Raises:
        ProviderError: the call failed; classified as a model call's failure is.
    """
    if not _litellm.cache_info().currsize:
        await asyncio.to_thread(_litellm)
    kwargs: dict[str, Any] = {
        "model": model,
        "file": (filename, audio),
        "max_retries": 0,
        "timeout": seconds,
    }
    optional = {"api_key": api_key, "api_base": api_base, "language": language}
    kwargs.update({k: v for k, v in optional.items() if v})
    try:
        response = await _litellm().atranscription(**kwargs)
    except Exception as exc:  # every litellm failure is classified here, once
        raise _classify(exc, model) from exc
    return str(_field(response, "text") or "").strip()


async def speak(
    model: str,
    text: str,
    *,
    voice: str,
    api_key: str | None = None,
    api_base: str | None = None,
    response_format: str = "opus",
    seconds: float = 120.0,
) -> bytes:
    """`text` read aloud in `voice`, as audio in `response_format` (`opus`: OGG/Opus, what a
    Telegram voice note is), by litellm's speech API (OpenAI's `/audio/speech`, or any
    OpenAI-compatible server at `api_base`), each request within `seconds`. Imports litellm
    (in a thread) the first time. One attempt: the caller retries.

    Raises:
        ProviderError: the call failed (classified as a model call's failure is), or it
            answered no audio (`unavailable`).
    """
    if not _litellm.cache_info().currsize:
        await asyncio.to_thread(_litellm)
    kwargs: dict[str, Any] = {
        "model": model,
        "input": text,
        "voice": voice,
        "response_format": response_format,
        "max_retries": 0,
        "timeout": seconds,
    }
    optional = {"api_key": api_key, "api_base": api_base}
    kwargs.update({k: v for k, v in optional.items() if v})
    try:
        response = await _litellm().aspeech(**kwargs)
        audio = response.content
    except Exception as exc:  # every litellm failure is classified here, once
        raise _classify(exc, model) from exc
    if not isinstance(audio, bytes) or not audio:
        raise ProviderError("unavailable", f"{model}: the speech answer held no audio", model=model)
    return audio


@cache
def _provider(model: str) -> str:
    """litellm's provider of `model` ("openai" for "gpt-4o" too); else its prefix."""
    try:
        return str(_litellm().get_llm_provider(model)[1])
    except Exception:  # noqa: BLE001 - litellm raises for ids it cannot place
        return model.split("/", 1)[0] if "/" in model else ""


def _timeouts(timeout: float, *, read: float) -> Any:
    """httpx's timeouts (litellm passes them on to its clients): `timeout` for connecting,
    sending and a pooled connection, `read` for the answer."""
    import httpx  # litellm's own HTTP client: imported with it

    return httpx.Timeout(timeout, read=read)


def _read_chunk(chunk: Any, assembler: Assembler) -> None:
    """One of litellm's streamed chunks (`ModelResponseStream`), or a whole answer
    (`ModelResponse`: a single "chunk" whose choices carry a `message`), into `assembler`."""
    usage = _field(chunk, "usage")
    if usage is not None and _field(usage, "prompt_tokens") is not None:
        assembler.set_usage(
            _field(usage, "prompt_tokens"),
            _field(usage, "completion_tokens"),
            _field(usage, "cost"),
            _field(_field(usage, "prompt_tokens_details"), "cached_tokens"),
        )
    for choice in _field(chunk, "choices") or ():
        reason = _field(choice, "finish_reason")
        if reason:
            assembler.finish(reason)
        delta = _field(choice, "delta")
        if delta is None and (delta := _field(choice, "message")) is None:
            continue
        content = _field(delta, "content")
        if content:
            assembler.text(content)
        for position, call in enumerate(_field(delta, "tool_calls") or ()):
            function = _field(call, "function")
            index = _field(call, "index")  # a whole answer's calls have none: their order
            assembler.tool_call(
                position if index is None else index,
                _field(call, "id"),
                None if function is None else _field(function, "name"),
                None if function is None else _field(function, "arguments"),
            )


def _header_cost(answer: Any) -> object:
    """The `x-litellm-response-cost` header of the server's answer (a LiteLLM proxy's),
    as litellm keeps the server's headers: in its hidden parameters, prefixed."""
    hidden = getattr(answer, "_hidden_params", None)
    headers = hidden.get("additional_headers") if isinstance(hidden, dict) else None
    return (
        headers.get("llm_provider-x-litellm-response-cost") if isinstance(headers, dict) else None
    )


def _answer_ended(stream: Any, assembler: Assembler) -> bool:
    """Whether the model said its streamed answer was whole (a finish reason).

    litellm's stream wrapper gives the last chunk a finish reason of "stop" when the server
    sent none (a stream cut short but closed cleanly), so the chunks cannot tell; the
    wrapper's `received_finish_reason` keeps what the server itself sent. A stream without
    that attribute (another litellm) is judged by its chunks.
    """
    received = getattr(stream, "received_finish_reason", _UNKNOWN)
    return assembler.finished if received is _UNKNOWN else bool(received)


_UNKNOWN = object()


def _field(part: Any, name: str) -> Any:
    """`part.name`, or None where `part` has no such attribute.

    litellm keeps most fields of a chunk's choices and deltas as pydantic *extra* fields
    (`model_extra`), which attribute access reaches only through pydantic's `__getattr__`,
    and a chunk's `usage`, absent from all but the last, is found missing only by pydantic
    raising and catching AttributeError: 2-3 µs a field, ~30 µs a chunk. Read the instance's
    fields and extras directly; anything else (a property, another type) the ordinary way.
    """
    fields = getattr(part, "__dict__", _NONE)
    if name in fields:
        return fields[name]
    extra = getattr(part, "model_extra", None)
    if extra is not None:
        if name in extra:
            return extra[name]
        if not _on_class(type(part), name):
            return None  # a pydantic model without it: nothing the ordinary way would find
    return getattr(part, name, None)


_NONE: dict[str, Any] = {}
_ON_CLASS: dict[tuple[type, str], bool] = {}


def _on_class(cls: type, name: str) -> bool:
    """Whether `name` is defined on `cls` or a base (a property, say), not per instance."""
    found = _ON_CLASS.get((cls, name))
    if found is None:
        found = _ON_CLASS[(cls, name)] = any(name in vars(klass) for klass in cls.__mro__)
    return found


async def _close(stream: Any) -> None:
    closer = getattr(stream, "aclose", None)
    if closer is not None:
        try:
            await closer()
        except Exception:  # noqa: BLE001 - closing a broken stream must not mask its error
            logger.debug("closing the model stream failed", exc_info=True)


def _classify(exc: BaseException, model: str) -> ProviderError:
    """Map a litellm/openai/httpx exception to a ProviderError, with the server's wait."""
    message = f"{model}: {type(exc).__name__}: {exc}"
    return ProviderError(_kind(exc), message, model=model, retry_after=retry_after(exc))


# What the OpenAI client says, however litellm wraps it, when it was given no key to send.
_NO_KEY = ("missing credentials", "api_key client option must be set")


def _kind(exc: BaseException) -> ProviderErrorKind:
    litellm = _litellm()
    if any(words in str(exc).lower() for words in _NO_KEY):
        return "auth"  # litellm raises it as a server error, which would be retried
    checks: tuple[
        tuple[type[BaseException] | tuple[type[BaseException], ...], ProviderErrorKind], ...
    ] = (
        (litellm.ContextWindowExceededError, "context_overflow"),
        (litellm.RateLimitError, "rate_limited"),
        ((litellm.AuthenticationError, litellm.PermissionDeniedError), "auth"),
        (litellm.Timeout, "timeout"),
        (
            (
                litellm.ServiceUnavailableError,
                litellm.InternalServerError,
                litellm.BadGatewayError,
                litellm.APIConnectionError,
            ),
            "unavailable",
        ),
        (
            (litellm.BadRequestError, litellm.NotFoundError, litellm.UnprocessableEntityError),
            "bad_request",
        ),
    )
    kind = next((kind for types, kind in checks if isinstance(exc, types)), None)
    if kind is None:
        kind = _kind_of_other(exc)
    # litellm knows OpenAI's wording of an overflow, but not every server's, nor one sent
    # as a 500 or in the stream (a proxy's, llama.cpp's): the words decide, as on the
    # direct transport.
    if kind in ("bad_request", "unavailable") and looks_like_overflow(str(exc)):
        return "context_overflow"
    return kind


def _kind_of_other(exc: BaseException) -> ProviderErrorKind:
    """The kind of an exception that is none of litellm's own."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and (status >= 500 or status == 408):
        return "unavailable"
    if isinstance(exc, (ConnectionError, OSError)):
        return "unavailable"
    return "bad_request"
