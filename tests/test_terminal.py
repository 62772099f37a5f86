"""The interactive terminal chat, driven through a real pseudo-terminal as a person would."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import struct
import sys
import termios
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.conftest import Home
from tests.fakes.llm import Call, FakeLLM, Hang, Text, ToolCalls

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)


ROWS, COLUMNS = 24, 80
PROMPT = "you>"  # how the prompt is drawn (its trailing space is a cursor move)


class Terminal:
    """A child process on a pty, answering what a terminal answers; reads everything it
    prints. Keys are written without blocking (a long paste fills the pty while the child
    waits for its own output to be read)."""

    def __init__(self, process: asyncio.subprocess.Process, master: int) -> None:
        self.process = process
        self.master = master
        self.screen = ""
        self._more = asyncio.Event()
        self._keys = b""
        self._positions = 0  # cursor position requests answered
        os.set_blocking(master, False)
        asyncio.get_running_loop().add_reader(master, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
        self.screen += data.decode("utf-8", errors="replace")
        # prompt_toolkit asks where the cursor is; a terminal answers (row and column): on
        # its last row, where a terminal that has scrolled has it.
        while self._positions < self.screen.count("\x1b[6n"):
            self._positions += 1
            self.type(f"\x1b[{ROWS};1R")
        self._more.set()

    async def expect(self, text: str, *, after: int = 0, seconds: float = 60) -> int:
        """Wait until `text` appears at or after offset `after`; returns the offset past it."""
        async with asyncio.timeout(seconds):
            while (found := self.screen.find(text, after)) < 0:
                self._more.clear()
                await self._more.wait()
        return found + len(text)

    def type(self, keys: str) -> None:
        if not self._keys:
            asyncio.get_running_loop().add_writer(self.master, self._write)
        self._keys += keys.encode()

    def _write(self) -> None:
        try:
            written = os.write(self.master, self._keys[:4096])
        except BlockingIOError:
            return
        except OSError:  # the child is gone
            written = len(self._keys)
        self._keys = self._keys[written:]
        if not self._keys:
            asyncio.get_running_loop().remove_writer(self.master)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.master)
        loop.remove_writer(self.master)
        os.close(self.master)


def _take_terminal() -> None:
    # A new session whose controlling terminal is the pty, so Ctrl-C becomes SIGINT.
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@asynccontextmanager
async def terminal(home: Home, *args: str) -> AsyncIterator[Terminal]:
    """`open_terminal` for the block; the process is killed if it is still running after."""
    term = await open_terminal(home, *args)
    try:
        yield term
    finally:
        if term.process.returncode is None:
            term.process.kill()
            await term.process.wait()
        term.close()


async def open_terminal(home: Home, *args: str, stdout: Path | None = None) -> Terminal:
    """`nanobot *args` on a new pty; `stdout`: its standard output goes to that file
    instead (`nanobot agent > file` typed at a terminal)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    with contextlib.ExitStack() as files:
        out = slave if stdout is None else files.enter_context(stdout.open("wb"))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "nanobot",
            *args,
            env=home.env,
            stdin=slave,
            stdout=out,
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
    async with terminal(home, "agent") as term:
        at = await term.expect(PROMPT)
        term.type("hi\r")
        at = await term.expect("Hello from the stream.", after=at)
        at = await term.expect(PROMPT, after=at)
        term.type("this will hang\r")
        await fake_llm.wait_for_requests(2, seconds=60)
        term.type("\x03")  # Ctrl-C stops the running turn, not the program
        at = await term.expect("Stopped.", after=at)
        term.type("/new\r")
        at = await term.expect("Started a new conversation.", after=at)
        term.type("again\r")
        at = await term.expect("After the new session.", after=at)
        assert [m["role"] for m in fake_llm.requests[2].messages] == ["system", "user"]
        await term.expect(PROMPT, after=at)
        term.type("\x03")
        await term.expect("Ctrl-C again", after=at)
        term.type("\x03")
        async with asyncio.timeout(30):
            assert await term.process.wait() == 0


