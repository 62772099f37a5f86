"""`nanobot onboard` as a person answers it, at a terminal (a pty): each answer checked by
the config's own rules as it is given, so the file written is one the gateway starts with."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys

import pytest
import yaml

from tests.conftest import Home
from tests.test_cli import nanobot

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)


class Terminal:
    """`nanobot onboard` on a pty: `expect` what it prints, `answer` a line."""

    def __init__(self, env: dict[str, str]) -> None:
        self._master, slave = pty.openpty()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nanobot", "onboard"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            close_fds=True,
        )
        os.close(slave)
        os.set_blocking(self._master, False)
        self.seen = ""

    async def expect(self, text: str, seconds: float = 30) -> None:
        async with asyncio.timeout(seconds):
            while text not in self.seen:
                try:
                    chunk = os.read(self._master, 4096)
                except BlockingIOError:
                    await asyncio.sleep(0.02)
                    continue
                except OSError:  # the process ended: the pty is closed
                    raise AssertionError(f"ended before {text!r}:\n{self.seen}") from None
                self.seen += chunk.decode("utf-8", "replace").replace("\r\n", "\n")

    def answer(self, line: str) -> None:
        os.write(self._master, line.encode() + b"\n")

    async def wait(self) -> int:
        code = await asyncio.to_thread(self.process.wait, 30)
        with_rest = True
        while with_rest:
            try:
                self.seen += os.read(self._master, 4096).decode("utf-8", "replace")
            except OSError:
                with_rest = False
        os.close(self._master)
        return code


async def test_wrong_answers_are_asked_again_with_a_suggestion_and_the_file_starts(
    home: Home,
) -> None:
    config = home.root / "fresh" / "config.yaml"
    env = dict(home.env, NANOBOT_CONFIG=str(config), NANOBOT_DATA_DIR=str(home.root / "d"))
    terminal = Terminal(env)
    await terminal.expect("Model (<provider>/<model>) [openai/gpt-4o-mini]: ")
    terminal.answer("llama3")
    await terminal.expect(
        "'llama3' names no provider: write <provider>/<model>, e.g. openai/llama3"
    )
    await terminal.expect("Model (<provider>/<model>) [openai/llama3]: ")
    terminal.answer("")  # the suggestion, taken
    await terminal.expect("OpenAI-compatible endpoint, if any: ")
    terminal.answer("localhost:11434/v1")
    await terminal.expect("is not an http:// or https:// URL: e.g. http://localhost:11434/v1")
    await terminal.expect("OpenAI-compatible endpoint, if any [http://localhost:11434/v1]: ")
    terminal.answer("")
    await terminal.expect("API key: ")
    terminal.answer("sk-test-secret-key-123456")
    assert await terminal.wait() == 0, terminal.seen
    assert "next: set agent.api_key" not in terminal.seen
    written = yaml.safe_load(config.read_text(encoding="utf-8"))
    assert (written["agent"]["model"], written["agent"]["api_base"]) == (
        "openai/llama3",
        "http://localhost:11434/v1",
    )
    # Run again: the file is kept, and with its key set there is no next step to name.
    again = await nanobot(home, "onboard", "--non-interactive", env=env)
    assert again.code == 0 and "exists; left as it is" in again.stdout
    assert "next: set agent.api_key" not in again.stdout


async def test_an_endpoint_without_a_scheme_is_a_config_error_at_load(home: Home) -> None:
    home.write_config("agent: {model: openai/llama3, api_base: 'localhost:11434/v1'}\n")
    result = await nanobot(home, "status")
    assert result.code == 2
    assert "agent.api_base" in result.stderr
    assert "is not an http:// or https:// URL: e.g. http://localhost:11434/v1" in result.stderr
