"""Mistakes get one clear line, at once (issue 16 §2): a bad config, a channel without a
token or with one the platform refuses, a missing API key, a data dir that cannot be written,
a second gateway. Each as a user meets it: `nanobot` as a subprocess, against the fakes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import Home
from tests.fakes.discord import FakeDiscord
from tests.fakes.llm import AuthError, FakeLLM, ServerError
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import GatewayProcess
from tests.test_cli import Result, nanobot
from tests.test_gateway_discord import config as both_platforms
from tests.test_gateway_telegram import gateway_config

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=DEFAULT_TOKEN) as fake:
        yield fake


def one_line(result: Result) -> str:
    """The single line a failed command printed on stderr (it fails if there were more)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


# ---- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("NANOBOT_AGENT__FALLBACKS", "openai/gpt-4o", """'["openai/gpt-4o"]'"""),
        ("NANOBOT_CHANNELS__TELEGRAM__ALLOW_FROM", "[1,2", """'["1", "2"]'"""),
    ],
)
async def test_a_list_variable_that_is_not_json_exits_2_naming_it_and_the_form(
    home: Home, name: str, value: str, expected: str
) -> None:
    for command in (["status"], ["gateway"]):
        line = one_line(await nanobot(home, *command, env=home.env | {name: value}))
        assert line.startswith(f"nanobot: environment variable {name}: not valid JSON"), line
        assert f"it must be a JSON list, e.g. {name}={expected}" in line


async def test_a_key_set_twice_in_the_file_exits_2_naming_file_line_and_key(home: Home) -> None:
    before = home.config.read_text()
    home.write_config(before + "agent:\n  max_tokens: 100\n")
    result = await nanobot(home, "status")
    assert result.code == 2
    line = len(before.splitlines()) + 1
    assert one_line(result).startswith(
        f"nanobot: {home.config}: line {line}: key 'agent' is set twice"
    )


async def test_a_username_in_allow_from_is_refused_with_where_to_find_ids(home: Home) -> None:
    home.write_config(home.config.read_text() + "channels: {telegram: {allow_from: ['@ada']}}\n")
    result = await nanobot(home, "status")
    assert result.code == 2
    assert "channels.telegram.allow_from: '@ada' is not a user id" in result.stderr
    assert "`nanobot pairing list` shows the id" in result.stderr


async def test_a_model_id_without_its_provider_is_refused_with_the_fix(home: Home) -> None:
    home.write_config(home.config.read_text().replace("openai/fake-model", "gpt-4o"))
    result = await nanobot(home, "agent", "-m", "hi")
    assert result.code == 2
    assert "agent.model: 'gpt-4o' names no provider" in result.stderr
    assert "e.g. openai/gpt-4o" in result.stderr


# ---- channels -----------------------------------------------------------------------------


async def test_an_enabled_channel_without_a_token_stops_start_up(home: Home) -> None:
    home.write_config(home.config.read_text() + "channels: {discord: {enabled: true}}\n")
    result = await nanobot(home, "gateway")
    assert result.code == 2, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith(f"nanobot: {home.config}: channels.discord is enabled but its token")
    assert "NANOBOT_CHANNELS__DISCORD__TOKEN" in last
    assert "gateway started" not in result.stderr


async def test_no_channel_and_no_terminal_stops_start_up_saying_how_to_enable_one(
    home: Home,
) -> None:
    result = await nanobot(home, "gateway")  # stdin is not a terminal
    assert result.code == 2, result.stderr
    last = result.stderr.splitlines()[-1]
    assert "no chat channel is enabled and no terminal is attached" in last
    assert "channels: {telegram: {enabled: true, token:" in last
    assert "gateway started" not in result.stderr


