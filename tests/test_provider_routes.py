"""The provider over its transports: retries and fallbacks across them, whose key and server
each call gets, the routes `auto` decides without litellm (checked against litellm's own
answer), and the commands that import no litellm."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from nanobot.app import build_provider
from nanobot.config import AgentConfig, Config
from nanobot.errors import ProviderError, ProviderErrorKind
from nanobot.providers import Call, Completion, DeltaHandler, Usage
from nanobot.providers.catalog import DATA_FILE, Catalog, litellm_data_dir
from nanobot.providers.litellm_provider import LiteLLMTransport, _litellm
from nanobot.providers.openai_direct import DirectTransport
from nanobot.providers.provider import Provider
from nanobot.providers.routes import Routes, litellm_translates
from tests.conftest import Home
from tests.fakes.llm import AuthError, FakeLLM, ServerError, Text
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import TEST_TRANSPORT, GatewayProcess
from tests.local_http import serving
from tests.test_gateway_telegram import ALICE, gateway_config, replies
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


async def test_an_unpriced_models_cost_is_unknown_and_aclose_closes_the_transport() -> None:
    model = "openai/unknown-model-x"
    transport = Scripted({model: [answer("hi", model)]})
    provider = Provider(model, Routes(transport))
    # No price and none reported: no figure at all ("price unknown"), never $0.
    assert (await provider.complete(MESSAGES)).usage == Usage(1000, 100, 0.0, priced=False)
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
        on = {"auto": DirectTransport, "litellm": LiteLLMTransport}[transport]
        assert isinstance(provider.transport("openai/backup-model"), on)
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


# ---- auto decides without litellm (issue 24 §1) --------------------------------------------

# Names no list has: a local server's own, and names that only look like listed ones.
UNLISTED = (
    "fake-model",
    "llama3.1:8b",
    "qwen2.5-coder",
    "o3-local",
    "my/o1",
    "gpt-5-local",
    "acme/gpt-6-mini",
    "gpt-5-chat-latest",
    "ft:gpt-4o-mini",
    "ft:gpt-4o-mini:org:custom:id",
)
SENT = {"max_tokens": 4096, "temperature": 0.3, "stream_options": {"include_usage": True}}


def litellm_sends_unchanged(model: str) -> bool:
    """litellm's own answer (it imports litellm): whether it sends nanobot's parameters to
    the OpenAI-compatible `model` as they are."""
    try:
        mapped = (
            _litellm()
            .OpenAIConfig()
            .map_openai_params(
                non_default_params=dict(SENT),
                optional_params={},
                model=model.removeprefix("openai/"),
                drop_params=True,
            )
        )
    except Exception:  # when litellm cannot say, it changes the request
        return False
    return bool(mapped == SENT)


def test_auto_routes_every_model_as_litellm_would_treat_it() -> None:
    # Every model litellm's list names (as an openai/ id) and names it does not have.
    catalog = Catalog.shipped()
    directory = litellm_data_dir()
    assert directory is not None
    listed = [key for key in json.loads((directory / DATA_FILE).read_bytes()) if "/" not in key]
    assert len(listed) > 500
    names = [f"openai/{name}" for name in (*listed, *UNLISTED)]
    disagree = [
        (name, litellm_translates(name, catalog))
        for name in names
        if litellm_translates(name, catalog) == litellm_sends_unchanged(name)
    ]
    assert disagree == []


@pytest.mark.parametrize(
    ("model", "translated"),
    [
        ("openai/gpt-4o-mini", False),
        ("openai/fake-model", False),
        ("openai/gpt-4o-audio-preview", False),
        ("openai/o1", True),
        ("openai/o3-mini", True),
        ("openai/o4-mini", True),
        ("openai/o3-local", False),  # not listed: a server's own name
        ("openai/gpt-5", True),
        ("openai/gpt-5-local", True),  # by name alone
        ("openai/gpt-5-chat-latest", False),
    ],
)
def test_what_litellm_translates(model: str, translated: bool) -> None:
    assert litellm_translates(model, Catalog.shipped()) is translated


PROBE = """
import atexit, json, sys
def report():
    loaded = sorted(m for m in ("litellm", "openai") if m in sys.modules)
    print(json.dumps(loaded), file=sys.stderr)
atexit.register(report)
from nanobot.cli import main
sys.argv = ["nanobot", *sys.argv[1:]]
main()
"""


async def probe(home: Home, *args: str, env: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """`nanobot ARGS` in `home`: what it printed, and which of litellm and the openai SDK it
    had imported when it exited."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PROBE,
        *args,
        env=env or home.env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode == 0, stderr.decode()
    return stdout.decode(), json.loads(stderr.decode().strip().splitlines()[-1])


def on_auto(home: Home) -> None:
    """`home`'s config on the default transport, `auto`."""
    text = home.config.read_text(encoding="utf-8")
    home.write_config(text.replace(f"  transport: {TEST_TRANSPORT}\n", ""))


def on_openai_itself(home: Home, fake_llm: FakeLLM) -> dict[str, str]:
    """`home` on the default config (openai/gpt-4o-mini, a key, no api_base), OpenAI's API
    being `fake_llm` by the environment variable litellm and the direct transport read."""
    home.write_config(f"data_dir: {home.data_dir}\nagent:\n  api_key: sk-test-secret-key-123456\n")
    return {**home.env, "OPENAI_BASE_URL": fake_llm.base_url}


