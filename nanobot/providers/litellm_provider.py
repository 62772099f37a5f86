"""LLMProvider over litellm: any model litellm knows, or any OpenAI-compatible endpoint.

The only module that imports litellm, and only when the first call is made: importing it
takes seconds and the CLI's quick commands must not pay for it.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from loguru import logger

from nanobot.errors import ProviderError, ProviderErrorKind
from nanobot.providers._stream import Assembler, looks_like_overflow, retry_after
from nanobot.providers.base import (
    Completion,
    DeltaHandler,
    Message,
    ToolSchema,
    Usage,
)

DEFAULT_CONTEXT_WINDOW = 32_000
_RETRYABLE: frozenset[ProviderErrorKind] = frozenset({"rate_limited", "unavailable", "timeout"})
# A fallback model may be another vendor with other credentials, so auth failures move on too.
_FALLBACK_ON: frozenset[ProviderErrorKind] = _RETRYABLE | {"auth"}


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
    # For Llama, Cohere and Claude models litellm would fetch a tokenizer from Hugging Face on
    # the first count (and again after every failure, offline). The daemon reaches only what
    # its config names: those models are counted with tiktoken, an estimate within the
    # history window's margin.
    litellm.disable_hf_tokenizer_download = True
    return litellm


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries per model: `attempts` extra tries, waits doubling from `base_delay`, capped."""

    attempts: int = 3
    base_delay: float = 0.5
    max_delay: float = 20.0
    max_total: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after
        backoff = min(self.max_delay, self.base_delay * 2**attempt)
        return float(backoff * random.uniform(0.5, 1.0))  # jitter, not cryptography


class LiteLLMProvider:
    """An `LLMProvider` that streams every call through `litellm.acompletion`."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        api_base: str | None = None,
        fallbacks: Sequence[str] = (),
        max_tokens: int = 4096,
        temperature: float = 0.3,
        request_timeout: float = 120.0,
        retry: RetryPolicy | None = None,
        context_window: int | None = None,
        vision: bool | None = None,
    ) -> None:
        self._model = model
        self._api_key = api_key
        self._api_base = api_base
        self._fallbacks = tuple(fallbacks)
        self._max_tokens = max_tokens
        self._temperature = temperature
        self._timeout = request_timeout
        self._retry = retry or RetryPolicy()
        self._context_window = context_window
        self._vision = vision
        self._unpriced: set[str] = set()
        self._tokenizer: dict[str, Any] | None = None

    @property
    def model(self) -> str:
        return self._model

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema] = (),
        *,
        on_delta: DeltaHandler | None = None,
        max_tokens: int | None = None,
    ) -> Completion:
        """See `LLMProvider.complete`."""
        deadline = time.monotonic() + self._retry.max_total
        last: ProviderError | None = None
        for model in (self._model, *self._fallbacks):
            if last is not None:
                logger.warning(
                    "model {} failed ({}); trying fallback {}", last.model, last.kind, model
                )
            try:
                return await self._with_retries(
                    model,
                    messages,
                    tools,
                    on_delta=on_delta,
                    max_tokens=max_tokens or self._max_tokens,
                    deadline=deadline,
                )
            except ProviderError as exc:
                if exc.kind not in _FALLBACK_ON:
                    raise
                last = exc
        assert last is not None
        raise last

    async def _with_retries(
        self,
        model: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        *,
        on_delta: DeltaHandler | None,
        max_tokens: int,
        deadline: float,
    ) -> Completion:
        attempt = 0
        while True:
            try:
                return await self._stream_once(model, messages, tools, on_delta, max_tokens)
            except ProviderError as exc:  # a transport that classifies its own failures
                error = exc
            except Exception as exc:  # noqa: BLE001 - every litellm failure is classified here
                error = _classify(exc, model)
            if error.kind not in _RETRYABLE or attempt >= self._retry.attempts:
                raise error
            wait = self._retry.delay(attempt, error.retry_after)
            if time.monotonic() + wait > deadline:
                raise error
            logger.info(
                "model {} {}; retry {}/{} in {:.1f}s",
                model,
                error.kind,
                attempt + 1,
                self._retry.attempts,
                wait,
            )
            await asyncio.sleep(wait)
            attempt += 1

    async def aclose(self) -> None:
        """Release the transport's connections. Nothing to release here: litellm owns its
        HTTP clients. Subclasses with their own connections close them here."""

    async def _stream_once(
        self,
        model: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        on_delta: DeltaHandler | None,
        max_tokens: int,
    ) -> Completion:
        """One streamed call to `model`, no retries.

        Raises:
            ProviderError: a failure the transport classified itself (used as is), or
            Exception: anything else, classified by `_classify`.
        """
        litellm = _litellm()
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens,
            "temperature": self._temperature,
            "timeout": self._timeout,
            "max_retries": 0,  # retries are ours: litellm's would hide Retry-After and fallbacks
        }
        if tools:
            kwargs["tools"] = list(tools)
        if self._own_endpoint(model):
            if self._api_key:
                kwargs["api_key"] = self._api_key
            if self._api_base:
                kwargs["api_base"] = self._api_base
        stream = await litellm.acompletion(**kwargs)
        assembler = Assembler(on_delta)
        try:
            async for chunk in stream:
                assembler.add(chunk)
        finally:
            await _close(stream)
        return assembler.result(model, self._cost(model, assembler.usage))

    def _own_endpoint(self, model: str) -> bool:
        """Whether `model` is reached with the configured key and base: the primary model's
        provider's. A fallback of another provider uses that provider's own (its usual
        environment variables): never the primary's key, nor its server."""
        return model == self._model or _provider(model) == _provider(self._model)

    def _cost(self, model: str, usage: Usage) -> Usage:
        if model in self._unpriced:
            return usage
        try:
            prompt, completion = _litellm().cost_per_token(
                model=model,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
            )
        except Exception:  # noqa: BLE001 - unknown models have no price; that is not an error
            self._unpriced.add(model)  # asking again costs a raised exception every call
            return usage
        return Usage(usage.prompt_tokens, usage.completion_tokens, float(prompt + completion))

    def context_window(self) -> int:
        if self._context_window is None:
            self._context_window = _model_window(self._model)
        return self._context_window

    def supports_vision(self) -> bool:
        if self._vision is None:
            try:
                self._vision = bool(_litellm().supports_vision(model=self._model))
            except Exception:  # noqa: BLE001 - unknown models: assume no vision
                self._vision = False
        return self._vision

    def prepare(self) -> None:
        """Load now what the first turn would otherwise load: litellm (seconds to import),
        the model's tokenizer, context window and vision support.

        Blocking, so run it in a thread: done lazily, on the event loop in the middle of the
        first turn, it would stall every chat for as long. Idempotent.
        """
        self.count_tokens([])
        self.context_window()
        self.supports_vision()

    def count_tokens(self, messages: Sequence[Message]) -> int:
        litellm = _litellm()
        if self._tokenizer is None:
            # Chosen once: litellm looks the model's tokenizer up again on every count, which
            # for a known model costs several times the counting itself.
            self._tokenizer = dict(litellm.utils._select_tokenizer(self._model))
        return int(
            litellm.token_counter(
                model=self._model, messages=list(messages), custom_tokenizer=self._tokenizer
            )
        )


