"""What the terminal channel reads, one message at a time: the vocabulary both sources share,
and the source for input that is not a person at a terminal (a pipe, a file).

From a pipe every line is a message. A person at a terminal types at a prompt instead
(`_terminal_prompt`). Neither source ever cuts a message: one over `LINE_LIMIT` bytes is
refused whole (`TooLong`).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Protocol

LINE_LIMIT = 1024 * 1024  # bytes of one message; a longer one is refused, not cut


class TooLong(Exception):
    """A message over LINE_LIMIT was read and dropped whole."""


class Input(Protocol):
    async def next(self) -> str | None:
        """The next message (without its final newline), or None at EOF. A pipe's is safe
        to cancel (nothing read is lost); a prompt's ends the prompt, dropping what was
        typed and not sent.

        Raises:
            TooLong: the message was over LINE_LIMIT; it was skipped whole.
        """
        ...

    def close(self) -> None:
        """Stop reading (idempotent)."""
        ...


async def open_lines() -> Input:
    """stdin as messages, one per line."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return _PipeLines(reader)


class _PipeLines:
    """One message per line; the last line may lack its newline."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    async def next(self) -> str | None:
        try:
            raw = await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            raw = exc.partial
            if not raw:
                return None
        except asyncio.LimitOverrunError:
            await self._skip_line()
            raise TooLong from None
        return raw.decode("utf-8", errors="replace").rstrip("\r\n")

    def close(self) -> None:
        pass  # the pipe's transport belongs to the event loop and ends with it

    async def _skip_line(self) -> None:
        while True:
            try:
                await self._reader.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as exc:
                await self._reader.readexactly(exc.consumed)
            except asyncio.IncompleteReadError:
                return
