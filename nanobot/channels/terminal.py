"""The terminal channel: an interactive chat on stdin/stdout through the agent loop.

In a terminal, replies stream as they are written, each tool call shows as one short line,
Ctrl-C stops the running turn (twice at the prompt quits), and a line typed while a turn
runs steers it. With piped input each line is a separate message answered in order, and
only final replies are printed, so scripts get clean output.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import TextIO

from nanobot.agent.loop import AgentLoop, Reply, TurnRequest
from nanobot.agent.run import RunEvent

EXIT_COMMANDS = frozenset({"/exit", "/quit"})
HELP = "Commands: /new starts a fresh session, /stop stops the turn, /exit quits. Ctrl-C stops."


class _Printer:
    """Streams one turn's events to the terminal."""

    def __init__(self, out: TextIO, *, live: bool) -> None:
        self._out = out
        self._live = live
        self.streamed = False
        self._line_open = False

    def __call__(self, event: RunEvent) -> None:
        if not self._live:
            return
        if event.kind == "message_update" and event.text:
            self._write(event.text)
            self.streamed = self._line_open = True
        elif event.kind == "tool_start" and event.tool_call is not None:
            self._end_line()
            call = event.tool_call
            self._write(f"  · {call.name}({_short(call.arguments)})\n")
        elif event.kind == "message_end":
            self._end_line()

    async def message(self, text: str) -> None:
        """Show a message the agent sent mid-turn (the message tool)."""
        self._end_line()
        self._write(f"{text}\n")

    def reply(self, reply: Reply | None) -> None:
        if reply is None:
            return
        self._end_line()
        failed = reply.result.status != "completed"
        if reply.text and (failed or not self.streamed or not self._live):
            self._write(f"[{reply.text}]\n" if failed and self._live else f"{reply.text}\n")

    def _end_line(self) -> None:
        if self._line_open:
            self._write("\n")
            self._line_open = False

    def _write(self, text: str) -> None:
        self._out.write(text)
        self._out.flush()


def _short(arguments: str, limit: int = 60) -> str:
    flat = " ".join(arguments.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


async def chat(loop: AgentLoop, session_key: str, *, own_interrupts: bool = True) -> None:
    """Chat until EOF, /exit or a second Ctrl-C at the prompt. May be cancelled.

    With `own_interrupts` False (inside the gateway, which handles SIGINT itself) Ctrl-C is
    left alone.
    """
    await _Chat(loop, session_key, await _stdin_reader()).run(own_interrupts=own_interrupts)


class _Chat:
    def __init__(self, loop: AgentLoop, session_key: str, reader: asyncio.StreamReader) -> None:
        self.loop, self.session_key, self.reader = loop, session_key, reader
        self.interactive = sys.stdin.isatty()
        self.live = sys.stdout.isatty()
        self.prompt = "you> " if self.interactive else ""
        self.running: set[asyncio.Task[None]] = set()
        self.interrupts = 0
        self.quit_now = asyncio.Event()

    async def run(self, *, own_interrupts: bool) -> None:
        event_loop = asyncio.get_running_loop()
        own_interrupts = own_interrupts and self.interactive
        if own_interrupts:
            event_loop.add_signal_handler(signal.SIGINT, self.on_interrupt)
        if self.interactive:
            sys.stdout.write(f"nanobot — session {self.session_key}. {HELP}\n")
        try:
            async with asyncio.TaskGroup() as group:
                await self._read_lines(group)
                if self.quit_now.is_set():
                    for task in self.running:
                        task.cancel()
        finally:
            if own_interrupts:
                event_loop.remove_signal_handler(signal.SIGINT)

    async def _read_lines(self, group: asyncio.TaskGroup) -> None:
        self.show_prompt()
        while not self.quit_now.is_set():
            line = await _read_line(self.reader, self.quit_now)
            if line is None or line in EXIT_COMMANDS:
                return
            self.interrupts = 0
            if line == "/new":
                await self.loop.new_session(self.session_key)
                sys.stdout.write("Started a new session.\n")
            elif line == "/stop":
                self.loop.abort(self.session_key)
            elif line:
                await self._start_turn(group, line)
                continue
            if not self.running:
                self.show_prompt()

    async def _start_turn(self, group: asyncio.TaskGroup, line: str) -> None:
        printer = _Printer(sys.stdout, live=self.live)
        request = TurnRequest(self.session_key, line, listener=printer, send=printer.message)
        task = group.create_task(_answer(self.loop, request, printer), name="terminal-turn")
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        if not self.interactive:
            await task  # piped lines are separate messages, answered in order
            return
        # A line typed while this turn runs steers it; the prompt comes back after.
        task.add_done_callback(self.show_prompt)

    def show_prompt(self, _: object = None) -> None:
        if not self.quit_now.is_set():
            sys.stdout.write(self.prompt)
            sys.stdout.flush()

    def on_interrupt(self) -> None:
        if self.running and self.loop.abort(self.session_key):
            return
        self.interrupts += 1
        if self.interrupts >= 2:
            self.quit_now.set()
        else:
            sys.stdout.write("\n(Ctrl-C again or /exit to quit)\n")
            self.show_prompt()


async def _answer(loop: AgentLoop, request: TurnRequest, printer: _Printer) -> None:
    printer.reply(await loop.handle(request))


async def _read_line(reader: asyncio.StreamReader, quit_now: asyncio.Event) -> str | None:
    line = asyncio.ensure_future(reader.readline())
    stop = asyncio.ensure_future(quit_now.wait())
    try:
        await asyncio.wait({line, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not line.done():
            line.cancel()
    if not line.done() or line.cancelled():
        return None
    raw = line.result()
    return raw.decode("utf-8", errors="replace").strip() if raw else None


async def _stdin_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader
