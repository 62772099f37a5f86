from __future__ import annotations

import json
import logging
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from loguru import logger

from nanobot import log
from nanobot.config import load
from nanobot.providers.base import Call as BaseCall
from nanobot.providers.litellm_provider import LiteLLMTransport
from tests.fakes.llm import FakeLLM


@pytest.fixture
def log_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # setup() replaces it
    yield tmp_path / "logs"
    logger.remove()


def read(log_dir: Path) -> str:
    logger.complete()
    return (log_dir / "nanobot.log").read_text(encoding="utf-8")


def test_secret_values_are_redacted_everywhere(log_dir: Path) -> None:
    log.setup(level="DEBUG", log_dir=log_dir, secrets=["hunter2-secret", "", "abc"])
    logger.info("key is hunter2-secret")
    logging.getLogger("httpx").warning("sent hunter2-secret upstream")
    text = read(log_dir)
    assert "hunter2-secret" not in text
    assert text.count(log.REDACTED) == 2
    assert "sent *** upstream" in text


def test_secret_shapes_are_redacted_without_being_configured(log_dir: Path) -> None:
    log.setup(level="INFO", log_dir=log_dir)
    url = "https://api.telegram.org/bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/getMe"
    logging.getLogger("httpx").warning("HTTP Request: POST %s", url)
    logger.warning("using sk-proj-abcdefghijklmnop")
    text = read(log_dir)
    assert "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw" not in text
    assert "sk-proj-abcdefghijklmnop" not in text
    assert "/bot***/getMe" in text


def test_exception_text_is_redacted(log_dir: Path) -> None:
    secret = "tok-" + "123456"  # not spelt out here: tracebacks quote source lines
    log.setup(level="INFO", log_dir=log_dir, secrets=[secret])
    try:
        raise RuntimeError(f"auth failed for {secret}")
    except RuntimeError:
        logger.exception("call failed")
    assert secret not in read(log_dir)


def test_library_loggers_are_quieter_unless_debugging(log_dir: Path) -> None:
    log.setup(level="INFO", log_dir=log_dir)
    logging.getLogger("telegram.ext").info("polling noise")
    logger.info("our own line")
    text = read(log_dir)
    assert "polling noise" not in text
    assert "our own line" in text


def test_json_lines(log_dir: Path) -> None:
    log.setup(level="INFO", json=True, log_dir=log_dir, secrets=["s3cr3t-value"])
    logger.info("hello s3cr3t-value")
    line = read(log_dir).strip().splitlines()[-1]
    assert '"text"' in line
    assert "s3cr3t-value" not in line


# ---- containment: nothing secret, nothing forged, whatever the record holds -------------

SECRET = "tok-" + "9f8e7d6c5b4a"  # built, not spelt out: tracebacks quote source lines


def raise_with_secret_in_a_local() -> None:
    token = SECRET  # a local value that a traceback with values would print
    raise ValueError("connection refused after " + str(len(token)) + " characters")


class QuotingError(Exception):
    """An exception whose text is not its args (as many libraries build theirs)."""

    def __str__(self) -> str:
        return f"the server answered for {SECRET}"


def test_tracebacks_show_no_local_values(log_dir: Path) -> None:
    log.setup(level="INFO", log_dir=log_dir)
    try:
        raise_with_secret_in_a_local()
    except ValueError:
        logger.exception("call failed")
    text = read(log_dir)
    assert "Traceback (most recent call last):" in text
    assert "ValueError: connection refused after 16 characters" in text
    assert SECRET not in text


def test_exception_text_is_redacted_however_it_is_built(log_dir: Path) -> None:
    log.setup(level="INFO", log_dir=log_dir, secrets=[SECRET])
    try:
        try:
            raise QuotingError()
        except QuotingError as exc:
            raise RuntimeError(f"retrying {SECRET} failed") from exc
    except RuntimeError as exc:
        logger.opt(exception=exc).error("giving up")
    text = read(log_dir)
    assert "QuotingError: the server answered for ***" in text
    assert "RuntimeError: retrying *** failed" in text
    assert SECRET not in text


def test_extra_is_redacted(log_dir: Path) -> None:
    log.setup(level="INFO", json=True, log_dir=log_dir, secrets=[SECRET])
    bound = logger.bind(auth=SECRET, nested={"keys": [SECRET, 1]}, other=Path(SECRET))
    bound.info("calling {}", "the API", token=SECRET)  # keyword arguments land in `extra`
    line = read(log_dir).strip()
    assert SECRET not in line
    extra = json.loads(line)["record"]["extra"]
    assert extra == {"auth": "***", "nested": {"keys": ["***", 1]}, "other": "***", "token": "***"}


def test_json_sink_holds_the_redacted_traceback_and_no_exception_object(log_dir: Path) -> None:
    log.setup(level="INFO", json=True, log_dir=log_dir, secrets=[SECRET])
    try:
        raise QuotingError()
    except QuotingError:
        logger.exception("failed")
    text = read(log_dir)
    assert SECRET not in text
    record = json.loads(text)["record"]
    assert record["exception"] is None
    assert record["extra"][log.TRACEBACK].endswith("QuotingError: the server answered for ***")


