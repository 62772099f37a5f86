"""The interactive terminal chat, driven through a real pseudo-terminal as a person would."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import sys
import termios

from tests.conftest import Home
from tests.fakes.llm import FakeLLM, Hang, Text


class Terminal:
    """A child process on a pty; reads everything it prints."""

    def __init__(self, process: asyncio.subprocess.Process, master: int) -> None:
        self.process = process
        self.master = master
        self.screen = ""
        self._more = asyncio.Event()
        asyncio.get_running_loop().add_reader(master, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.master, 4096)
        except OSError:
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
        self.screen += data.decode("utf-8", errors="replace")
        self._more.set()

    async def expect(self, text: str, *, after: int = 0, seconds: float = 60) -> int:
        """Wait until `text` appears at or after offset `after`; returns the offset past it."""
        async with asyncio.timeout(seconds):
            while (found := self.screen.find(text, after)) < 0:
                self._more.clear()
                await self._more.wait()
        return found + len(text)

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.master)
        os.close(self.master)


def _take_terminal() -> None:
    # A new session whose controlling terminal is the pty, so Ctrl-C becomes SIGINT.
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


async def open_terminal(home: Home, *args: str) -> Terminal:
    master, slave = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nanobot",
        *args,
        env=home.env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        preexec_fn=_take_terminal,  # the child needs the pty as its controlling tty
    )
    os.close(slave)
    return Terminal(process, master)


async def test_chat_streams_stops_on_ctrl_c_and_quits_on_the_second(
    home: Home, fake_llm: FakeLLM
) -> None:
    fake_llm.chunk_delay = 0.02
    fake_llm.script(Text("Hello from the stream."), Hang(), Text("After the new session."))
    term = await open_terminal(home, "agent")
    try:
        at = await term.expect("you> ")
        term.type("hi\r")
        at = await term.expect("Hello from the stream.", after=at)
        at = await term.expect("you> ", after=at)
        term.type("this will hang\r")
        await fake_llm.wait_for_requests(2, seconds=60)
        term.type("\x03")  # Ctrl-C stops the running turn, not the program
        at = await term.expect("[Stopped.]", after=at)
        term.type("/new\r")
        at = await term.expect("Started a new session.", after=at)
        term.type("again\r")
        at = await term.expect("After the new session.", after=at)
        assert [m["role"] for m in fake_llm.requests[2].messages] == ["system", "user"]
        await term.expect("you> ", after=at)
        term.type("\x03")
        await term.expect("Ctrl-C again", after=at)
        term.type("\x03")
        async with asyncio.timeout(30):
            assert await term.process.wait() == 0
    finally:
        if term.process.returncode is None:
            term.process.kill()
            await term.process.wait()
        term.close()
