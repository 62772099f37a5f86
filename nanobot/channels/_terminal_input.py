"""What the terminal channel reads, one message at a time: the vocabulary both sources share,
and the source for input that is not a person at a terminal (a pipe, a file).

From a pipe every line is a message. A person at a terminal types at a prompt instead
(`_terminal_prompt`). Neither source ever cuts a message: one over `LINE_LIMIT` bytes is
refused whole (`TooLong`).
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from typing import BinaryIO, Protocol

LINE_LIMIT = 1024 * 1024  # bytes of one message; a longer one is refused, not cut
# A terminal in canonical mode (stdin a terminal read line by line, as when stdout is not
# one) keeps this many bytes of a line and drops the rest of it: a line this long was cut.
CANONICAL_LIMIT = 4095


class TooLong(Exception):
    """A message over LINE_LIMIT was read and dropped whole; `str()` says so, to its sender."""

    def __init__(self, notice: str = f"a message can be at most {LINE_LIMIT:,} bytes") -> None:
        super().__init__(notice)


CUT_BY_THE_TERMINAL = (
    f"the terminal keeps {CANONICAL_LIMIT:,} bytes of a typed line, and this one reached that, "
    "so its end was lost; put long text in a file in the workspace and ask me to read it, "
    "or run with the output on the terminal too, where lines of any length are taken"
)


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
    """stdin as messages, one per line (from a terminal, each at most CANONICAL_LIMIT
    bytes: one that reached it is refused, `TooLong`, as the terminal cut it)."""
    if stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode):
        # `nanobot agent < questions.txt`: the event loop watches pipes and sockets, not files.
        return _FileLines(sys.stdin.buffer)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return _PipeLines(reader, terminal=sys.stdin.isatty())


class _FileLines:
    """One message per line of a regular file, each read in a thread (a file never blocks
    for long, but a slow disk must not hold the event loop)."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    async def next(self) -> str | None:
        raw = await asyncio.to_thread(self._file.readline, LINE_LIMIT + 1)
        if not raw:
            return None
        if len(raw) > LINE_LIMIT and not raw.endswith(b"\n"):
            while (rest := await asyncio.to_thread(self._file.readline, 1 << 16)) and not (
                rest.endswith(b"\n")
            ):
                pass
            raise TooLong
        return raw.rstrip(b"\r\n").decode("utf-8", errors="replace")

    def close(self) -> None:
        pass  # stdin stays open: it is the process's own


class _PipeLines:
    """One message per line; the last line may lack its newline. `terminal`: the lines
    come from a terminal's canonical mode, which cuts them at CANONICAL_LIMIT bytes."""

    def __init__(self, reader: asyncio.StreamReader, *, terminal: bool = False) -> None:
        self._reader = reader
        self._terminal = terminal

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
        line = raw.rstrip(b"\r\n")
        if self._terminal and len(line) >= CANONICAL_LIMIT:
            raise TooLong(CUT_BY_THE_TERMINAL)
        return line.decode("utf-8", errors="replace")

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