async def test_a_token_telegram_rejects_stops_the_channel_in_one_line_and_the_gateway(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    config = gateway_config(tmp_path, fake_llm, telegram)
    config["channels"]["telegram"]["token"] = "123456:revoked-token-of-the-bot"
    process = GatewayProcess(tmp_path, config, dict(os.environ))
    await process.start(ready="telegram stopped")
    assert process.process is not None
    assert (
        await asyncio.wait_for(process.process.wait(), 30) == 2
    )  # no channel left: a configuration error
    await process.stop()
    log = process.log()
    assert "received SIGTERM" not in log  # it stopped by itself
    assert "telegram stopped: channels.telegram.token was rejected by Telegram" in log
    assert "@BotFather" in log
    assert "Traceback" not in log and "restarting telegram" not in log
    assert log.count("rejected by Telegram") == 1  # tried once, not restarted for ever


async def test_a_token_discord_rejects_stops_that_channel_only(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    async with FakeDiscord(token="the-current-discord-token") as discord:
        config = both_platforms(tmp_path, fake_llm, telegram, discord)  # another token
        process = GatewayProcess(tmp_path, config, dict(os.environ))
        await process.start(ready="discord stopped")
        await process.wait_log("telegram connected")
        assert await process.stop(signal.SIGTERM) == 0  # Telegram kept it running
    log = process.log()
    assert (
        "discord stopped: channels.discord.token was rejected by Discord (401 Unauthorized)"
    ) in log
    assert "Traceback" not in log and "restarting discord" not in log


async def test_a_token_reset_while_connected_stops_discord_in_one_line(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    token = "discord-bot-token-secret"
    async with FakeDiscord(token=token) as discord:
        process = GatewayProcess(
            tmp_path, both_platforms(tmp_path, fake_llm, telegram, discord), dict(os.environ)
        )
        await process.start()
        await process.wait_log("discord connected", seconds=60)
        await discord.wait_for_ready()
        discord.token = "a-new-token-after-a-reset"
        await discord.disconnect_all(4004, "Authentication failed.")
        await process.wait_log("discord stopped", seconds=30)
        assert await process.stop(signal.SIGTERM) == 0
    log = process.log()
    assert "channels.discord.token was rejected by Discord (gateway closed with 4004)" in log
    assert "Traceback" not in log and "restarting discord" not in log


# ---- the model's provider -----------------------------------------------------------------


async def test_no_api_key_is_said_at_once_without_retries(home: Home) -> None:
    home.write_config(f"data_dir: {home.data_dir}\nagent: {{model: openai/gpt-4o}}\n")
    env = {k: v for k, v in home.env.items() if k != "OPENAI_API_KEY"}
    result = await nanobot(home, "agent", "-m", "hi", env=env)
    assert result.code == 2
    assert one_line(result) == "nanobot: no API key for openai: set agent.api_key or OPENAI_API_KEY"
    # The gateway still starts (a fresh `make run` has no key yet) and says so at once; here
    # it stops for want of a channel.
    gateway = await nanobot(home, "gateway", env=env)
    assert gateway.code == 2
    assert "no API key for openai: set agent.api_key or OPENAI_API_KEY: every reply fails" in (
        gateway.stderr
    )
    assert "retry" not in gateway.stderr


@pytest.mark.parametrize(
    ("failure", "says"),
    [(AuthError(), "its API key was refused"), (ServerError(500), "unavailable")],
)
async def test_a_provider_failure_is_one_line_on_stderr(
    home: Home, fake_llm: FakeLLM, failure: AuthError | ServerError, says: str
) -> None:
    home.write_config(home.config.read_text() + "  max_retries: 1\n")
    fake_llm.script(failure, failure)
    result = await nanobot(home, "agent", "-m", "hi")
    assert result.code == 1
    line = one_line(result)
    assert line.startswith("nanobot: ") and says in line
    retried = isinstance(failure, ServerError)
    assert fake_llm.request_count == (2 if retried else 1)  # a refused key is not retried
    log = (home.data_dir / "logs" / "nanobot.log").read_text()
    assert "failed:" in log  # the runner's warning went to the log file


# ---- the data dir -------------------------------------------------------------------------


def _can_drop_dac_override() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    done = subprocess.run(
        ["setpriv", "--bounding-set", "-dac_override", "true"], capture_output=True, check=False
    )
    return done.returncode == 0


# Root without the capabilities that let it write anywhere: a data dir it may not write is
# then as it is for anyone else (a read-only mount, another owner).
AS_ANYONE = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner")


@pytest.mark.skipif(not _can_drop_dac_override(), reason="needs root and setpriv")
async def test_a_data_dir_that_cannot_be_written_is_one_line_for_every_command(
    home: Home,
) -> None:
    home.data_dir.mkdir(mode=0o555)
    commands = (
        ["agent", "-m", "hi"],
        ["gateway"],
        ["pairing", "list"],
        ["approvals", "rules"],
        ["cron", "list"],
    )
    for command in commands:
        result = await nanobot(home, *command, prefix=AS_ANYONE)
        assert result.code in (1, 2), command
        line = one_line(result)
        assert line.startswith(f"nanobot: data dir {home.data_dir} cannot be written"), line
        assert "Permission denied" in line and "set data_dir (NANOBOT_DATA_DIR)" in line
    assert (await nanobot(home, "status", prefix=AS_ANYONE)).code == 0  # it only reads


async def test_a_second_gateway_on_the_same_data_dir_is_refused_with_the_first_ones_pid(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    first = GatewayProcess(tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ))
    await first.start(ready="telegram connected")
    assert first.process is not None
    second = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nanobot",
        "gateway",
        env=first.env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(second.communicate(), timeout=60)
    assert second.returncode == 1
    assert stderr.decode().splitlines()[-1] == (
        f"nanobot: another gateway is running on the data dir {first.data_dir} "
        f"(pid {first.process.pid}): stop it first, or give this one its own data_dir"
    )
    assert len(telegram.calls("getMe")) == 1  # the second never reached Telegram
    await first.kill()  # kill -9: the lock file stays, the lock does not
    await first.start(ready="telegram connected")
    assert await first.stop(signal.SIGTERM) == 0
