"""The prompt a person types at (prompt_toolkit): the terminal channel's input and output
while stdin and stdout are a terminal. Imported only then: prompt_toolkit costs start-up time
that the other commands need not pay.

The terminal is read in raw mode, so the limit of its canonical mode (the kernel keeps 4,095
bytes of a line and drops the rest) never applies: a line arrives whole, however long.
Terminals mark a paste (bracketed paste), so a paste is taken as one piece, newlines kept,
and Enter sends it like a typed line; typed lines are sent one by one as typed, also when
they arrive together (prompt_toolkit keeps what followed an Enter for the next prompt).

Everything printed goes above the prompt, which stays on the last line with what was typed:
the channel's own text through `write`, and whatever else is written to `sys.stdout` or
`sys.stderr` while the prompt is open (log lines: nanobot.log's stderr sink writes to the
`sys.stderr` of the moment) through prompt_toolkit's `patch_stdout`, which erases the
prompt, prints, and draws the prompt again. A line not yet ended (a reply streaming in) is
shown above the prompt, as part of it, until it ends; then it is printed like the rest.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import ExitStack
from typing import TextIO

from prompt_toolkit import PromptSession
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.patch_stdout import patch_stdout
from prompt_toolkit.utils import get_cwidth

from nanobot.channels._terminal_input import LINE_LIMIT, TooLong

PREVIEW = 80  # characters of a refused message shown where it was typed


class Prompt:
    """`prompt` on the terminal's last line, from construction until `close` (an `Input`).

    `on_interrupt` is called for Ctrl-C, after what was typed is dropped (as a shell
    does): in raw mode the terminal sends no SIGINT for it. Not thread-safe: the event
    loop's thread only.
    """

    def __init__(self, prompt: str, *, on_interrupt: Callable[[], None]) -> None:
        self._prompt = prompt
        self._tail = ""  # the end of what was written that is not a whole line yet
        self._closed = False
        self._ended = False
        bindings = KeyBindings()

        @bindings.add("c-c")
        def _interrupt(event: KeyPressEvent) -> None:
            event.current_buffer.reset()
            on_interrupt()

        self._session: PromptSession[str] = PromptSession(
            self._message,
            key_bindings=bindings,
            enable_suspend=True,  # Ctrl-Z suspends, as without the prompt
            # A message sent is printed above like everything else (`next`), so that what
            # scrolls up is only ever what was printed: no streamed line shown twice.
            erase_when_done=True,
        )
        self._patch = ExitStack()
        self._patch.enter_context(patch_stdout())
        self._above: TextIO = sys.stdout  # patch_stdout's proxy: it prints above the prompt

    async def next(self) -> str | None:
        """What was typed or pasted up to Enter, or None at Ctrl-D on an empty line.
        Cancelling it ends this prompt: what was typed and not sent is dropped.

        Raises:
            TooLong: the message was over LINE_LIMIT bytes; it was dropped whole.
        """
        if self._ended:
            return None
        try:
            # SIGINT stays with whoever handles it (the channel, or the gateway): prompt_toolkit
            # would take it over and, after each prompt, remove the handler.
            text = await self._session.prompt_async(handle_sigint=False)
        except EOFError:  # Ctrl-D on an empty line, or `end`
            return None
        # Bytes that are not UTF-8 come as surrogate escapes; replaced, as from a pipe.
        raw = text.encode("utf-8", "surrogateescape")
        too_long = len(raw) > LINE_LIMIT
        text = raw.decode("utf-8", "replace")
        shown = f"{text[:PREVIEW]}…" if too_long else text
        # Where it was typed, on a line of its own: a line still streaming stays as it is.
        self._above.write(f"{self._prompt}{shown}\n")
        if too_long:
            raise TooLong
        return text

    def end(self) -> None:
        """The person is leaving: `next` returns None, the one running now too."""
        self._ended = True
        if self._session.app.is_running:
            self._session.app.exit(exception=EOFError())

    def write(self, text: str) -> None:
        """`text` above the prompt: its whole lines at once, the rest when its line ends
        (shown above the prompt, as part of it, until then)."""
        text = self._tail + text
        end = text.rfind("\n") + 1
        self._tail = text[end:]
        if end:
            self._above.write(text[:end])
        self._session.app.invalidate()  # (nothing to draw while no prompt runs)

    def close(self) -> None:
        """Stop: `sys.stdout` and `sys.stderr` are the terminal's own again, with everything
        written so far printed; a line not yet ended is printed as far as it goes, for what
        is written next to continue it. Call it when no `next` runs (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._tail:
            self._above.write(self._tail)
            self._above.flush()
            self._tail = ""
        self._patch.close()  # waits until the proxy has written all it was given

    def _message(self) -> str:
        if not self._tail:
            return self._prompt
        size = self._session.app.output.get_size()
        # The part of the prompt above its last line does not wrap: cut it as the terminal
        # would, keeping the last rows when it is taller than the screen.
        rows = _rows(self._tail, size.columns)[-max(1, size.rows - 2) :]
        return "\n".join([*rows, self._prompt])


def _rows(line: str, width: int) -> list[str]:
    """`line` in rows of at most `width` cells (a wide character takes two)."""
    rows: list[str] = []
    row: list[str] = []
    used = 0
    for char in line:
        cells = get_cwidth(char)
        if row and used + cells > width:
            rows.append("".join(row))
            row, used = [], 0
        row.append(char)
        used += cells
    rows.append("".join(row))
    return rows