async def test_a_paste_is_one_message_with_its_newlines_and_typed_lines_go_as_typed(
    home: Home, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("Got the whole paste."), Text("Got the typed line."))
    async with terminal(home, "agent") as term:
        at = await term.expect("\x1b[?2004h")  # the prompt asks the terminal to mark pastes
        at = await term.expect(PROMPT, after=at)
        term.type("\x1b[200~def f():\n    return 1\n\n# end\x1b[201~")  # a paste, so marked
        at = await term.expect("# end", after=at)  # shown at the prompt, not sent yet
        term.type("\r")
        at = await term.expect("Got the whole paste.", after=at)
        term.type("typed alone\r")
        at = await term.expect("Got the typed line.", after=at)
        assert fake_llm.request_count == 2
        pasted = fake_llm.requests[0].messages[-1]["content"]
        assert pasted.endswith("def f():\n    return 1\n\n# end"), pasted
        assert fake_llm.requests[1].messages[-1]["content"].endswith("typed alone")
        await term.expect(PROMPT, after=at)
        term.type("/exit\r")
        async with asyncio.timeout(30):
            assert await term.process.wait() == 0


async def test_lines_typed_together_are_each_their_own_message(
    home: Home, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("Hi, answered."))
    async with terminal(home, "agent") as term:
        at = await term.expect(PROMPT)
        term.type("REPLY hi\r/exit\r")  # typed fast: both lines reach the prompt at once
        async with asyncio.timeout(60):
            assert await term.process.wait() == 0  # /exit was a command of its own
        await term.expect("Hi, answered.\r\n", after=at)  # and the first was answered first
        assert fake_llm.request_count == 1
        assert fake_llm.requests[0].messages[-1]["content"].endswith("REPLY hi")


async def test_a_long_line_arrives_whole_and_a_typo_command_costs_nothing(
    home: Home, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("Got the long one."), Text("Only this one."))
    async with terminal(home, "agent") as term:
        at = await term.expect(PROMPT)
        term.type("x" * 10_000 + "\r")  # typed, not pasted: 2.4 times what canonical mode keeps
        at = await term.expect("Got the long one.", after=at)
        content = fake_llm.requests[0].messages[-1]["content"]
        assert content.endswith("x" * 10_000) and not content.endswith("x" * 10_001), len(content)
        at = await term.expect(PROMPT, after=at)
        term.type("/hlep\r")
        at = await term.expect("Unknown command /hlep: /help lists the commands.", after=at)
        at = await term.expect(PROMPT, after=at)
        term.type("/etc/hosts is a path, not a command\r")
        at = await term.expect("Only this one.", after=at)
        assert fake_llm.request_count == 2  # the typo did not reach it
        await term.expect(PROMPT, after=at)
        term.type("/exit\r")
        async with asyncio.timeout(30):
            assert await term.process.wait() == 0


async def test_under_the_gateway_log_lines_print_above_the_prompt_and_what_was_typed(
    home: Home, fake_llm: FakeLLM
) -> None:
    """`make run`: the gateway logs to the terminal the chat is on."""
    fake_llm.script(Hang())
    home.write_config(home.config.read_text() + "gateway: {shutdown_timeout: 1}\n")
    async with terminal(home, "gateway") as term:
        at = await term.expect("/exit or Ctrl-C stops the whole gateway")
        at = await term.expect(PROMPT, after=at)
        term.type("this will hang\r")
        await fake_llm.wait_for_requests(1, seconds=60)
        term.type("half typed")
        at = await term.expect("half typed", after=at)
        await fake_llm.stop()  # the call in flight fails: the gateway logs its retry
        at = await term.expect("; retry 1/", after=at)
        at = await term.expect("\n", after=at)
        # Below the log line, the prompt is drawn again with what was typed.
        at = await term.expect(f"{PROMPT} half typed", after=at, seconds=30)
        term.type("\x03")  # Ctrl-C stops the gateway, as it does without a prompt
        await term.expect("received SIGINT; shutting down", after=at)
        async with asyncio.timeout(60):
            assert await term.process.wait() == 0


