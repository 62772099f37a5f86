"""The litellm transport: calls to any model litellm knows, or any OpenAI-compatible endpoint.

The only module that imports litellm, and only when it is first needed (a call, or deciding
whether litellm would change a request): importing it takes seconds, and neither the CLI's
quick commands nor the direct transport pay for it. Public litellm APIs only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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
    """A `Transport` that streams every call through `litellm.acompletion`.

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
    ) -> None:
        self._home = home_model
        self._api_key = api_key
        self._api_base = api_base
        self._timeout = request_timeout

    def prepare(self) -> None:
        """Import litellm (seconds)."""
        _litellm()

    async def aclose(self) -> None:
        """Nothing to release: litellm owns its HTTP clients."""

    async def stream(self, call: Call, on_delta: DeltaHandler | None) -> Completion:
        """See `Transport.stream`; every failure litellm raises is classified here."""
        try:
            return await self._stream(call, on_delta)
        except Exception as exc:  # every litellm failure is classified here, once
            raise _classify(exc, call.model) from exc

    async def _stream(self, call: Call, on_delta: DeltaHandler | None) -> Completion:
        litellm = _litellm()
        kwargs: dict[str, Any] = {
            "model": call.model,
            "messages": list(call.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": call.max_tokens,
            "temperature": call.temperature,
            "timeout": self._timeout,
            "max_retries": 0,  # retries are ours: litellm's would hide Retry-After and fallbacks
        }
        if call.tools:
            kwargs["tools"] = list(call.tools)
        if self.own_endpoint(call.model):
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
        return assembler.result(call.model, assembler.usage)

    def own_endpoint(self, model: str) -> bool:
        """Whether `model` is reached with the configured key and base: `home_model`'s
        provider's."""
        return model == self._home or _provider(model) == _provider(self._home)

    def sends_unchanged(self, model: str, params: Mapping[str, Any]) -> bool:
        """Whether litellm would send `params` to `model`, an OpenAI-compatible model of
        ours (`openai/…`), unchanged, to the configured base with the configured key: then a
        direct transport may make the call instead (`agent.transport: auto`)."""
        return (
            model.startswith("openai/")
            and self.own_endpoint(model)
            and passes_through(model, params)
        )


@cache
def _provider(model: str) -> str:
    """litellm's provider of `model` ("openai" for "gpt-4o" too); else its prefix."""
    try:
        return str(_litellm().get_llm_provider(model)[1])
    except Exception:  # noqa: BLE001 - litellm raises for ids it cannot place
        return model.split("/", 1)[0] if "/" in model else ""


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
