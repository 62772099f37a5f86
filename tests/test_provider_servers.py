"""What servers other than OpenAI send, read alike on both transports: their wordings of a
context overflow (at any status, and in a stream) and the cost they report in `usage`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from nanobot.errors import ProviderError
from nanobot.providers import DeltaHandler
from nanobot.providers.catalog import Catalog
from nanobot.providers.openai_direct import DirectTransport
from nanobot.providers.provider import Provider, RetryPolicy
from nanobot.providers.routes import Routes
from tests.fakes.llm import ErrorBody, FakeLLM, Reply, ServerError, StreamError, Text
from tests.test_provider import MESSAGES, on_litellm

TRANSPORTS = ("litellm", "direct")
NO_RETRY = RetryPolicy(attempts=0)
_PROXIED = (
    "litellm.ContextWindowExceededError: litellm.BadRequestError: AnthropicException - prompt "
    "is too long: 209303 tokens > 200000 maximum\nReceived Model Group=claude-sonnet\n"
    "Available Model Group Fallbacks=None"
)
# Each as the server sends it (bodies from their sources and from users' reports).
OVERFLOWS = [
    pytest.param(
        ErrorBody(
            400,
            {
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you "
                "requested 5000 tokens (4000 in the messages, 1000 in the completion). Please "
                "reduce the length of the messages or completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
        ),
        id="vllm",
    ),
    pytest.param(
        ErrorBody(
            400,
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 9000,
                    "n_ctx": 8192,
                }
            },
        ),
        id="llama.cpp",
    ),
    pytest.param(
        ErrorBody(
            400,
            {
                "error": {
                    "message": "prompt too long; exceeded max context length by 17 tokens",
                    "type": "api_error",
                    "param": None,
                    "code": None,
                }
            },
        ),
        id="ollama",
    ),
    pytest.param(
        ErrorBody(
            400, {"error": {"message": _PROXIED, "type": None, "param": None, "code": "400"}}
        ),
        id="litellm-proxy",
    ),
    pytest.param(
        ErrorBody(
            500, {"error": {"message": _PROXIED, "type": None, "param": None, "code": "500"}}
        ),
        id="litellm-proxy-500",
    ),
    pytest.param(
        StreamError(
            {"message": _PROXIED, "type": None, "param": None, "code": "400"}, content="Hi"
        ),
        id="in-the-stream",
    ),
]


def provider_on(
    transport: str, fake: FakeLLM, model: str = "openai/fake-model", **options: Any
) -> Provider:
    """A provider of `model` at `fake` whose calls go through `transport`, without retries
    unless `options` say otherwise; closed when `fake` stops."""
    options = {"retry": NO_RETRY, **options}
    if transport == "litellm":
        return fake.owns(on_litellm(model, api_key="sk-test", api_base=fake.base_url, **options))
    direct = Routes(DirectTransport(fake.base_url, api_key="sk-test"))
    return fake.owns(Provider(model, direct, **options))


Providers = Callable[..., Provider]


@pytest.fixture
async def providers(fake_llm: FakeLLM) -> AsyncIterator[Providers]:
    """`provider_on(transport, fake_llm, ...)`, each closed after the test."""
    built: list[Provider] = []

    def build(transport: str, **options: Any) -> Provider:
        built.append(provider_on(transport, fake_llm, **options))
        return built[-1]

    yield build
    for provider in built:
        await provider.aclose()


def listener(streamed: bool) -> DeltaHandler | None:
    """Someone watching the answer written (litellm then streams it), or nobody."""
    return (lambda _: None) if streamed else None


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("reply", OVERFLOWS)
async def test_every_servers_overflow_is_an_overflow_not_retried(
    fake_llm: FakeLLM, providers: Providers, reply: Reply, transport: str, streamed: bool
) -> None:
    fake_llm.script(reply, Text("not asked for"))
    provider = providers(transport, retry=RetryPolicy(attempts=2, base_delay=0.0))
    with pytest.raises(ProviderError) as info:
        await provider.complete(MESSAGES, on_delta=listener(streamed))
    assert info.value.kind == "context_overflow", str(info.value)
    assert fake_llm.request_count == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_other_failures_keep_their_kind(
    fake_llm: FakeLLM, providers: Providers, transport: str
) -> None:
    fake_llm.script(ServerError(500), ServerError(400, "Invalid value for 'temperature'"))
    provider = providers(transport)
    for kind in ("unavailable", "bad_request"):
        with pytest.raises(ProviderError) as info:
            await provider.complete(MESSAGES)
        assert info.value.kind == kind


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_cost_a_server_reports_is_kept_for_a_model_without_a_price(
    fake_llm: FakeLLM, providers: Providers, transport: str, streamed: bool
) -> None:
    fake_llm.script(Text("hi", cost=0.0042), Text("hi"))
    provider = providers(transport)
    costs = [
        (await provider.complete(MESSAGES, on_delta=listener(streamed))).usage.cost
        for _ in range(2)
    ]
    assert costs == [pytest.approx(0.0042), 0.0]


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_cost_a_litellm_proxy_sends_in_its_header_is_kept_too(
    fake_llm: FakeLLM, providers: Providers, transport: str, streamed: bool
) -> None:
    fake_llm.script(
        Text("hi", cost_header="0.00125"),
        Text("hi", cost=0.002, cost_header="0.00125"),  # usage.cost, where it is given
        Text("hi", cost_header="not a number"),
        Text("hi", cost_header="-1"),
    )
    provider = providers(transport)
    costs = [
        (await provider.complete(MESSAGES, on_delta=listener(streamed))).usage.cost
        for _ in range(4)
    ]
    assert costs == [pytest.approx(0.00125), pytest.approx(0.002), 0.0, 0.0]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_reported_cost_is_used_over_a_known_price(
    fake_llm: FakeLLM, providers: Providers, transport: str
) -> None:
    # The provider knows discounts, cache hits and routing that no price list does (issue 31).
    model = "openai/gpt-4o-mini"
    fake_llm.script(Text("hi", cost=1.0), Text("hi"))
    provider = providers(transport, model=model)
    completion = await provider.complete(MESSAGES)
    assert (completion.usage.cost, completion.usage.reported) == (1.0, True)
    usage = (await provider.complete(MESSAGES)).usage  # none reported: the list's price
    prices = Catalog.shipped().info(model).prices
    assert prices is not None
    assert usage.cost == pytest.approx(prices.cost(usage.prompt_tokens, usage.completion_tokens))
    assert usage.priced and not usage.reported
