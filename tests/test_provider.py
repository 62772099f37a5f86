"""The provider on the litellm transport, through the real litellm, against the fake
OpenAI-compatible server."""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import pytest
from aiohttp import web

from nanobot.app import build_provider
from nanobot.config import AgentConfig, Config
from nanobot.errors import ConfigError, ProviderError
from nanobot.providers import Delta, TextDelta, ToolCallDelta
from nanobot.providers._stream import Assembler, retry_after
from nanobot.providers.base import Completion, ToolCall, Usage
from nanobot.providers.litellm_provider import LiteLLMTransport, _litellm, _read_chunk
from nanobot.providers.openai_direct import DirectTransport
from nanobot.providers.provider import Provider, RetryPolicy
from nanobot.providers.routes import Routes
from tests.fakes.llm import (
    AuthError,
    Call,
    ContextLengthError,
    Cut,
    Disconnect,
    FakeLLM,
    Hang,
    RateLimit,
    ServerError,
    Text,
    ToolCalls,
)
from tests.local_http import serving

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
}
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, max_total=30)


def on_litellm(
    model: str,
    *,
    api_key: str | None = None,
    api_base: str | None = None,
    request_timeout: float = 120.0,
    answer_timeout: float = 600.0,
    **options: Any,
) -> Provider:
    """A provider whose every call goes through litellm, as `agent.transport: litellm`,
    litellm imported (as a gateway does before it takes messages: a test's waits are not
    spent on the import)."""
    transport = LiteLLMTransport(
        model,
        api_key=api_key,
        api_base=api_base,
        request_timeout=request_timeout,
        answer_timeout=answer_timeout,
    )
    transport.prepare()
    return Provider(model, Routes(transport), **options)


def provider(fake: FakeLLM, **kwargs: Any) -> Provider:
    options: dict[str, Any] = {"api_key": "sk-test", "api_base": fake.base_url, "retry": FAST}
    options.update(kwargs)
    return on_litellm("openai/fake-model", **options)


async def test_streams_text_with_usage(fake_llm: FakeLLM) -> None:
    fake_llm.script(Text("Hello there, friend."))
    deltas: list[Delta] = []
    completion = await provider(fake_llm).complete(MESSAGES, on_delta=deltas.append)
    assert completion.content == "Hello there, friend."
    assert completion.tool_calls == ()
    assert completion.finish_reason == "stop"
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.completion_tokens > 0
    texts = [d for d in deltas if isinstance(d, TextDelta)]
    assert len(texts) > 1
    assert "".join(d.text for d in texts) == "Hello there, friend."
    assert [d.seq for d in deltas] == sorted({d.seq for d in deltas})
    request = fake_llm.requests[0]
    assert request.model == "fake-model"
    assert request.body["stream"] is True
    assert request.messages == MESSAGES


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
async def test_tool_calls_round_trip(fake_llm: FakeLLM, streamed: bool) -> None:
    arguments = {"path": "notes/today.md", "note": 'quotes " and unicode é'}
    fake_llm.script(
        ToolCalls(
            [Call("read_file", arguments, id="call_1"), Call("read_file", {"path": "b"})],
            content="Let me look.",
        )
    )
    deltas: list[Delta] = []
    completion = await provider(fake_llm).complete(
        MESSAGES, [READ_FILE], on_delta=deltas.append if streamed else None
    )
    assert bool(fake_llm.requests[0].body.get("stream")) is streamed
    assert completion.finish_reason == "tool_calls"
    assert completion.content == "Let me look."
    first, second = completion.tool_calls
    assert first.id == "call_1"
    assert first.name == "read_file"
    assert first.parsed_arguments() == arguments
    assert second.parsed_arguments() == {"path": "b"}
    assert sum(isinstance(d, ToolCallDelta) for d in deltas) > (2 if streamed else -1)
    assert fake_llm.requests[0].tools == [READ_FILE]
    # The assistant message goes back to the model in the format it expects.
    message = completion.to_message()
    assert message["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": json.dumps(arguments),
    }


async def test_rate_limit_then_success_honours_retry_after(fake_llm: FakeLLM) -> None:
    fake_llm.script(RateLimit(retry_after_seconds=1), Text("after the wait"))
    completion = await provider(fake_llm).complete(MESSAGES)
    assert completion.content == "after the wait"
    first, second = fake_llm.requests
    # Not a speed assertion: the retry must not come before the server said it may.
    assert second.received_at - first.received_at >= 0.9


