"""Helpers of ``bench/gateway_throughput.py``: its child processes and what it reads of them.

``python -m bench._gateway telegram``: a FakeTelegram (tests/fakes/telegram.py) in a process
of its own, driven by JSON lines on stdin, one JSON answer line each on stdout. Injecting the
messages and timing the replies happen next to the fake, so neither HTTP polling nor the
benchmark's own event loop is part of what is measured:

- ``{"op": "burst", "chats": [...], "text", "final", "timeout", "timeline"?}``: one message
  in each chat, all queued in the same instant (one getUpdates answer takes up to 100 of
  them); answers when every chat has received ``final`` or on timeout (with ``timeline``:
  and lists every bot message sent or edited, with its time).
- ``{"op": "sequence", "chat", "texts": [...], "final", "pause", "timeout"}``: one message
  at a time, the next ``pause`` seconds after the previous reply was final (``final`` null:
  the reply must repeat the message's text).

A reply counts as delivered at the arrival of the Bot API request (``sendMessage`` or
``editMessageText``) that makes the chat show the final text: the fake's ``ApiCall.at``,
``time.monotonic()``, one clock for every process on Linux. After each burst the fake's
chats are checked to show that text. The first bot message of a chat (a streamed reply's
first words) is timed the same way.

``python -m bench._gateway echo-bot URL``: the baseline, a bare python-telegram-bot echo bot
polling the fake at URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from bench._common import BenchError
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram

JSON = dict[str, Any]
POLL_TIMEOUT = 30  # seconds a getUpdates long poll is held: nanobot's value too
REPLY_METHODS = frozenset({"sendmessage", "editmessagetext"})
LINE_LIMIT = 1 << 26  # a burst's answer lists every chat


# ---- in the fake Telegram's process ------------------------------------------------------


@dataclass
class _Tracker:
    """Watches the fake's request log from now on for the replies of some chats."""

    fake: FakeTelegram
    final: dict[int, str]  # chat -> the text its reply must end up showing
    index: int = 0
    first: dict[int, float] = field(default_factory=dict)
    done: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.index = len(self.fake.requests)
        self.start = self.index

    def scan(self) -> bool:
        """Read the requests that arrived since the last scan; True when all are final."""
        requests = self.fake.requests
        for call in requests[self.index :]:
            if call.method.lower() not in REPLY_METHODS:
                continue
            chat = int(call.params.get("chat_id", 0))
            if chat not in self.final or chat in self.done:
                continue
            self.first.setdefault(chat, call.at)
            if str(call.params.get("text")) == self.final[chat]:
                self.done[chat] = call.at
        self.index = len(requests)
        return len(self.done) == len(self.final)

    async def wait(self, seconds: float) -> bool:
        try:
            await self.fake.wait_for(self.scan, seconds)
        except TimeoutError:
            return False
        return True

    def report(self, injected_at: float, last_update: int) -> JSON:
        calls = self.fake.requests[self.start :]
        taken = next(
            (
                c.at
                for c in calls
                if c.method.lower() == "getupdates"
                and int(c.params.get("offset") or 0) > last_update
            ),
            None,
        )
        sends = Counter(
            int(c.params.get("chat_id", 0)) for c in calls if c.method.lower() == "sendmessage"
        )
        shown = {(m.chat_id, m.visible) for m in self.fake.sent() if m.chat_id in self.final}
        return {
            "injected_at": injected_at,
            "taken_at": taken,  # the getUpdates that acknowledged the last message
            "first": {str(k): v for k, v in self.first.items()},
            "final": {str(k): v for k, v in self.done.items()},
            "verified": sum((chat, text) in shown for chat, text in self.final.items()),
            "chats_with_two_messages": sum(1 for chat in self.final if sends[chat] >= 2),
            "api_calls": dict(Counter(c.method for c in calls)),
        }

    def timeline(self, injected_at: float) -> list[tuple[float, str, int]]:
        """(seconds since injection, method, chat) of every bot message sent or edited."""
        return [
            (c.at - injected_at, c.method, int(c.params.get("chat_id", 0)))
            for c in self.fake.requests[self.start :]
            if c.method.lower() in REPLY_METHODS
        ]


async def _burst(fake: FakeTelegram, command: JSON) -> JSON:
    chats = [int(c) for c in command["chats"]]
    tracker = _Tracker(fake, dict.fromkeys(chats, str(command["final"])))
    injected_at = time.monotonic()
    last = 0
    for chat in chats:
        last = fake.user_message(chat, str(command["text"]), user_id=chat)
    complete = await tracker.wait(float(command["timeout"]))
    answer = tracker.report(injected_at, last) | {"complete": complete}
    if command.get("timeline"):
        answer["timeline"] = tracker.timeline(injected_at)
    return answer


async def _sequence(fake: FakeTelegram, command: JSON) -> JSON:
    chat = int(command["chat"])
    firsts: list[float] = []
    finals: list[float] = []
    for text in command["texts"]:
        final = str(text if command["final"] is None else command["final"])
        tracker = _Tracker(fake, {chat: final})
        injected_at = time.monotonic()
        fake.user_message(chat, str(text), user_id=chat)
        if not await tracker.wait(float(command["timeout"])):
            return {"complete": False, "first": firsts, "final": finals, "stuck_on": text}
        firsts.append(tracker.first[chat] - injected_at)
        finals.append(tracker.done[chat] - injected_at)
        await asyncio.sleep(float(command["pause"]))
    return {"complete": True, "first": firsts, "final": finals}