@pytest.mark.parametrize("setup", ["direct", "auto with api_base", "auto on OpenAI"])
async def test_agent_message_imports_no_litellm(home: Home, fake_llm: FakeLLM, setup: str) -> None:
    env = home.env
    if setup == "auto with api_base":
        on_auto(home)
    elif setup == "auto on OpenAI":
        env = on_openai_itself(home, fake_llm)
    fake_llm.script(Text("Hello without litellm."))
    assert await probe(home, "agent", "-m", "hi there", env=env) == (
        "Hello without litellm.\n",
        [],
    )
    # The window was counted (tiktoken) and the model looked up (litellm's list) regardless.
    (request,) = fake_llm.requests
    assert request.messages[-1]["content"].endswith("hi there")
    assert request.model == ("gpt-4o-mini" if setup == "auto on OpenAI" else "fake-model")
    assert request.headers["Authorization"] == "Bearer sk-test-secret-key-123456"


@pytest.mark.process
@pytest.mark.parametrize("setup", ["auto with api_base", "auto on OpenAI"])
async def test_a_gateway_answers_without_importing_litellm(
    tmp_path: Path, fake_llm: FakeLLM, setup: str
) -> None:
    async with FakeTelegram(token=DEFAULT_TOKEN) as telegram:
        config = gateway_config(tmp_path, fake_llm, telegram, transport="auto")
        # Python lists every module it imports, as it imports it, on stderr.
        env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
        if setup == "auto on OpenAI":
            del config["agent"]["model"], config["agent"]["api_base"]
            env["OPENAI_BASE_URL"] = fake_llm.base_url
        gateway = GatewayProcess(tmp_path, config, env)
        await gateway.start(ready="telegram connected")
        fake_llm.script(Text("Hello from a light gateway."))
        telegram.user_message(ALICE, "hi", user_id=ALICE)
        assert await replies(telegram, ALICE, 1) == ["Hello from a light gateway."]
        assert await gateway.stop() == 0
    imported = {line.rsplit("|", 1)[-1].strip() for line in gateway.stderr if "|" in line}
    assert {"aiohttp", "telegram"} <= imported  # the list is there
    assert imported.isdisjoint({"litellm", "openai"})
    (request,) = fake_llm.requests
    assert request.model == ("gpt-4o-mini" if setup == "auto on OpenAI" else "fake-model")


@pytest.mark.process
async def test_a_fallback_through_litellm_is_prepared_once_the_gateway_answers(
    tmp_path: Path, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The primary is called directly: the gateway takes messages before litellm, which
    # only the fallback needs, is imported (in a thread), and says then what it lacks.
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    fallback = "anthropic/claude-3-5-haiku-20241022"
    async with FakeTelegram(token=DEFAULT_TOKEN) as telegram:
        config = gateway_config(tmp_path, fake_llm, telegram, transport="auto")
        config["agent"]["fallbacks"] = [fallback]
        gateway = GatewayProcess(tmp_path, config, dict(os.environ))
        await gateway.start(ready="telegram connected")
        started = await gateway.wait_log("gateway started", seconds=1)
        warned = await gateway.wait_log(f"fallback {fallback} will fail", seconds=60)
        assert started < warned
        assert "no API key for anthropic: set ANTHROPIC_API_KEY" in gateway.lines[warned]
        fake_llm.script(Text("Direct, with a fallback in reserve."))
        telegram.user_message(ALICE, "hi", user_id=ALICE)
        assert await replies(telegram, ALICE, 1) == ["Direct, with a fallback in reserve."]
        assert await gateway.stop() == 0


@pytest.mark.parametrize("setup", ["auto with api_base", "auto on OpenAI"])
async def test_status_imports_no_litellm(home: Home, fake_llm: FakeLLM, setup: str) -> None:
    on_auto(home)
    env = on_openai_itself(home, fake_llm) if setup == "auto on OpenAI" else home.env
    printed, loaded = await probe(home, "status", env=env)
    assert "(auto)" in printed
    assert loaded == []


async def test_a_model_only_litellm_can_serve_still_answers_through_it(
    home: Home, fake_llm: FakeLLM
) -> None:
    # A reasoning model: litellm sends max_completion_tokens and no temperature.
    on_auto(home)
    text = home.config.read_text(encoding="utf-8").replace("fake-model", "o3-mini")
    home.write_config(text)
    fake_llm.script(Text("Reasoned."))
    assert await probe(home, "agent", "-m", "think") == ("Reasoned.\n", ["litellm", "openai"])
    (request,) = fake_llm.requests
    assert request.model == "o3-mini"
    assert request.body["max_completion_tokens"] == 4096
    assert "temperature" not in request.body
    assert "aiohttp" not in request.headers["User-Agent"]


async def test_no_key_for_openai_itself_is_said_before_any_request(
    home: Home, fake_llm: FakeLLM
) -> None:
    env = on_openai_itself(home, fake_llm)
    home.write_config(f"data_dir: {home.data_dir}\n")
    env.pop("OPENAI_API_KEY", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nanobot",
        "agent",
        "-m",
        "hi",
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode != 0
    assert "no API key for openai: set agent.api_key or OPENAI_API_KEY" in stderr.decode()
    assert fake_llm.request_count == 0