async def test_server_errors_are_retried(fake_llm: FakeLLM) -> None:
    fake_llm.script(ServerError(500), ServerError(503), Text("recovered"))
    completion = await provider(fake_llm).complete(MESSAGES)
    assert completion.content == "recovered"
    assert fake_llm.request_count == 3


async def test_dropped_connection_is_retried(fake_llm: FakeLLM) -> None:
    fake_llm.script(Disconnect(), Text("whole answer"))
    completion = await provider(fake_llm).complete(MESSAGES)
    assert completion.content == "whole answer"


@pytest.fixture(params=["litellm", "direct"])
async def either(request: pytest.FixtureRequest, fake_llm: FakeLLM) -> AsyncIterator[Make]:
    """Builds providers of the fake server's model on each transport in turn (closed after
    the test)."""
    built: list[Provider] = []

    def build(**options: Any) -> Provider:
        options = {"retry": FAST, **options}
        if request.param == "litellm":
            built.append(provider(fake_llm, **options))
        else:
            direct = DirectTransport(fake_llm.base_url, api_key="sk-test")
            built.append(Provider("openai/fake-model", Routes(direct), **options))
        return built[-1]

    yield build
    for made in built:
        await made.aclose()


class Make(Protocol):
    def __call__(self, **options: Any) -> Provider: ...


async def test_a_stream_cut_short_is_no_answer_on_either_transport(
    fake_llm: FakeLLM, either: Make
) -> None:
    # Two chunks, then the end: no finish_reason, no [DONE]. litellm's wrapper adds a
    # finish reason of its own there; what was written so far is not the answer.
    fake_llm.script(Cut("The whole answer would have been longer.", chunks=2))
    deltas: list[Delta] = []
    with pytest.raises(ProviderError) as info:
        await either(retry=RetryPolicy(attempts=0)).complete(MESSAGES, on_delta=deltas.append)
    assert info.value.kind == "unavailable"
    assert "the stream ended before the answer did" in str(info.value)
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == "The "


async def test_a_stream_cut_short_is_retried_on_either_transport(
    fake_llm: FakeLLM, either: Make
) -> None:
    fake_llm.script(Cut(chunks=1), Cut(chunks=3), Text("The whole answer."))
    deltas: list[Delta] = []
    completion = await either().complete(MESSAGES, on_delta=deltas.append)
    assert completion.content == "The whole answer."
    assert completion.finish_reason == "stop"
    assert fake_llm.request_count == 3


async def test_a_whole_answer_cut_short_is_retried_on_either_transport(
    fake_llm: FakeLLM, either: Make
) -> None:
    fake_llm.script(Cut(), Text("The whole answer."))
    completion = await either().complete(MESSAGES)
    assert completion.content == "The whole answer."
    assert fake_llm.request_count == 2


async def test_retries_are_bounded(fake_llm: FakeLLM) -> None:
    fake_llm.script(*[ServerError(500)] * 10)
    with pytest.raises(ProviderError) as info:
        await provider(fake_llm).complete(MESSAGES)
    assert info.value.kind == "unavailable"
    assert fake_llm.request_count == 1 + FAST.attempts


async def test_retry_after_beyond_the_time_budget_gives_up(fake_llm: FakeLLM) -> None:
    fake_llm.script(RateLimit(retry_after_seconds=60))
    budget = RetryPolicy(attempts=3, base_delay=0.01, max_total=2)
    with pytest.raises(ProviderError) as info:
        await provider(fake_llm, retry=budget).complete(MESSAGES)
    assert info.value.kind == "rate_limited"
    assert fake_llm.request_count == 1


async def test_fallback_model_after_primary_keeps_failing(fake_llm: FakeLLM) -> None:
    fake_llm.script_for("fake-model", *[ServerError(500)] * 4)
    fake_llm.script_for("backup-model", Text("from the backup"))
    llm = provider(fake_llm, fallbacks=["openai/backup-model"])
    completion = await llm.complete(MESSAGES)
    assert completion.content == "from the backup"
    assert completion.model == "openai/backup-model"
    assert [r.model for r in fake_llm.requests] == ["fake-model"] * 4 + ["backup-model"]


async def test_fallback_after_auth_failure(fake_llm: FakeLLM) -> None:
    fake_llm.script_for("fake-model", AuthError())
    fake_llm.script_for("backup-model", Text("ok"))
    completion = await provider(fake_llm, fallbacks=["openai/backup-model"]).complete(MESSAGES)
    assert completion.content == "ok"


