"""The provider over its transports: retries and fallbacks across them, whose key and server
each call gets, and `agent -m` on the direct transport without litellm."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from nanobot.app import build_provider
from nanobot.config import AgentConfig, Config
from nanobot.errors import ProviderError, ProviderErrorKind
from nanobot.providers import Call, Completion, DeltaHandler, Usage
from nanobot.providers.litellm_provider import LiteLLMTransport
from nanobot.providers.openai_direct import DirectTransport
from nanobot.providers.provider import Provider, Routes
from tests.conftest import Home
from tests.fakes.llm import AuthError, FakeLLM, ServerError, Text
from tests.local_http import serving
from tests.test_provider import FAST, MESSAGES

Step = Completion | ProviderErrorKind


@dataclass
class Scripted:
    """A transport answering each model from its script: a Completion, or the kind of error
    to raise."""

    script: dict[str, list[Step]]
    calls: list[Call] = field(default_factory=list)
    closed: int = 0

    async def stream(self, call: Call, on_delta: DeltaHandler | None) -> Completion:
        self.calls.append(call)
        step = self.script[call.model].pop(0)
        if isinstance(step, str):
            raise ProviderError(step, f"{call.model}: {step}", model=call.model)
        return step

    def prepare(self) -> None:
        pass

    async def aclose(self) -> None:
        self.closed += 1


def answer(text: str, model: str) -> Completion:
    return Completion(text, usage=Usage(1000, 100), model=model)


@pytest.mark.parametrize(
    ("kind", "tries", "falls_back"),
    [
        ("unavailable", 1 + FAST.attempts, True),
        ("rate_limited", 1 + FAST.attempts, True),
        ("timeout", 1 + FAST.attempts, True),
        ("auth", 1, True),
        ("context_overflow", 1, False),
        ("bad_request", 1, False),
    ],
)
async def test_what_is_retried_and_what_falls_back(
    kind: ProviderErrorKind, tries: int, falls_back: bool
) -> None:
    backup = "openai/gpt-4o-mini"
    transport = Scripted({"a": [kind] * 10, backup: [answer("backup", backup)]})
    provider = Provider("a", Routes(transport), fallbacks=[backup], retry=FAST, max_tokens=9)
    if falls_back:
        completion = await provider.complete(MESSAGES, max_tokens=77)
        assert completion.content == "backup"
        # Priced by the provider from litellm's list, whichever transport answered.
        assert completion.usage.cost == pytest.approx(1000 * 1.5e-07 + 100 * 6e-07)
    else:
        with pytest.raises(ProviderError) as info:
            await provider.complete(MESSAGES, max_tokens=77)
        assert info.value.kind == kind
    expected = [("a", 77, 0.3)] * tries + [(backup, 77, 0.3)] * falls_back
    assert [(c.model, c.max_tokens, c.temperature) for c in transport.calls] == expected


async def test_unpriced_models_cost_nothing_and_aclose_closes_the_transport() -> None:
    model = "openai/unknown-model-x"
    transport = Scripted({model: [answer("hi", model)]})
    provider = Provider(model, Routes(transport))
    assert (await provider.complete(MESSAGES)).usage == Usage(1000, 100, 0.0)
    await provider.aclose()
    assert transport.closed == 1


async def test_auto_retries_direct_then_falls_back_through_litellm(fake_llm: FakeLLM) -> None:
    # A reasoning model's parameters are translated by litellm, so it is called through it.
    agent = AgentConfig(
        model="openai/fake-model",
        api_base=fake_llm.base_url,
        api_key="sk-ours",
        fallbacks=["openai/o3-mini"],
        max_retries=2,
    )
    provider = build_provider(Config(agent=agent))
    fake_llm.script_for("fake-model", *[ServerError(503)] * 3)
    fake_llm.script_for("o3-mini", ServerError(500), Text("through litellm"))
    completion = await provider.complete(MESSAGES)
    await provider.aclose()
    assert completion.content == "through litellm"
    assert completion.model == "openai/o3-mini"
    assert isinstance(provider.transport("openai/fake-model"), DirectTransport)
    assert isinstance(provider.transport("openai/o3-mini"), LiteLLMTransport)
    agents = [("aiohttp" in r.headers["User-Agent"], r.model) for r in fake_llm.requests]
    assert agents == [(True, "fake-model")] * 3 + [(False, "o3-mini")] * 2
    assert {r.headers["Authorization"] for r in fake_llm.requests} == {"Bearer sk-ours"}


@pytest.fixture
async def other_openai(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeLLM]:
    """OpenAI's own API, as the environment names it for a model of another provider's
    fallback: its own server and key."""
    async with FakeLLM() as fake:
        monkeypatch.setenv("OPENAI_API_BASE", fake.base_url)
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-own")
        yield fake


@pytest.mark.parametrize("transport", ["auto", "litellm"])
async def test_a_fallback_of_another_provider_gets_neither_our_key_nor_our_server(
    transport: str, fake_llm: FakeLLM, other_openai: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Our model is Anthropic's, behind our api_base with our key; its fallback is OpenAI's.
    seen: list[tuple[str, str | None]] = []

    async def anthropic(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("x-api-key")))
        return web.json_response({"type": "error", "error": {"message": "no"}}, status=401)

    app = web.Application()
    app.router.add_post("/v1/messages", anthropic)
    async with serving(app) as base:
        agent = AgentConfig(
            model="anthropic/claude-3-5-haiku-20241022",
            api_base=base,
            api_key="sk-ours",
            transport=transport,
            fallbacks=["openai/backup-model"],
            max_retries=0,
        )
        provider = build_provider(Config(agent=agent))
        assert isinstance(provider.transport("openai/backup-model"), LiteLLMTransport)
        other_openai.script(Text("from OpenAI itself"))
        completion = await provider.complete(MESSAGES)
        await provider.aclose()
    assert completion.content == "from OpenAI itself"
    assert seen == [("/v1/messages", "sk-ours")]
    assert fake_llm.request_count == 0
    (request,) = other_openai.requests
    assert request.model == "backup-model"
    assert request.headers["Authorization"] == "Bearer sk-openai-own"


async def test_auto_sends_a_fallback_of_our_provider_directly_with_our_key(
    fake_llm: FakeLLM, other_openai: FakeLLM
) -> None:
    agent = AgentConfig(
        model="openai/fake-model",
        api_base=fake_llm.base_url,
        api_key="sk-ours",
        fallbacks=["openai/backup-model"],
        max_retries=0,
    )
    provider = build_provider(Config(agent=agent))
    fake_llm.script_for("fake-model", ServerError(500))
    fake_llm.script_for("backup-model", Text("backup, direct"))
    assert (await provider.complete(MESSAGES)).content == "backup, direct"
    await provider.aclose()
    assert isinstance(provider.transport("openai/backup-model"), DirectTransport)
    assert [r.model for r in fake_llm.requests] == ["fake-model", "backup-model"]
    assert {r.headers["Authorization"] for r in fake_llm.requests} == {"Bearer sk-ours"}
    assert all("aiohttp" in r.headers["User-Agent"] for r in fake_llm.requests)
    assert other_openai.request_count == 0


async def test_direct_sends_every_fallback_to_our_server(fake_llm: FakeLLM) -> None:
    agent = AgentConfig(
        model="openai/fake-model",
        api_base=fake_llm.base_url,
        transport="direct",
        fallbacks=["anthropic/claude-3-5-haiku-20241022"],
        max_retries=0,
    )
    provider = build_provider(Config(agent=agent))
    fake_llm.script_for("fake-model", AuthError())
    assert (await provider.complete(MESSAGES)).content == "echo: hi"
    await provider.aclose()
    # As given: only the leading "openai/" goes, as litellm drops it for an openai/ model.
    models = [r.model for r in fake_llm.requests]
    assert models == ["fake-model", "anthropic/claude-3-5-haiku-20241022"]


PROBE = """
import atexit, json, sys
def report():
    loaded = sorted(m for m in ("litellm", "openai") if m in sys.modules)
    print(json.dumps(loaded), file=sys.stderr)