def test_tokens_in_library_lines_are_redacted_by_their_shape(log_dir: Path) -> None:
    log.setup(level="DEBUG", log_dir=log_dir)
    token = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
    discord = "MTA4NzY1NDMyMTA5ODc2NTQzMg.GaBcDe.abcdefghijklmnopqrstuvwxyz0123"
    httpx = logging.getLogger("httpx")
    httpx.info("HTTP Request: POST https://api.telegram.org/bot%s/getMe", token)
    httpx.info("GET https://api.telegram.org/file/bot%s/photos/a.jpg", token)
    httpx.info("GET /bot%s/getMe", token.replace(":", "%3A"))
    logging.getLogger("telegram.ext").debug("token %s rejected", token)
    logging.getLogger("discord.http").debug("headers {'Authorization': 'Bot %s'}", discord)
    logging.getLogger("aiohttp.client").debug("Authorization: Bearer abc.def-123")
    text = read(log_dir)
    for secret in (token, token.split(":")[1], discord, "abc.def-123"):
        assert secret not in text
    assert "/bot***/getMe" in text and "/file/bot***/photos" in text
    assert "'Authorization': 'Bot ***'" in text and "Authorization: Bearer ***" in text


def test_configured_secrets_are_redacted_in_every_form(log_dir: Path) -> None:
    token = "7000000001:AAFakeTokenForNanobotTests_0123456789"
    log.setup(level="INFO", log_dir=log_dir, secrets=[token, "p@ss word/1"])
    logger.info("url {}", "https://x/?t=" + quote(token, safe=""))
    logger.info("half {}", token.split(":")[1])
    logger.info("form {}", quote_plus("p@ss word/1"))
    text = read(log_dir)
    assert "AAFakeTokenForNanobotTests" not in text
    assert "p%40ss" not in text
    assert text.count(log.REDACTED) == 3


