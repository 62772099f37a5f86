"""The terminal channel: a line-based chat on stdin/stdout."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

from nanobot.errors import ProviderError

Ask = Callable[[str, str], Awaitable[str]]
EXIT_COMMANDS = frozenset({"/exit", "/quit", ":q"})


async def _stdin_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def chat(ask: Ask, session_key: str) -> None:
    """Read lines, answer each through `ask(session_key, text)`, until EOF or /exit.

    Reading never blocks the event loop, so cancelling this coroutine stops it at once.
    A model failure is shown as one line and the chat goes on.
    """
    reader = await _stdin_reader()
    prompt = "you> " if sys.stdin.isatty() else ""
    while True:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        raw = await reader.readline()
        if not raw:
            return
        text = raw.decode("utf-8", errors="replace").strip()
        if not text:
            continue
        if text in EXIT_COMMANDS:
            return
        try:
            reply = await ask(session_key, text)
        except ProviderError as exc:
            reply = f"[{exc.user_message()}]"
        sys.stdout.write(f"nanobot> {reply}\n" if prompt else f"{reply}\n")
        sys.stdout.flush()