atexit.register(report)
from nanobot.cli import main
sys.argv = ["nanobot", "agent", "-m", "hi there"]
main()
"""


async def test_agent_message_on_the_direct_transport_imports_no_litellm(
    home: Home, fake_llm: FakeLLM
) -> None:
    home.write_config(home.config.read_text(encoding="utf-8") + "  transport: direct\n")
    fake_llm.script(Text("Hello without litellm."))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PROBE,
        env=home.env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode == 0, stderr.decode()
    assert stdout.decode() == "Hello without litellm.\n"
    assert json.loads(stderr.decode().strip().splitlines()[-1]) == []
    # The window was counted (tiktoken) and the model looked up (litellm's list) regardless.
    assert fake_llm.requests[0].messages[-1]["content"].endswith("hi there")


def test_prepare_routes_every_model_so_no_call_stalls_on_deciding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = AgentConfig(
        model="openai/fake-model", api_base="http://127.0.0.1:9/v1", fallbacks=["openai/o3-mini"]
    )
    provider = build_provider(Config(agent=agent))
    provider.prepare()

    def decided_again(*args: object) -> bool:
        raise AssertionError("prepare() should have decided this")

    monkeypatch.setattr(LiteLLMTransport, "sends_unchanged", decided_again)
    assert isinstance(provider.transport("openai/fake-model"), DirectTransport)
    assert isinstance(provider.transport("openai/o3-mini"), LiteLLMTransport)
