"""What the terminal channel reads: one message at a time, from a pipe or from a terminal.

From a pipe every line is a message. From a terminal (canonical mode: the kernel does the line
editing and hands over whole lines) the lines that arrive together are one message, joined by
newlines: a multi-line paste reaches the terminal in one burst, while a person typing needs far
longer than `PASTE_SETTLE` between one Enter and the next. Neither source ever cuts a message:
one over `LINE_LIMIT` bytes is refused whole (`TooLong`). A terminal in canonical mode keeps
at most `TTY_LINE` bytes of a line and drops what is typed or pasted beyond them, so a line
that long was cut by the kernel: the message is refused whole too (`TerminalCut`), and the
person told how to send long text.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import sys
import termios
from typing import Protocol

LINE_LIMIT = 1024 * 1024  # bytes of one message; a longer one is refused, not cut
# Lines that complete within this long of each other came in one burst (a paste). A paste
# larger than the terminal's 4 KiB line buffer reaches us in several kernel chunks a moment
# apart, which this also covers; no one types a line and Enter in 30 ms.
PASTE_SETTLE = 0.03
TTY_LINE = 4095  # bytes of a line the kernel's canonical mode keeps (its 4 KiB buffer, less \n)


class TooLong(Exception):
    """A message over LINE_LIMIT was read and dropped whole."""


class TerminalCut(TooLong):
    """A line reached the terminal's own limit (`TTY_LINE`): the kernel dropped the rest
    before nanobot could read it, so the message was refused whole rather than sent cut."""


class Input(Protocol):
    async def next(self) -> str | None:
        """The next message (without its final newline), or None at EOF. Safe to cancel:
        nothing read is lost.

        Raises:
            TooLong: the message was over LINE_LIMIT; it was skipped whole.
            TerminalCut: a line of it reached the terminal's limit; skipped whole.
        """
        ...

    def close(self) -> None:
        """Stop reading (idempotent)."""
        ...


async def open_input(*, interactive: bool) -> Input:
    """stdin as messages: a terminal's bursts when `interactive`, else one per line."""
    if interactive:
        return _TerminalBursts(sys.stdin.fileno())
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


class _TerminalBursts:
    """The lines a terminal delivers, grouped by arrival: each burst is one message.

    Reads the descriptor directly when the event loop says it is readable, taking only what
    the kernel already holds (FIONREAD), so the descriptor stays blocking as the shell left
    it. A burst is handed over once no further line has completed for PASTE_SETTLE.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._messages: asyncio.Queue[bytes | TooLong | None] = asyncio.Queue()
        self._partial = b""  # the start of a line ended by Ctrl-D instead of Enter
        self._burst: list[bytes] = []
        self._size = 0  # bytes of the burst, counted on after it passes LINE_LIMIT
        self._cut = False  # a line of the burst reached TTY_LINE: the kernel cut it
        self._flush: asyncio.TimerHandle | None = None
        self._loop.add_reader(fd, self._on_readable)

    async def next(self) -> str | None:
        item = await self._messages.get()
        if item is None:
            self._messages.put_nowait(None)  # EOF stays EOF for every later call
            return None
        if isinstance(item, TooLong):
            raise item
        return item.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        self._loop.remove_reader(self._fd)

    def _on_readable(self) -> None:
        data, eof = self._read_available()
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self._cut = self._cut or len(line) >= TTY_LINE
            if self._size <= LINE_LIMIT:  # past it the burst is refused: stop keeping it
                self._burst.append(line.rstrip(b"\r"))
            self._size += len(line) + 1
        if eof:
            self._at_eof()
        elif lines:
            if self._flush is not None:
                self._flush.cancel()
            self._flush = self._loop.call_later(PASTE_SETTLE, self._hand_over)

    def _read_available(self) -> tuple[bytes, bool]:
        """Everything the kernel holds now (at least one read: the loop said readable), and
        whether input ended (Ctrl-D at the start of a line, or the terminal went away)."""
        chunks: list[bytes] = []
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:  # someone made the descriptor non-blocking: all read
                return b"".join(chunks), False
            except OSError:  # EIO: the terminal hung up
                return b"".join(chunks), True
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)
            if not _pending(self._fd):
                return b"".join(chunks), False

    def _hand_over(self) -> None:
        self._flush = None
        if self._size > LINE_LIMIT:
            self._messages.put_nowait(TooLong())
        elif self._cut:
            self._messages.put_nowait(TerminalCut())
        elif self._burst:
            self._messages.put_nowait(b"\n".join(self._burst))
        self._burst, self._size, self._cut = [], 0, False

    def _at_eof(self) -> None:
        self.close()
        if self._partial:  # Ctrl-D after some text, then at the start: that text is a line
            self._burst.append(self._partial)
            self._size += len(self._partial)
            self._partial = b""
        self._hand_over()
        self._messages.put_nowait(None)


def _pending(fd: int) -> int:
    """Bytes the terminal can hand over without waiting (in canonical mode: whole lines)."""
    try:
        raw = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    count: int = struct.unpack("i", raw)[0]
    return count