@cache
def _provider(model: str) -> str:
    """litellm's provider of `model` ("openai" for "gpt-4o" too); else its prefix."""
    try:
        return str(_litellm().get_llm_provider(model)[1])
    except Exception:  # noqa: BLE001 - litellm raises for ids it cannot place
        return model.split("/", 1)[0] if "/" in model else ""


def model_info(model: str) -> Mapping[str, Any] | None:
    """What litellm's model list says about `model`; None for a model it does not know."""
    try:
        return _litellm().get_model_info(model)  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - litellm raises a bare Exception for unknown models
        return None


def _model_window(model: str) -> int:
    info = model_info(model) or {}
    return int(info.get("max_input_tokens") or info.get("max_tokens") or DEFAULT_CONTEXT_WINDOW)


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


def _kind(exc: BaseException) -> ProviderErrorKind:
    litellm = _litellm()
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
    for types, kind in checks:
        if isinstance(exc, types):
            overflow = kind == "bad_request" and looks_like_overflow(str(exc))
            return "context_overflow" if overflow else kind
    if isinstance(exc, TimeoutError):
        return "timeout"
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and (status >= 500 or status == 408):
        return "unavailable"
    if isinstance(exc, (ConnectionError, OSError)):
        return "unavailable"
    return "bad_request"


def passes_through(model: str, params: Mapping[str, Any]) -> bool:
    """Whether litellm would send `params` to the OpenAI-compatible `model` unchanged.

    `model` is an `openai/…` id. False where litellm translates them (reasoning models get
    `max_completion_tokens` and lose `temperature`), and if the check itself fails.
    """
    litellm = _litellm()
    try:
        mapped = litellm.OpenAIConfig().map_openai_params(
            non_default_params=dict(params),
            optional_params={},
            model=model.removeprefix("openai/"),
            drop_params=True,
        )
    except Exception:  # noqa: BLE001 - when in doubt, litellm knows best
        return False
    return bool(mapped == dict(params))