async def agent(home: Home, *args: str) -> asyncio.subprocess.Process:
    """`nanobot agent *args` with its standard streams piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nanobot",
        "agent",
        *args,
        env=home.env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def piped(home: Home, lines: bytes, *args: str) -> tuple[int, str, str]:
    """`nanobot agent *args` fed `lines`: its exit code, stdout and stderr."""
    process = await agent(home, *args)
    stdout, stderr = await asyncio.wait_for(process.communicate(lines), timeout=90)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def test_piped_lines_are_answered_in_order_with_the_chat_commands(
    home: Home, fake_llm: FakeLLM
) -> None:
    fake_llm.chunk_delay = 0.05  # slow enough that a second line would steer a running turn
    fake_llm.script(Text("First answer."), Text("Second answer."))
    code, out, err = await piped(home, b"one\n/help\n/tasks\n\n  \ntwo", "-s", "cli:pipe")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "First answer."
    assert "/status" in out and "/tasks" in out  # /help, as on every channel
    assert "Background tasks run in the gateway only: `nanobot agent` starts none" in out
    assert lines[-1] == "Second answer."  # the last line had no newline: taken whole
    assert fake_llm.request_count == 2  # blank lines are not messages
    second = fake_llm.requests[1].messages
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]


async def test_a_line_over_the_limit_is_refused_whole_not_cut(
    home: Home, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Text("Short one answered."))
    huge = b"x" * (2 * 1024 * 1024)
    code, out, err = await piped(home, huge + b"\nshort\n")
    assert code == 0, err
    assert "Not sent: a message can be at most" in out
    assert out.splitlines()[-1] == "Short one answered.", (out[-300:], err[-2000:])
    assert fake_llm.request_count == 1
    assert fake_llm.requests[0].messages[-1]["content"].endswith("short")


async def test_a_file_as_stdin_is_read_line_by_line(home: Home, fake_llm: FakeLLM) -> None:
    fake_llm.script(Text("First answer."), Text("Second answer."))
    questions = home.root / "questions.txt"
    questions.write_bytes(b"one\n" + b"x" * (1024 * 1024 + 10) + b"\ntwo\n")
    with questions.open("rb") as stdin:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "nanobot",
            "agent",
            env=home.env,
            stdin=stdin,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode == 0, err.decode()[-2000:]
    lines = out.decode().splitlines()
    assert lines[0] == "First answer."
    assert lines[1].startswith("(Not sent: a message can be at most")
    assert lines[-1] == "Second answer."
    assert fake_llm.requests[1].messages[-1]["content"].endswith("two")


async def test_a_line_the_terminal_cut_is_refused_where_replies_go_to_a_file(
    home: Home, fake_llm: FakeLLM
) -> None:
    # stdin a terminal, stdout a file: the terminal is read line by line in its canonical
    # mode, which keeps 4,095 bytes of a line. A cut line is not sent as if it were whole.
    fake_llm.script(Text("Short one answered."))
    replies = home.root / "replies.txt"
    term = await open_terminal(home, "agent", stdout=replies)
    try:
        term.type("x" * 5000 + "\r")
        said = await term.expect("Not sent: the terminal keeps 4,095 bytes of a typed line")
        term.type("short\r")
        await fake_llm.wait_for_requests(1, seconds=60)
        term.type("\x04")  # Ctrl-D: the end of the input
        assert await asyncio.wait_for(term.process.wait(), 60) == 0
    finally:
        if term.process.returncode is None:
            term.process.kill()
            await term.process.wait()
        term.close()
    assert replies.read_text().splitlines()[-1] == "Short one answered."
    assert "Not sent" not in replies.read_text()  # told at the terminal, not in the file
    assert fake_llm.request_count == 1, term.screen[said:]
    assert fake_llm.requests[0].messages[-1]["content"].endswith("short")


async def test_a_turn_cut_off_by_a_crash_is_answered_in_the_next_chat(
    home: Home, fake_llm: FakeLLM
) -> None:
    fake_llm.script(Hang())
    process = await agent(home)
    assert process.stdin is not None
    process.stdin.write(b"what is the answer?\n")
    await process.stdin.drain()
    await fake_llm.wait_for_requests(1, seconds=60)
    process.kill()  # kill -9 mid-turn: the message is in the journal
    await process.wait()
    fake_llm.script(Text("It is 42."))
    code, out, err = await piped(home, b"")  # nothing new: the owed answer comes anyway
    assert code == 0, err
    assert out.splitlines() == ["It is 42."]
    assert fake_llm.request_count == 2


async def test_the_terminal_asks_before_a_command_and_runs_it_on_o(
    home: Home, fake_llm: FakeLLM
) -> None:
    fake_llm.script(
        ToolCalls([Call("exec", {"command": "touch asked-first"}, id="x1")]), Text("Made it.")
    )
    code, out, err = await piped(home, b"make the file\no\n")
    assert code == 0, err
    assert "Approval needed" in out and "touch asked-first" in out
    card = out[out.index("Approval needed") : out.index("Answer: ")]
    assert "**" not in card and "`" not in card, card  # the platforms' Markdown, shown plain
    assert "Answer: [o]nce [c]hat [a]lways [d]eny" in out
    assert "Decided." in out
    assert out.splitlines()[-1] == "Made it."
    assert (home.data_dir / "workspace" / "asked-first").exists()