async def test_a_fallback_of_another_provider_gets_neither_our_key_nor_our_server(
    fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, str | None]] = []

    async def anthropic(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("x-api-key")))
        return web.json_response({"type": "error", "error": {"message": "no"}}, status=401)

    app = web.Application()
    app.router.add_post("/v1/messages", anthropic)
    async with serving(app) as base:
        monkeypatch.setenv("ANTHROPIC_API_BASE", base)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-own")
        fake_llm.script_for("fake-model", AuthError())
        llm = provider(fake_llm, fallbacks=["anthropic/claude-3-5-haiku-20241022"])
        with pytest.raises(ProviderError) as info:
            await llm.complete(MESSAGES)
    assert info.value.model == "anthropic/claude-3-5-haiku-20241022"
    assert [r.model for r in fake_llm.requests] == ["fake-model"]  # not our server
    assert seen == [("/v1/messages", "sk-ant-own")]  # its own key, not "sk-test"


async def test_no_fallback_for_context_overflow(fake_llm: FakeLLM) -> None:
    fake_llm.script_for("fake-model", ContextLengthError())
    llm = provider(fake_llm, fallbacks=["openai/backup-model"])
    with pytest.raises(ProviderError) as info:
        await llm.complete(MESSAGES)
    assert info.value.kind == "context_overflow"
    assert fake_llm.request_count == 1


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (AuthError(), "auth"),
        (ContextLengthError(), "context_overflow"),
        (ServerError(400, message="Invalid value for 'temperature'."), "bad_request"),
        (ServerError(404, message="The model does not exist."), "bad_request"),
    ],
)
async def test_error_classes(fake_llm: FakeLLM, reply: RateLimit, kind: str) -> None:
    fake_llm.script(reply)
    with pytest.raises(ProviderError) as info:
        await provider(fake_llm).complete(MESSAGES)
    assert info.value.kind == kind
    assert fake_llm.request_count == 1  # not retried
    assert info.value.user_message()


async def test_rate_limited_after_retries(fake_llm: FakeLLM) -> None:
    fake_llm.script(*[RateLimit(retry_after_seconds=0)] * 5)
    with pytest.raises(ProviderError) as info:
        await provider(fake_llm).complete(MESSAGES)
    assert info.value.kind == "rate_limited"


async def test_hang_times_out(fake_llm: FakeLLM) -> None:
    """A streamed answer's silence is bounded by `request_timeout`."""
    fake_llm.script(Hang(), Hang())
    llm = provider(fake_llm, request_timeout=0.5, retry=RetryPolicy(attempts=1, base_delay=0.01))
    with pytest.raises(ProviderError) as info:
        await llm.complete(MESSAGES, on_delta=lambda _: None)
    assert info.value.kind == "timeout"
    assert fake_llm.request_count == 2


async def test_an_answer_asked_for_whole_may_take_longer_than_the_request_timeout(
    fake_llm: FakeLLM,
) -> None:
    """Unstreamed, the whole answer arrives at once: `answer_timeout` bounds the wait."""
    fake_llm.delay = 0.4
    fake_llm.script(Text("slow but whole"))
    llm = provider(fake_llm, request_timeout=0.1, answer_timeout=5)
    assert (await llm.complete(MESSAGES)).content == "slow but whole"
    assert not fake_llm.requests[-1].body.get("stream")
    fake_llm.delay = 0.0

    fake_llm.script(Hang(), Hang())
    llm = provider(
        fake_llm,
        request_timeout=0.2,
        answer_timeout=0.5,
        retry=RetryPolicy(attempts=1, base_delay=0.01),
    )
    with pytest.raises(ProviderError) as info:
        await llm.complete(MESSAGES)
    assert info.value.kind == "timeout"


async def test_unreachable_endpoint_is_unavailable() -> None:
    llm = on_litellm(
        "openai/fake-model",
        api_key="sk-test",
        api_base="http://127.0.0.1:9/v1",
        retry=RetryPolicy(attempts=1, base_delay=0.01),
    )
    with pytest.raises(ProviderError) as info:
        await llm.complete(MESSAGES)
    assert info.value.kind == "unavailable"


def test_retry_policy_backs_off_with_jitter() -> None:
    policy = RetryPolicy(base_delay=1, max_delay=5)
    for attempt, ceiling in [(0, 1), (1, 2), (2, 4), (3, 5), (8, 5)]:
        delay = policy.delay(attempt, None)
        assert ceiling / 2 <= delay <= ceiling
    assert policy.delay(0, retry_after=7.5) == 7.5


