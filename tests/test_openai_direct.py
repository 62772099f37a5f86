"""The direct OpenAI transport against the fake server, and a raw one for broken streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import aiohttp
import pytest
from aiohttp import web

from nanobot.errors import ProviderError
from nanobot.providers import Delta, TextDelta, ToolCallDelta
from nanobot.providers.catalog import Catalog
from nanobot.providers.litellm_provider import LiteLLMTransport
from nanobot.providers.openai_direct import (
    DirectTransport,
    _error_status,
    _kind_for_status,
    _Lines,
)
from nanobot.providers.provider import Provider, RetryPolicy
from nanobot.providers.routes import Routes
from tests.fakes.llm import (
    AuthError,
    Call,
    ContextLengthError,
    Disconnect,
    FakeLLM,
    Hang,
    RateLimit,
    Reply,
    ServerError,
    Text,
    ToolCalls,
)
from tests.local_http import serving
from tests.test_provider import FAST, MESSAGES, READ_FILE

NO_RETRY = RetryPolicy(attempts=0)


MODEL = "openai/fake-model"


class Make(Protocol):
    def __call__(self, api_base: str, **options: Any) -> Provider: ...


def on_direct(
    api_base: str,
    *,
    api_key: str | None = None,
    request_timeout: float = 120.0,
    auto: bool = False,
    **options: Any,
) -> Provider:
    """A provider of `openai/fake-model` as `build_provider` makes it for
    `agent.transport: direct` (or `auto`)."""
    direct = DirectTransport(
        api_base, api_key=api_key, key_from_env=auto, request_timeout=request_timeout
    )
    routes = Routes(direct)
    if auto:
        litellm = LiteLLMTransport(
            MODEL, api_key=api_key, api_base=api_base, request_timeout=request_timeout
        )
        routes = Routes.auto(litellm, direct, Catalog.shipped())
    return Provider(MODEL, routes, **options)


def session_of(provider: Provider) -> aiohttp.ClientSession | None:
    transport = provider.transport(MODEL)
    assert isinstance(transport, DirectTransport)
    return transport._session


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    """Builds `openai/fake-model` providers (key "sk-test", fast retries unless `options`
    say otherwise) and closes them after the test."""
    built: list[Provider] = []

    def build(api_base: str, **options: Any) -> Provider:
        options = {"api_key": "sk-test", "retry": FAST, **options}
        built.append(on_direct(api_base, **options))
        return built[-1]

    yield build
    for provider in built:
        await provider.aclose()


@asynccontextmanager
async def raw_server(*writes: bytes) -> AsyncIterator[tuple[str, list[int]]]:
    """A server answering each POST with `writes` as an event stream, one write at a time.

    Yields the base URL and a list that gets one entry per request received.
    """
    received: list[int] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        received.append(1)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for data in writes:
            await response.write(data)
            await asyncio.sleep(0.005)  # separate reads on the client, most of the time
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    async with serving(app) as base:
        yield f"{base}/v1", received


def sse(*chunks: dict[str, Any]) -> list[bytes]:
    return [b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks]


def chunk(content: str | None = None, finish: str | None = None) -> dict[str, Any]:
    delta = {"content": content} if content is not None else {}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def test_streams_text_with_usage(fake_llm: FakeLLM, make: Make) -> None:
    fake_llm.script(Text("Hello there, friend."))
    deltas: list[Delta] = []
    completion = await make(fake_llm.base_url).complete(MESSAGES, on_delta=deltas.append)
    assert completion.content == "Hello there, friend."
    assert completion.tool_calls == ()
    assert completion.finish_reason == "stop"
    assert completion.model == "openai/fake-model"
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.completion_tokens > 0
    texts = [d for d in deltas if isinstance(d, TextDelta)]
    assert len(texts) > 1
    assert "".join(d.text for d in texts) == "Hello there, friend."
    assert [d.seq for d in deltas] == list(range(len(deltas)))
    request = fake_llm.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.body == {
        "model": "fake-model",
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 4096,
        "temperature": 0.3,
    }
    assert request.headers["Authorization"] == "Bearer sk-test"


async def test_streamed_tool_call_round_trips(fake_llm: FakeLLM, make: Make) -> None:
    arguments = {"path": "notes/today.md", "note": 'quotes " and unicode é'}
    fake_llm.script(
        ToolCalls(
            [Call("read_file", arguments, id="call_1"), Call("read_file", {"path": "b"})],
            content="Let me look.",
        )
    )
    deltas: list[Delta] = []
    llm = make(fake_llm.base_url)
    completion = await llm.complete(MESSAGES, [READ_FILE], on_delta=deltas.append, max_tokens=50)
    assert completion.finish_reason == "tool_calls"
    assert completion.content == "Let me look."
    first, second = completion.tool_calls
    assert (first.id, first.name) == ("call_1", "read_file")
    assert first.arguments == json.dumps(arguments)
    assert second.parsed_arguments() == {"path": "b"}
    assert sum(isinstance(d, ToolCallDelta) for d in deltas) > 2
    request = fake_llm.requests[0]
    assert request.tools == [READ_FILE]
    assert request.body["max_tokens"] == 50


async def test_images_are_sent_unchanged(fake_llm: FakeLLM, make: Make) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}]
    completion = await make(fake_llm.base_url).complete(messages)
    assert completion.content == "echo: what is it?"
    assert fake_llm.requests[0].messages == messages


async def test_no_key_no_authorization_header(fake_llm: FakeLLM, make: Make) -> None:
    await make(fake_llm.base_url, api_key=None).complete(MESSAGES)
    assert "Authorization" not in fake_llm.requests[0].headers


async def test_goes_through_the_environments_proxy(
    fake_llm: FakeLLM, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("http_proxy", "all_proxy", "no_proxy", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", fake_llm.base_url.removesuffix("/v1"))
    completion = await make("http://model.invalid/v1").complete(MESSAGES)
    assert completion.content == "echo: hi"
    assert fake_llm.requests[0].headers["Host"] == "model.invalid"


async def test_rate_limit_then_success_honours_retry_after(fake_llm: FakeLLM, make: Make) -> None:
    fake_llm.script(RateLimit(retry_after_seconds=1), Text("after the wait"))
    completion = await make(fake_llm.base_url).complete(MESSAGES)
    assert completion.content == "after the wait"
    first, second = fake_llm.requests
    assert second.received_at - first.received_at >= 0.9


async def test_rate_limit_carries_the_servers_wait(fake_llm: FakeLLM, make: Make) -> None:
    fake_llm.script(RateLimit(retry_after_seconds=2.5))
    with pytest.raises(ProviderError) as info:
        await make(fake_llm.base_url, retry=NO_RETRY).complete(MESSAGES)
    assert info.value.kind == "rate_limited"
    assert info.value.retry_after == 2.5  # retry-after-ms wins over the rounded Retry-After
    assert "429" in str(info.value)


async def test_server_errors_are_retried(fake_llm: FakeLLM, make: Make) -> None:
    fake_llm.script(ServerError(500), ServerError(503), Text("recovered"))
    completion = await make(fake_llm.base_url).complete(MESSAGES)
    assert completion.content == "recovered"
    assert fake_llm.request_count == 3


async def test_fallback_after_auth_failure(fake_llm: FakeLLM, make: Make) -> None:
    fake_llm.script_for("fake-model", AuthError())
    fake_llm.script_for("backup-model", Text("from the backup"))
    llm = make(fake_llm.base_url, fallbacks=["openai/backup-model"])
    completion = await llm.complete(MESSAGES)
    assert completion.content == "from the backup"
    assert completion.model == "openai/backup-model"
    assert [(r.path, r.model) for r in fake_llm.requests] == [
        ("/v1/chat/completions", "fake-model"),
        ("/v1/chat/completions", "backup-model"),
    ]


async def test_context_overflow_is_not_retried_nor_falls_back(
    fake_llm: FakeLLM, make: Make
) -> None:
    fake_llm.script_for("fake-model", ContextLengthError())
    llm = make(fake_llm.base_url, fallbacks=["openai/backup-model"])
    with pytest.raises(ProviderError) as info:
        await llm.complete(MESSAGES)
    assert info.value.kind == "context_overflow"
    assert fake_llm.request_count == 1


@pytest.mark.parametrize(
    ("reply", "status", "kind"),
    [
        (AuthError(), 401, "auth"),
        (ServerError(403, message="Forbidden."), 403, "auth"),
        (ServerError(400, message="Invalid value for 'temperature'."), 400, "bad_request"),
        (ServerError(404, message="The model does not exist."), 404, "bad_request"),
        (ServerError(422, message="Unprocessable."), 422, "bad_request"),
    ],
)
async def test_error_classes(
    fake_llm: FakeLLM, make: Make, reply: Reply, status: int, kind: str
) -> None:
    fake_llm.script(reply)
    with pytest.raises(ProviderError) as info:
        await make(fake_llm.base_url).complete(MESSAGES)
    assert info.value.kind == kind
    assert info.value.model == "openai/fake-model"
    assert fake_llm.request_count == 1  # not retried
    message = str(info.value)
    assert "openai/fake-model" in message
    assert f"HTTP {status}" in message


async def test_the_api_key_never_reaches_the_message(fake_llm: FakeLLM, make: Make) -> None:
    fake_llm.script(AuthError())  # OpenAI quotes the refused key back
    with pytest.raises(ProviderError) as info:
        await make(fake_llm.base_url, api_key="sk-very-secret-123").complete(MESSAGES)
    assert "Incorrect API key provided" in str(info.value)
    assert "sk-very-secret-123" not in str(info.value)


async def test_long_server_messages_are_cut(fake_llm: FakeLLM, make: Make) -> None:
    fake_llm.script(ServerError(400, message="x" * 5000))
    with pytest.raises(ProviderError) as info:
        await make(fake_llm.base_url).complete(MESSAGES)
    assert 500 <= len(str(info.value)) < 600


async def test_hang_times_out(fake_llm: FakeLLM, make: Make) -> None:
    fake_llm.script(Hang(), Hang())
    retry = RetryPolicy(attempts=1, base_delay=0.01)
    llm = make(fake_llm.base_url, request_timeout=0.3, retry=retry)
    with pytest.raises(ProviderError) as info:
        await llm.complete(MESSAGES)
    assert info.value.kind == "timeout"
    assert fake_llm.request_count == 2


async def test_a_stream_that_goes_silent_times_out(make: Make) -> None:
    async with FakeLLM(chunk_delay=1.0) as fake:
        fake.script(Text("one two three"))
        with pytest.raises(ProviderError) as info:
            await make(fake.base_url, request_timeout=0.3, retry=NO_RETRY).complete(MESSAGES)
    assert info.value.kind == "timeout"


async def test_a_slow_stream_is_not_cut_short(make: Make) -> None:
    async with FakeLLM(chunk_delay=0.1) as fake:
        fake.script(Text("one two three four five six"))
        llm = make(fake.base_url, request_timeout=0.3, retry=NO_RETRY)
        completion = await llm.complete(MESSAGES)  # ~0.7 s in all, never 0.3 s silent
    assert completion.content == "one two three four five six"


async def test_disconnect_mid_stream_is_unavailable(fake_llm: FakeLLM, make: Make) -> None:
    fake_llm.script(Disconnect())
    with pytest.raises(ProviderError) as info:
        await make(fake_llm.base_url, retry=NO_RETRY).complete(MESSAGES)
    assert info.value.kind == "unavailable"


async def test_dropped_connection_is_retried(fake_llm: FakeLLM, make: Make) -> None:
    fake_llm.script(Disconnect(), Text("whole answer"))
    deltas: list[Delta] = []
    completion = await make(fake_llm.base_url).complete(MESSAGES, on_delta=deltas.append)
    assert completion.content == "whole answer"
    assert [d.seq for d in deltas] == [0, 0, 1]  # the partial attempt's piece, then anew


async def test_unreachable_endpoint_is_unavailable(make: Make) -> None:
    with pytest.raises(ProviderError) as info:
        await make("http://127.0.0.1:9/v1", retry=NO_RETRY).complete(MESSAGES)
    assert info.value.kind == "unavailable"


async def test_sse_framing_is_tolerated(make: Make) -> None:
    writes = [
        b": keep-alive comment\r\n\r\n",
        b"event: message\r\n",
        *(w.replace(b"\n", b"\r\n") for w in sse(chunk("Hel"))),
        b'data: {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_re',  # split
        b'ason": "stop"}]}\n\n',
        b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": null}}\n\n',
        b"data: [DONE]\n\n",
    ]
    async with raw_server(*writes) as (url, _):
        completion = await make(url, retry=NO_RETRY).complete(MESSAGES)
    assert completion.content == "Hello"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (7, 0)


async def test_finish_without_done_is_complete(make: Make) -> None:
    async with raw_server(*sse(chunk("ok", finish="stop"))) as (url, _):
        completion = await make(url, retry=NO_RETRY).complete(MESSAGES)
    assert completion.content == "ok"


async def test_garbled_stream_is_unavailable_and_retried(make: Make) -> None:
    writes = [*sse(chunk("Hel")), b"data: {not json at all\n\n", b"data: [DONE]\n\n"]
    async with raw_server(*writes) as (url, received):
        with pytest.raises(ProviderError) as info:
            await make(url, retry=RetryPolicy(attempts=1, base_delay=0.01)).complete(MESSAGES)
    assert info.value.kind == "unavailable"
    assert "not a JSON chunk" in str(info.value)
    assert "{not json at all" in str(info.value)
    assert len(received) == 2


async def test_stream_ending_before_the_answer_is_unavailable(make: Make) -> None:
    async with raw_server(*sse(chunk("Hel"))) as (url, _):
        with pytest.raises(ProviderError) as info:
            await make(url, retry=NO_RETRY).complete(MESSAGES)
    assert info.value.kind == "unavailable"
    assert "ended before the answer" in str(info.value)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"message": "Rate limit reached", "type": "rate_limit_error"}, "rate_limited"),
        ({"message": "The server had an error", "type": "server_error"}, "unavailable"),
        ({"message": "maximum context length is 8192", "code": 400}, "context_overflow"),
        ({"message": "bad", "type": "BadRequestError", "code": 400}, "bad_request"),
        ("something broke", "unavailable"),
    ],
)
async def test_an_error_in_the_stream_is_classified(make: Make, error: object, kind: str) -> None:
    writes = [*sse(chunk("Hel")), *sse({"error": error})]
    async with raw_server(*writes) as (url, _):
        with pytest.raises(ProviderError) as info:
            await make(url, retry=NO_RETRY).complete(MESSAGES)
    assert info.value.kind == kind
    assert "error in the stream" in str(info.value)


async def test_aclose_closes_and_a_later_call_reopens(fake_llm: FakeLLM, make: Make) -> None:
    llm = make(fake_llm.base_url)
    await llm.aclose()  # before any call: nothing to close
    await llm.complete(MESSAGES)
    session = session_of(llm)
    assert session is not None
    await llm.aclose()
    assert session.closed
    assert (await llm.complete(MESSAGES)).content == "echo: hi"
    assert session_of(llm) is not None
    assert session_of(llm) is not session


async def test_auto_goes_direct_where_litellm_would_send_the_same(
    fake_llm: FakeLLM, make: Make
) -> None:
    llm = make(fake_llm.base_url, auto=True)
    assert (await llm.complete(MESSAGES)).content == "echo: hi"
    assert "aiohttp" in fake_llm.requests[0].headers["User-Agent"]
    assert fake_llm.requests[0].body["temperature"] == 0.3


async def test_auto_leaves_what_litellm_translates_to_litellm(
    fake_llm: FakeLLM, make: Make
) -> None:
    # A reasoning model takes max_completion_tokens and no temperature; the primary fails
    # for want of a key, so the fallback is called in the same complete().
    fake_llm.script_for("fake-model", AuthError())
    llm = make(fake_llm.base_url, auto=True, fallbacks=["openai/o3-mini"])
    assert (await llm.complete(MESSAGES)).content == "echo: hi"
    direct, translated = fake_llm.requests
    assert "aiohttp" in direct.headers["User-Agent"]
    assert translated.model == "o3-mini"
    assert "aiohttp" not in translated.headers["User-Agent"]
    assert translated.body["max_completion_tokens"] == 4096
    assert "temperature" not in translated.body
    assert translated.headers["Authorization"] == "Bearer sk-test"
    anthropic = llm.transport("anthropic/claude-sonnet-4-5")  # not OpenAI-compatible
    assert isinstance(anthropic, LiteLLMTransport)
    o3 = make(fake_llm.base_url).transport("openai/o3-mini")
    assert isinstance(o3, DirectTransport)  # direct: always


async def test_auto_takes_the_key_from_the_environment_as_litellm_would(
    fake_llm: FakeLLM, make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_ORGANIZATION", "org-ours")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-ours")
    await make(fake_llm.base_url, api_key=None, auto=True).complete(MESSAGES)
    await make(fake_llm.base_url, api_key=None).complete(MESSAGES)
    auto, direct = fake_llm.requests
    assert auto.headers["Authorization"] == "Bearer sk-from-env"
    # As litellm's OpenAI client sends them.
    assert auto.headers["OpenAI-Organization"] == "org-ours"
    assert auto.headers["OpenAI-Project"] == "proj-ours"
    assert "Authorization" not in direct.headers  # transport: direct takes api_key only
    assert "OpenAI-Organization" not in direct.headers


def test_api_base_is_required() -> None:
    with pytest.raises(ValueError, match="api_base"):
        DirectTransport(None)


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (429, "", "rate_limited"),
        (401, "", "auth"),
        (403, "", "auth"),
        (408, "", "unavailable"),
        (500, "", "unavailable"),
        (502, "<html>Bad Gateway</html>", "unavailable"),
        (400, "Invalid value for 'temperature'", "bad_request"),
        (404, "", "bad_request"),
        (413, "", "bad_request"),
        (422, "", "bad_request"),
        (400, '{"error": {"code": "context_length_exceeded"}}', "context_overflow"),
        (422, "prompt has too many tokens", "context_overflow"),
    ],
)
def test_kind_for_status(status: int, body: str, kind: str) -> None:
    assert _kind_for_status(status, body) == kind


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ({"code": 429}, 429),
        ({"code": "rate_limit_exceeded"}, 429),
        ({"code": "invalid_api_key", "type": "invalid_request_error"}, 401),
        ({"type": "invalid_request_error"}, 400),
        ({"type": "server_error"}, 500),
        ({"code": 200}, 500),
        (None, 500),
    ],
)
def test_error_status(error: object, status: int) -> None:
    assert _error_status(error) == status


def test_lines_split_payloads_across_reads() -> None:
    lines = _Lines()
    reads: Sequence[tuple[bytes, list[bytes]]] = [
        (b"data: one\n\nda", [b"one"]),
        (b"ta: t", []),
        (b"wo\r\n", [b"two"]),
        (b": comment\nid: 3\n\ndata:three\ndata: [DONE]\n", [b"three", b"[DONE]"]),
    ]
    for data, payloads in reads:
        assert lines.feed(data) == payloads
