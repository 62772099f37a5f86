"""The provider: one `LLMProvider` for every transport.

It keeps in one place what does not depend on how a call is made: retries, fallbacks, token
counting (tiktoken), the context window, vision and prices (litellm's model list, read
without importing litellm). A *transport* per model makes each call (`routes.Routes`):
litellm, or the direct OpenAI-compatible one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

from loguru import logger

from nanobot.errors import ConfigError, ProviderError, ProviderErrorKind
from nanobot.providers.base import (
    Call,
    Completion,
    DeltaHandler,
    Message,
    ToolSchema,
    Transport,
    Usage,
)
from nanobot.providers.catalog import Catalog, Prices
from nanobot.providers.routes import Routes
from nanobot.providers.tokens import TokenCounter

T = TypeVar("T")
_RETRYABLE: frozenset[ProviderErrorKind] = frozenset({"rate_limited", "unavailable", "timeout"})
# A fallback model may be another vendor with other credentials, so auth failures move on too.
_FALLBACK_ON: frozenset[ProviderErrorKind] = _RETRYABLE | {"auth"}


@runtime_checkable
class _KeyChecked(Protocol):
    """A transport that can tell, before any call, that a model has no API key to send."""

    def missing_key(self, model: str) -> str | None: ...


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


async def retried(
    work: Callable[[], Awaitable[T]], policy: RetryPolicy, deadline: float, what: str
) -> T:
    """`work()`'s result, tried again after a transient `ProviderError` (rate limited,
    unavailable, timed out) as `policy` says while the retry would start before `deadline`
    (`time.monotonic()`); the last error otherwise. `what` names the call in the log."""
    attempt = 0
    while True:
        try:
            return await work()
        except ProviderError as error:
            if error.kind not in _RETRYABLE or attempt >= policy.attempts:
                raise
            wait = policy.delay(attempt, error.retry_after)
            if time.monotonic() + wait > deadline:
                raise
            logger.info(
                "{} {}; retry {}/{} in {:.1f}s",
                what,
                error.kind,
                attempt + 1,
                policy.attempts,
                wait,
            )
            await asyncio.sleep(wait)
            attempt += 1


class Provider:
    """An `LLMProvider`: calls `model`, then `fallbacks` in order, each through the transport
    `routes` names for it, retrying transient failures within one time budget per call.

    `context_window` and `vision` override what litellm's model list says about `model`.
    """

    def __init__(
        self,
        model: str,
        routes: Routes,
        *,
        fallbacks: Sequence[str] = (),
        max_tokens: int = 4096,
        temperature: float = 0.3,
        retry: RetryPolicy | None = None,
        context_window: int | None = None,
        vision: bool | None = None,
        catalog: Catalog | None = None,
        tokens: TokenCounter | None = None,
        prices: Mapping[str, Prices] | None = None,
    ) -> None:
        """`prices`: per model, what a call costs where litellm's list has no price for it
        (`agent.prices`)."""
        self._model = model
        self._routes = routes
        self._fallbacks = tuple(fallbacks)
        self._max_tokens = max_tokens
        self._temperature = temperature
        self._retry = retry or RetryPolicy()
        self._catalog = catalog or Catalog.shipped()
        self._tokens = tokens or TokenCounter(model)
        self._context_window = context_window
        self._vision = vision
        self._prices = dict(prices or {})

    @property
    def model(self) -> str:
        return self._model

    def transport(self, model: str) -> Transport:
        """The transport that makes the calls to `model`."""
        return self._routes.transport(model)

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema] = (),
        *,
        on_delta: DeltaHandler | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
    ) -> Completion:
        """See `LLMProvider.complete`."""
        deadline = time.monotonic() + self._retry.max_total
        last: ProviderError | None = None
        for each in (model or self._model, *self._fallbacks):
            if last is not None:
                logger.warning(
                    "model {} failed ({}); trying fallback {}", last.model, last.kind, each
                )
            call = Call(each, messages, tools, max_tokens or self._max_tokens, self._temperature)
            try:
                return await self._with_retries(call, on_delta, deadline)
            except ProviderError as exc:
                if exc.kind not in _FALLBACK_ON:
                    raise
                last = exc
        assert last is not None
        raise last

    async def _with_retries(
        self, call: Call, on_delta: DeltaHandler | None, deadline: float
    ) -> Completion:
        transport = self._routes.transport(call.model)
        completion = await retried(
            lambda: transport.stream(call, on_delta), self._retry, deadline, f"model {call.model}"
        )
        return dataclasses.replace(completion, usage=self._priced(call.model, completion))

    def _priced(self, model: str, completion: Completion) -> Usage:
        """The call's usage with its cost: the server's figure where it reported one (it
        knows discounts and routing no list does), else by `price`, else unknown."""
        usage = completion.usage
        if usage.reported:
            return usage
        prices = self.price(model)
        if prices is None:
            return dataclasses.replace(usage, cost=0.0, priced=False)
        cost = prices.cost(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        return dataclasses.replace(usage, cost=cost, priced=True)

    def price(self, model: str) -> Prices | None:
        """What `model` costs: litellm's list, else `agent.prices`; None: unknown."""
        listed = self._catalog.info(model).prices
        return listed if listed is not None else self._prices.get(model)

    def unpriced(self) -> list[str]:
        """The models (the primary and the fallbacks) with no known price."""
        return [m for m in (self._model, *self._fallbacks) if self.price(m) is None]

    def context_window(self) -> int:
        if self._context_window is None:
            self._context_window = self._catalog.info(self._model).context_window
        return self._context_window

    def supports_vision(self) -> bool:
        if self._vision is None:
            self._vision = self._catalog.info(self._model).vision
        return self._vision

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return self._tokens.count(messages)

    def load_tokenizer(self) -> bool:
        return self._tokens.load()

    def prepare(self, *, require_key: bool = True) -> None:
        """Load now what the first turn would otherwise load: the model's entry in litellm's
        list, its route and what its transport needs (litellm, where the model's calls go
        through it: seconds to import; nothing for the direct transport). Not the tokenizer:
        it is loaded where a count must be exact (`load_tokenizer`).

        Blocking, so run it in a thread: done lazily, on the event loop in the middle of the
        first turn, it would stall every chat for as long. Idempotent. Without an API key
        for the model, a warning when `require_key` is False (a gateway still starts, so
        that the owner can set it up; every call then fails at once as unauthorised).
        The fallbacks are `prepare_fallbacks`'s.

        Raises:
            ConfigError: the model's provider has no API key (every call would fail) and
                `require_key` is True.
        """
        self.context_window()
        self.supports_vision()
        problem = self._prepared(self._model)
        if problem is not None and require_key:
            raise ConfigError(problem)
        if problem is not None:
            logger.warning("{}: every reply fails until it is set", problem)

    def prepare_fallbacks(self) -> None:
        """`prepare` for the fallback models: their transports loaded (litellm imported if
        one goes through it), and each without an API key warned about. Blocking and
        idempotent; a gateway runs it in a thread once it takes messages, so that a
        fallback's litellm delays no direct reply (a fallback called before it is done
        loads what it needs off the event loop itself)."""
        for model in self._fallbacks:
            if (problem := self._prepared(model)) is not None:
                logger.warning("fallback {} will fail: {}", model, problem)

    def _prepared(self, model: str) -> str | None:
        """Prepare `model`'s transport; why it has no API key to send, if it has none."""
        transport = self._routes.transport(model)
        transport.prepare()
        return transport.missing_key(model) if isinstance(transport, _KeyChecked) else None

    async def aclose(self) -> None:
        """Release the transports' connections."""
        await self._routes.aclose()