def test_retry_after_header_parsing() -> None:
    class Response:
        def __init__(self, headers: dict[str, str]) -> None:
            self.headers = headers

    class Failure(Exception):
        def __init__(self, headers: dict[str, str]) -> None:
            self.response = Response(headers)

    assert retry_after(Failure({"retry-after": "3"})) == 3.0
    assert retry_after(Failure({"retry-after-ms": "1500", "retry-after": "2"})) == 1.5
    assert retry_after(Failure({"retry-after": "soon"})) is None
    assert retry_after(Failure({})) is None
    assert retry_after(ValueError()) is None


def test_context_window_and_token_count() -> None:
    assert on_litellm("openai/unknown-model-x").context_window() == 32_000
    assert on_litellm("openai/x", context_window=1234).context_window() == 1234
    assert on_litellm("openai/gpt-4o-mini").context_window() > 100_000
    count = on_litellm("openai/gpt-4o-mini").count_tokens(MESSAGES)
    assert 3 < count < 50


def test_prepare_loads_what_the_first_turn_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    import tiktoken

    provider = on_litellm("openai/gpt-4o-mini", api_key="sk-test")
    provider.prepare()
    litellm = _litellm()  # imported by prepare, for the litellm transport

    def looked_up_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("prepare() should have looked this up")

    monkeypatch.setattr(tiktoken, "get_encoding", looked_up_again)
    monkeypatch.setattr(Path, "read_bytes", looked_up_again)  # litellm's model list
    for name in ("get_model_info", "supports_vision", "token_counter", "cost_per_token"):
        monkeypatch.setattr(litellm, name, looked_up_again)  # none of these is needed
    assert provider.context_window() > 100_000
    assert provider.supports_vision() is True
    assert 3 < provider.count_tokens(MESSAGES) < 50