def test_library_loggers_go_through_our_sinks_only(
    log_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # litellm's import puts a stderr handler of its own on its loggers.
    own = logging.StreamHandler(sys.stderr)
    logging.getLogger("LiteLLM").addHandler(own)
    log.setup(level="INFO", log_dir=log_dir, secrets=[SECRET])
    logging.getLogger("LiteLLM").warning("request failed for key %s", SECRET)
    logging.getLogger("LiteLLM").info("below the library level")
    text = read(log_dir)
    assert "request failed for key ***" in text
    assert "below the library level" not in text
    assert own not in logging.getLogger("LiteLLM").handlers
    assert SECRET not in capfd.readouterr().err


def test_litellm_is_routed_when_it_is_imported(
    log_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from nanobot.providers import litellm_provider

    log.setup(level="DEBUG", log_dir=log_dir, secrets=[SECRET])
    litellm = litellm_provider._litellm()
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        assert logging.getLogger(name).handlers == []
    assert logging.getLogger("httpx").level == logging.DEBUG  # litellm set it to WARNING
    assert litellm.suppress_debug_info
    logging.getLogger("LiteLLM").debug("request for %s failed", SECRET)
    assert "request for *** failed" in read(log_dir)
    err = capfd.readouterr().err
    assert SECRET not in err
    assert "LiteLLM:DEBUG" not in err  # litellm's own format: its handler printed nothing


async def test_a_litellm_line_is_written_once_by_each_sink(
    log_dir: Path, capfd: pytest.CaptureFixture[str], fake_llm: FakeLLM
) -> None:
    # litellm's import gives its loggers a stderr handler of their own: with it left in
    # place, each of its lines would be printed twice, once in its format and once in ours.
    log.setup(level="DEBUG", log_dir=log_dir)
    transport = LiteLLMTransport("openai/fake-model", api_key="sk-test", api_base=fake_llm.base_url)
    call = BaseCall("openai/fake-model", [{"role": "user", "content": "hi"}], (), 50, 0.0)
    await transport.stream(call, None)
    line = "LiteLLM completion() model= fake-model; provider = openai"  # litellm's own, at INFO
    assert read(log_dir).count(line) == 1
    assert capfd.readouterr().err.count(line) == 1


def test_discord_voice_warnings_at_every_start_are_only_debug(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import discord

    log.setup(level="DEBUG", log_dir=log_dir)
    seen: list[str] = []
    logger.add(seen.append, level="DEBUG", format="{level} {message}")
    # As on the first Client of a process without discord.py's voice extras installed.
    monkeypatch.setattr(discord.VoiceClient, "warn_nacl", True)
    monkeypatch.setattr(discord.VoiceClient, "warn_dave", True)
    discord.Client(intents=discord.Intents.none())
    voice = [line for line in seen if "voice will NOT be supported" in line]
    assert voice and all(line.startswith("DEBUG ") for line in voice), seen
    logging.getLogger("discord.client").warning("PyNaCl is fine but something else is not")
    assert seen[-1].startswith("WARNING "), seen  # only the routine lines are demoted
    # The reply client never connects to the gateway, so it asks for no intents: said as
    # discord.py's ConnectionState says it, at each of its logins.
    logging.getLogger("discord.state").warning(
        "Guilds intent seems to be disabled. This may cause state related issues."
    )
    assert seen[-1].startswith("DEBUG Guilds intent"), seen


def test_text_from_outside_cannot_forge_lines(log_dir: Path) -> None:
    log.setup(level="INFO", log_dir=log_dir)
    forged = "hi\n2030-01-01 00:00:00.000 | INFO    | nanobot: owner approved\x1b[2K\r\u202e"
    logger.info("message from {}: {}", "mallory", forged)
    logging.getLogger("discord.gateway").warning("event: %s", forged)
    lines = read(log_dir).splitlines()
    assert len(lines) == 2
    assert all(line.startswith(lines[0][:4]) for line in lines)
    assert "hi\\n2030-01-01" in lines[0] and "\\x1b[2K\\r\\u202e" in lines[0]
    assert "\x1b" not in lines[1]


def test_traceback_lines_never_start_a_line(log_dir: Path) -> None:
    log.setup(level="INFO", log_dir=log_dir)
    try:
        raise ValueError("bad\n2030-01-01 00:00:00.000 | INFO    | nanobot: forged\x1b[2K")
    except ValueError:
        logger.exception("failed")
    lines = read(log_dir).splitlines()
    assert lines[0].endswith("failed")
    assert all(line == "" or line.startswith("  ") for line in lines[1:])
    assert "\x1b" not in "".join(lines)


def test_log_files_are_private(log_dir: Path) -> None:
    log.setup(level="INFO", log_dir=log_dir)
    logger.info("hello")
    read(log_dir)
    assert stat.S_IMODE(log_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((log_dir / "nanobot.log").stat().st_mode) == 0o600


def test_existing_log_files_are_made_private(log_dir: Path) -> None:
    log_dir.mkdir(mode=0o755)
    log_dir.chmod(0o755)
    rotated = log_dir / "nanobot.2024-01-01_00-00-00_000000.log"
    for path in (log_dir / "nanobot.log", rotated):
        path.write_text("old\n", encoding="utf-8")
        path.chmod(0o644)
    log.setup(level="INFO", log_dir=log_dir)
    assert stat.S_IMODE(log_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((log_dir / "nanobot.log").stat().st_mode) == 0o600
    assert stat.S_IMODE(rotated.stat().st_mode) == 0o600


def test_configure_redacts_the_config_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = {
        "agent": "sk-config-agent-key-000",
        "telegram": "7000000002:AAConfigTelegramToken_0123456789abcd",
        "discord": "config-discord-token-value",
        "search": "config-search-key-value",
        "OPENAI_API_KEY": "env-openai-key-value",
        "GITHUB_TOKEN": "env-github-token-value",
        "SERVICE_SECRET": "env-service-secret",
        "DB_PASSWORD": "env-db-password",
        "NANOBOT_TOOLS__WEB__SEARCH_API_KEY": "env-nanobot-search-key",
    }
    for name in ("OPENAI_API_KEY", "GITHUB_TOKEN", "SERVICE_SECRET", "DB_PASSWORD"):
        monkeypatch.setenv(name, secrets[name])
    monkeypatch.setenv("DEBUG_TOKEN", "1")  # too short to be a secret: left alone
    path = tmp_path / "config.yaml"
    path.write_text(
        f"data_dir: {tmp_path / 'data'}\n"
        f"agent: {{api_key: {secrets['agent']}}}\n"
        "channels:\n"
        f"  telegram: {{token: '{secrets['telegram']}'}}\n"
        f"  discord: {{token: {secrets['discord']}}}\n"
        f"tools: {{web: {{search_api_key: {secrets['search']}}}}}\n",
        encoding="utf-8",
    )
    config = load(path)
    monkeypatch.setenv(
        "NANOBOT_TOOLS__WEB__SEARCH_API_KEY", secrets["NANOBOT_TOOLS__WEB__SEARCH_API_KEY"]
    )  # set after loading: only the scan sees it
    try:
        log.configure(config, quiet=False)
        for value in secrets.values():
            logger.info("value {} logged", value)
        logger.info("debug level {}", 1)
        text = read(config.log_dir)
    finally:
        logger.remove()
    for value in secrets.values():
        assert value not in text
    assert text.count("value *** logged") == len(secrets)
    assert "debug level 1" in text


def test_uncaught_exceptions_are_logged_redacted(log_dir: Path) -> None:
    log.setup(level="INFO", log_dir=log_dir, secrets=[SECRET])
    error = RuntimeError(f"start-up failed for {SECRET}")
    sys.excepthook(RuntimeError, error, None)
    text = read(log_dir)
    assert "unhandled RuntimeError" in text
    assert "RuntimeError: start-up failed for ***" in text
