"""End to end: the gateway's logs hold no secret when things go wrong (DESIGN.md §4).

The failures that print tracebacks, at INFO and at DEBUG (where every library logs its
requests): the platforms unreachable at start-up, a malformed answer from a platform, a
channel crashing while it runs, a model provider that quotes the key back in its error.
Each test also relies on the audit every gateway test gets (`tests.gateway_process`).
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.discord import FakeDiscord
from tests.fakes.discord import Garbled as DiscordGarbled
from tests.fakes.llm import AuthError, FakeLLM, Text
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram, Garbled
from tests.gateway_process import GatewayProcess

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

ALICE = 1001
ADA = 424242
DISCORD_TOKEN = "MTA4NzY1NDMyMTA5ODc2NTQzMg.GaBcDe.discord-secret-part-0123456789abc"
API_KEY = "sk-test-secret-key-123456"
SEARCH_KEY = "brave-search-secret-0123456789"
ENV_KEY = "env-provider-key-0123456789abcdef"  # shaped like no known key
LOGGING = [
    pytest.param({"level": "INFO"}, id="info"),
    pytest.param({"level": "DEBUG"}, id="debug"),
]


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=DEFAULT_TOKEN) as fake:
        yield fake


@pytest.fixture
async def discord() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as fake:
        yield fake


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections: bound (so nothing else takes it
    meanwhile) but not listening."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port: int = held.getsockname()[1]
        yield port


def settings(
    root: Path, llm: FakeLLM, telegram_base: str, discord_base: str, log: dict[str, Any]
) -> dict[str, Any]:
    """Both platforms, every kind of secret the config holds, and `log`."""
    return {
        "data_dir": str(root / "data"),
        "log": log,
        "agent": {
            "model": "openai/fake-model",
            "api_base": llm.base_url,
            "api_key": API_KEY,
            "max_retries": 0,
        },
        "tools": {"web": {"search_api_key": SEARCH_KEY}},
        "channels": {
            "telegram": {
                "enabled": True,
                "token": DEFAULT_TOKEN,
                "allow_from": [ALICE],
                "api_base": telegram_base,
            },
            "discord": {
                "enabled": True,
                "token": DISCORD_TOKEN,
                "allow_from": [ADA],
                "api_base": f"{discord_base}/api/v10",
                "gateway_url": f"{discord_base.replace('http', 'ws')}/gateway",
            },
        },
        "gateway": {"shutdown_timeout": 5},
    }


def with_fakes(
    root: Path, llm: FakeLLM, telegram: FakeTelegram, discord: FakeDiscord, log: dict[str, Any]
) -> dict[str, Any]:
    config = settings(root, llm, telegram.base_url, "http://unused", log)
    config["channels"]["discord"] |= {
        "api_base": discord.api_base,
        "gateway_url": discord.gateway_url,
    }
    return config


async def finish(process: GatewayProcess) -> None:
    """Stop the gateway cleanly, then check what it wrote (the audit would, too)."""
    assert await process.stop(signal.SIGTERM) == 0
    assert process.secrets().keys() >= {
        "channels.telegram.token",
        "channels.discord.token",
        "tools.web.search_api_key",
    }
    logs = list((process.data_dir / "logs").glob("nanobot*.log"))
    assert logs, "the gateway wrote no log file"
    assert process.leaks() == []


@pytest.mark.parametrize(
    "log", [*LOGGING, pytest.param({"level": "DEBUG", "json": True}, id="debug-json")]
)
async def test_platforms_unreachable_at_start_up(
    tmp_path: Path, fake_llm: FakeLLM, closed_port: int, log: dict[str, Any]
) -> None:
    # Routine offline: one warning a try, no traceback; the reasons quote the libraries'
    # errors, which name URLs that hold the token.
    base = f"http://127.0.0.1:{closed_port}"
    process = GatewayProcess(
        tmp_path, settings(tmp_path, fake_llm, base, base, log), dict(os.environ)
    )
    await process.start()
    await process.wait_log("telegram cannot reach its platform", seconds=60)
    await process.wait_log("discord cannot reach its platform", seconds=60)
    assert "Traceback" not in process.log()
    if log["level"] == "DEBUG":
        await process.wait_log("Set Bot API URL: http")  # PTB's line, with the token
        assert "/bot***" in process.log()
    await finish(process)


@pytest.mark.parametrize("log", LOGGING)
async def test_malformed_platform_answers(
    tmp_path: Path,
    fake_llm: FakeLLM,
    telegram: FakeTelegram,
    discord: FakeDiscord,
    log: dict[str, Any],
) -> None:
    telegram.fail_next("getMe", Garbled({"unexpected": True}))
    discord.fail_next("GET /users/@me", DiscordGarbled())
    process = GatewayProcess(
        tmp_path, with_fakes(tmp_path, fake_llm, telegram, discord, log), dict(os.environ)
    )
    await process.start()
    await process.wait_log("telegram crashed", seconds=60)
    await process.wait_log("discord crashed", seconds=60)
    await process.wait_log("telegram connected", seconds=60)  # the faults were one-off
    await process.wait_log("discord connected", seconds=60)
    await finish(process)


@pytest.mark.parametrize("log", LOGGING)
async def test_channels_crashing_while_running(
    tmp_path: Path,
    fake_llm: FakeLLM,
    telegram: FakeTelegram,
    discord: FakeDiscord,
    log: dict[str, Any],
) -> None:
    process = GatewayProcess(
        tmp_path, with_fakes(tmp_path, fake_llm, telegram, discord, log), dict(os.environ)
    )
    await process.start()
    await process.wait_log("manager: telegram connected", seconds=60)
    await process.wait_log("manager: discord connected", seconds=60)
    await discord.wait_for_ready()
    # Telegram: a document whose file cannot be looked up (a malformed answer) fails the
    # update's intake, which restarts the channel; the update comes again and is taken.
    telegram.fail_next("getFile", Garbled())
    fake_llm.script(Text("got it"))
    telegram.user_document(ALICE, filename="a.txt", content=b"text", user_id=ALICE)
    # Discord: the gateway closes with a code fatal to discord.py (not a rejected token).
    await discord.disconnect_all(4012, "Invalid API version.")
    await process.wait_log("telegram crashed", seconds=60)
    crashed = await process.wait_log("discord crashed", seconds=60)
    await process.wait_log("manager: discord connected", after=crashed, seconds=60)
    await telegram.wait_for_sent(1, ALICE, seconds=60)
    await finish(process)


@pytest.mark.parametrize("log", LOGGING)
async def test_a_provider_error_quoting_the_key(
    tmp_path: Path,
    fake_llm: FakeLLM,
    telegram: FakeTelegram,
    discord: FakeDiscord,
    log: dict[str, Any],
) -> None:
    # The fake answers 401 with the key it was sent, as some providers do. The key comes
    # from the environment (litellm reads OPENAI_API_KEY), so only the environment's
    # secrets, not the config's, can redact it.
    config = with_fakes(tmp_path, fake_llm, telegram, discord, log)
    del config["agent"]["api_key"]
    config["agent"]["transport"] = "litellm"
    process = GatewayProcess(tmp_path, config, dict(os.environ) | {"OPENAI_API_KEY": ENV_KEY})
    await process.start()
    await process.wait_log("telegram connected", seconds=60)
    fake_llm.script(AuthError())
    telegram.user_message(ALICE, "hello", user_id=ALICE)
    (reply,) = await telegram.wait_for_sent(1, ALICE, seconds=30)
    assert ENV_KEY not in reply.visible
    headers = {name.lower(): value for name, value in fake_llm.requests[0].headers.items()}
    assert headers["authorization"] == f"Bearer {ENV_KEY}"
    assert "$OPENAI_API_KEY" in process.secrets()
    await finish(process)