@pytest.mark.parametrize(
    "model", ["ollama/llama3", "together_ai/meta-llama/Llama-2-7b-chat-hf", "cohere/command-r"]
)
def test_counting_tokens_never_downloads_a_tokenizer(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # litellm fetches these models' tokenizers from Hugging Face unless told not to; the
    # daemon reaches only what its config names.
    reached: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        reached.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    provider = on_litellm(model)
    first = provider.count_tokens(MESSAGES)
    assert 3 < first < 50
    assert provider.count_tokens(MESSAGES) == first
    assert reached == []


async def test_build_provider_follows_the_transport() -> None:
    base = "http://localhost:8000/v1"
    provider = build_provider(Config())  # auto without api_base: OpenAI's API, directly
    assert isinstance(provider.transport(provider.model), DirectTransport)
    assert isinstance(provider.transport("openai/o3-mini"), LiteLLMTransport)
    assert isinstance(provider.transport("anthropic/claude-sonnet-4-5"), LiteLLMTransport)
    litellm = AgentConfig(transport="litellm", api_base=base)
    provider = build_provider(Config(agent=litellm))
    assert isinstance(provider.transport("openai/gpt-4o-mini"), LiteLLMTransport)
    for transport, always in (("direct", True), ("auto", False)):
        agent = AgentConfig(model="openai/o3-mini", transport=transport, api_base=base)
        provider = build_provider(Config(agent=agent))
        assert provider.model == agent.model
        assert isinstance(provider.transport(agent.model), DirectTransport) is always
        assert isinstance(provider.transport("openai/gpt-4o-mini"), DirectTransport)
        await provider.aclose()


async def test_a_retried_stream_starts_its_deltas_again_at_seq_0(fake_llm: FakeLLM) -> None:
    # The runner shows each (call, seq) once (tests/test_runner.py); this is the half of that
    # promise the provider keeps: a retry after a broken stream counts from 0 again.
    fake_llm.script(Disconnect(content="Hello "), Text("Hello world, again."))
    deltas: list[Delta] = []
    completion = await provider(fake_llm).complete(MESSAGES, on_delta=deltas.append)
    assert completion.content == "Hello world, again."
    texts = [d for d in deltas if isinstance(d, TextDelta)]
    restart = next(i for i, d in enumerate(texts) if i and d.seq == 0)
    assert "".join(d.text for d in texts[:restart]) == "Hello "  # what the broken stream showed
    assert "".join(d.text for d in texts[restart:]) == "Hello world, again."
    assert [d.seq for d in texts[restart:]] == list(range(len(texts) - restart))


def test_a_chunk_is_read_alike_from_litellm_objects_and_plain_ones() -> None:
    # litellm keeps a chunk's choice and delta fields as pydantic extras, read directly;
    # any other shape (here plain objects, usage present) is read the ordinary way.
    litellm = _litellm()
    call = {"index": 0, "id": "c1", "function": {"name": "read_file", "arguments": "{}"}}
    typed = litellm.ModelResponseStream(
        choices=[
            litellm.types.utils.StreamingChoices(
                finish_reason="tool_calls", delta=litellm.types.utils.Delta(tool_calls=[call])
            )
        ]
    )
    function = SimpleNamespace(name="read_file", arguments="{}")
    delta = SimpleNamespace(
        content=None, tool_calls=[SimpleNamespace(index=0, id="c1", function=function)]
    )
    plain = SimpleNamespace(
        choices=[SimpleNamespace(finish_reason="tool_calls", delta=delta)],
        usage=SimpleNamespace(prompt_tokens=3, completion_tokens=2),
    )
    results = []
    for chunk in (typed, plain):
        assembler = Assembler(None)
        _read_chunk(chunk, assembler)
        results.append(assembler.result("m", assembler.usage))
    expected = Completion(None, (ToolCall("c1", "read_file", "{}"),), "tool_calls", Usage(), "m")
    assert results == [expected, dataclasses.replace(expected, usage=Usage(3, 2))]


# ---- no API key: said at once, never retried (issue 16 §2) ---------------------------------


def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every connection attempt from now on fails, and is recorded in the returned list."""
    reached: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        reached.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return reached


async def test_no_api_key_is_said_at_once_without_a_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    reached = no_network(monkeypatch)
    llm = on_litellm("openai/gpt-4o", retry=FAST)
    with pytest.raises(ConfigError) as refused:
        llm.prepare()
    assert str(refused.value) == "no API key for openai: set agent.api_key or OPENAI_API_KEY"
    with pytest.raises(ProviderError) as info:
        await llm.complete(MESSAGES)
    assert info.value.kind == "auth"  # neither retried nor "unavailable"
    assert str(info.value) == (
        "openai/gpt-4o: no API key for openai: set agent.api_key or OPENAI_API_KEY"
    )
    assert reached == []


def test_a_key_from_the_environment_or_the_config_will_do(
    fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    provider(fake_llm, api_key=None).prepare()
    monkeypatch.delenv("OPENAI_API_KEY")
    provider(fake_llm, api_key="sk-from-config").prepare()
    on_litellm("ollama/llama3").prepare()  # a provider that needs no key


async def test_a_server_of_ours_without_a_key_is_told_any_value_will_do(
    fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # litellm's OpenAI client sends nothing without a key, even to a local server.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ProviderError) as info:
        await provider(fake_llm, api_key=None).complete(MESSAGES)
    assert info.value.kind == "auth"
    assert "any value, if the server at agent.api_base needs none" in str(info.value)
    assert fake_llm.request_count == 0


async def test_a_fallback_without_its_key_is_warned_about_and_skipped_at_once(
    fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch, warnings: list[str]
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    fallback = "anthropic/claude-3-5-haiku-20241022"
    llm = provider(fake_llm, fallbacks=[fallback], retry=RetryPolicy(attempts=0))
    llm.prepare()  # the primary has its key: no error
    assert warnings == []
    llm.prepare_fallbacks()
    assert [w.strip() for w in warnings] == [
        f"fallback {fallback} will fail: no API key for anthropic: set ANTHROPIC_API_KEY"
    ]
    fake_llm.script(ServerError(500))
    with pytest.raises(ProviderError) as info:
        await llm.complete(MESSAGES)
    assert (info.value.kind, info.value.model) == ("auth", fallback)
    assert fake_llm.request_count == 1


async def test_litellm_missing_credentials_is_an_auth_error_not_retried(
    fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Should a model slip past the check, litellm raises the OpenAI client's "Missing
    # credentials" as an InternalServerError: it must not be retried as an outage.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(LiteLLMTransport, "missing_key", lambda self, model: None)
    litellm = _litellm()
    calls: list[str] = []
    original = litellm.acompletion

    async def counted(**kwargs: Any) -> Any:
        calls.append(kwargs["model"])
        return await original(**kwargs)

    monkeypatch.setattr(litellm, "acompletion", counted)
    with pytest.raises(ProviderError) as info:
        await provider(fake_llm, api_key=None).complete(MESSAGES)
    assert info.value.kind == "auth"
    assert "Missing credentials" in str(info.value)
    assert calls == ["openai/fake-model"]
    assert fake_llm.request_count == 0