async def _host() -> None:
    async with FakeTelegram(token=DEFAULT_TOKEN) as fake:
        print(json.dumps({"base_url": fake.base_url}), flush=True)
        while line := await asyncio.to_thread(sys.stdin.readline):
            command: JSON = json.loads(line)
            match command["op"]:
                case "burst":
                    answer = await _burst(fake, command)
                case "sequence":
                    answer = await _sequence(fake, command)
                case op:
                    answer = {"error": f"unknown op {op!r}"}
            print(json.dumps(answer), flush=True)


def _echo_bot(base_url: str) -> None:
    """The baseline: PTB's Application, one MessageHandler replying with the message's text."""
    from telegram import Update
    from telegram.ext import Application, ContextTypes, MessageHandler, filters

    async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        if message is not None and message.text is not None:
            await message.reply_text(message.text)

    app = (
        Application.builder()
        .token(DEFAULT_TOKEN)
        .base_url(f"{base_url}/bot")
        .base_file_url(f"{base_url}/file/bot")
        .build()
    )
    app.add_handler(MessageHandler(filters.TEXT, echo))
    print("echo bot polling", flush=True)
    app.run_polling(poll_interval=0, timeout=POLL_TIMEOUT, allowed_updates=[Update.MESSAGE])


# ---- in the benchmark's process ----------------------------------------------------------


class Child:
    """A child process of the benchmark: reads its stdout lines, stderr goes to a file."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, log: Path) -> None:
        self.name = name
        self.process = process
        self.log = log

    @classmethod
    async def start(
        cls, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path
    ) -> Self:
        with log.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=dict(env),
                cwd=cwd,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                limit=LINE_LIMIT,
            )
        return cls(name, process, log)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def line(self, seconds: float) -> str:
        """The next stdout line (stripped); BenchError if it ends or takes too long."""
        assert self.process.stdout is not None
        try:
            async with asyncio.timeout(seconds):
                raw = await self.process.stdout.readline()
        except TimeoutError:
            raise BenchError(f"{self.name}: no answer in {seconds:g} s{self.tail()}") from None
        if not raw:
            raise BenchError(f"{self.name} exited (code {self.process.returncode}){self.tail()}")
        return raw.decode().strip()

    async def ask(self, command: JSON, seconds: float) -> JSON:
        """Send one JSON command line and return the JSON answer line."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command).encode() + b"\n")
        await self.process.stdin.drain()
        answer: JSON = json.loads(await self.line(seconds))
        if "error" in answer:
            raise BenchError(f"{self.name}: {answer['error']}")
        return answer

    async def stop(self) -> None:
        """SIGTERM (and closed stdin); SIGKILL after 10 s."""
        if self.process.returncode is None:
            if self.process.stdin is not None:
                self.process.stdin.close()
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(10):
                    await self.process.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()

    def tail(self) -> str:
        """The end of its stderr, as a paragraph of an error message ('' if none)."""
        with contextlib.suppress(OSError):
            text = self.log.read_text(encoding="utf-8", errors="replace")[-2000:]
            return f"\nstderr (tail):\n{text}" if text else ""
        return ""


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise BenchError(f"no {key} for process {pid}")


def rss_kib(pid: int) -> int:
    """The process's resident set now (VmRSS)."""
    return _status_kib(pid, "VmRSS")


def hwm_kib(pid: int) -> int:
    """The process's peak resident set so far (VmHWM)."""
    return _status_kib(pid, "VmHWM")


def descendants(pid: int) -> list[int]:
    """The process's children, their children and so on, now (parents read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                text = (entry / "stat").read_text(encoding="utf-8")
                parent = int(text[text.rindex(")") + 2 :].split()[1])  # after "pid (comm) S"
                children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        kids = children.get(stack.pop(), [])
        found += kids
        stack += kids
    return found


def tree_rss_kib(pid: int) -> int:
    """VmRSS summed over the process and its descendants (one that ends meanwhile: 0)."""
    total = rss_kib(pid)
    for child in descendants(pid):
        with contextlib.suppress(OSError, BenchError):
            total += rss_kib(child)
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """Samples a process's VmRSS every ``interval`` seconds while in the ``async with``."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.before = 0
        self.peak = 0
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_kib(self.pid))
            self.samples += 1
            await asyncio.sleep(self.interval)

    async def __aenter__(self) -> Self:
        self.before = self.peak = rss_kib(self.pid)
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.peak = max(self.peak, rss_kib(self.pid))


def main(argv: Sequence[str]) -> None:
    match list(argv):
        case ["telegram"]:
            asyncio.run(_host())
        case ["echo-bot", base_url]:
            _echo_bot(base_url)
        case _:
            raise SystemExit("usage: python -m bench._gateway telegram | echo-bot URL")


if __name__ == "__main__":
    main(sys.argv[1:])
