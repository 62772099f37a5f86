"""The model provider from the config: its transports (direct, litellm, or auto choosing per
model) and its retry and fallback policy. Part of the composition root (`nanobot.app`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanobot.app._budget import config_prices
from nanobot.config import Config
from nanobot.providers.catalog import Catalog
from nanobot.providers.provider import Provider, RetryPolicy
from nanobot.providers.routes import Routes

if TYPE_CHECKING:
    from nanobot.providers.base import Transport
    from nanobot.providers.litellm_provider import LiteLLMTransport


def build_provider(config: Config) -> Provider:
    """The model provider, its calls made by the transports `agent.transport` names; the
    caller closes it (`aclose`). Imports no litellm: a call or `prepare` does, for a model
    whose calls go through it."""
    agent = config.agent
    api_key = agent.api_key.get_secret_value() if agent.api_key else None
    routes: Routes
    if agent.transport == "litellm":
        routes = Routes(_litellm_transport(config, api_key))
    elif agent.transport == "direct":
        routes = Routes(_direct_transport(config, api_key, auto=False))
    else:
        routes = Routes.auto(
            _litellm_transport(config, api_key),
            _direct_transport(config, api_key, auto=True),
            Catalog.shipped(),
        )
    return Provider(
        agent.model,
        routes,
        fallbacks=agent.fallbacks,
        max_tokens=agent.max_tokens,
        temperature=agent.temperature,
        retry=RetryPolicy(attempts=agent.max_retries, max_total=agent.retry_max_seconds),
        context_window=agent.context_window,
        prices=config_prices(config),
    )


def _direct_transport(config: Config, api_key: str | None, *, auto: bool) -> Transport:
    """The direct transport of the `openai/` models: to `agent.api_base` when the model is
    OpenAI-compatible and one is set; else (`auto`) to OpenAI's API where litellm would send
    them, with our key only if the model is OpenAI's (as litellm places keys)."""
    from nanobot.providers.openai_direct import DirectTransport, openai_api_base  # aiohttp

    agent = config.agent
    timeout = agent.request_timeout
    ours = agent.model.startswith("openai/")
    if agent.api_base and (ours or not auto):
        return DirectTransport(
            agent.api_base, api_key=api_key, key_from_env=auto, request_timeout=timeout
        )
    return DirectTransport(
        openai_api_base(),
        api_key=api_key if ours else None,
        key_from_env=True,
        needs_key="agent.api_key or OPENAI_API_KEY" if ours else "OPENAI_API_KEY",
        request_timeout=timeout,
    )


def _litellm_transport(config: Config, api_key: str | None) -> LiteLLMTransport:
    from nanobot.providers.litellm_provider import LiteLLMTransport

    agent = config.agent
    return LiteLLMTransport(
        agent.model,
        api_key=api_key,
        api_base=agent.api_base,
        request_timeout=agent.request_timeout,
        # An answer asked for whole (nobody watches it written) may take as long as a turn.
        answer_timeout=agent.max_turn_seconds,
    )
