"""How much of the workspace's prompt files and memory goes into the system prompt.

The prompt is sent with every model call, and the agent can write these files without end (a
command once wrote a 60 MB `memory/MEMORY.md`, and each request carried it). Each file gets at
most `file_chars` characters, and all of them together `total_chars`, in prompt order; what
does not fit is cut at a line where one is near, and the model is told what was cut and how
to read the rest. Pure: the callers read the files and log.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MIN_ROOM = 200  # below this many characters left, a file is left out rather than shown cut


@dataclass(frozen=True, slots=True)
class Cut:
    """A file the prompt shows only part of: `shown` of its characters (0: left out), and
    its size in bytes on disk."""

    title: str
    shown: int
    size: int


@dataclass(frozen=True, slots=True)
class PromptBudget:
    """Characters of the prompt files and memory the system prompt may hold: per file, and
    for all of them together (`agent.prompt_file_chars`, `agent.prompt_total_chars`)."""

    file_chars: int = 20_000
    total_chars: int = 60_000

    def read_bytes(self) -> int:
        """Bytes of a file worth reading: enough for `file_chars` characters of UTF-8 and one
        more, so that a longer file is seen to be longer without reading all of it."""
        return 4 * self.file_chars + 4

    def fit(self, path: str, text: str, room: int, size: int) -> tuple[str, Cut | None]:
        """`text` (the start of the file at workspace-relative `path`, `size` bytes on disk)
        as the prompt shows it with `room` characters left of the total: whole, or cut to
        fit with a note for the model saying what was cut and how to read the rest (the
        note is not counted). Returns the text and, if it was cut, what was."""
        limit = min(self.file_chars, room)
        if len(text) <= limit:
            return text, None
        if limit < MIN_ROOM:
            note = (
                f"[{path} ({size:,} bytes) is left out: the prompt's files already take the "
                f"{self.total_chars:,} characters they may. Read it with read_file when you "
                "need it.]"
            )
            return note, Cut(path, 0, size)
        shown = text[:limit]
        line_end = shown.rfind("\n", limit // 2)
        if line_end >= 0:
            shown = shown[:line_end]
            where = f"lines 1-{shown.count(chr(10)) + 1}; read on with start_line "
            where += str(shown.count("\n") + 2)
        else:  # one very long line: cut inside it
            line = shown.count("\n") + 1
            where = f"up to part of line {line}; read it with start_line {line}"
        note = (
            f"[{path} is cut here: it is {size:,} bytes, and the prompt shows its first "
            f"{len(shown):,} characters ({where}). Read the rest with read_file when you need "
            "it, and keep this file short: it is sent with every message.]"
        )
        return f"{shown.rstrip()}\n\n{note}", Cut(path, len(shown), size)


def warning(cuts: Iterable[Cut], budget: PromptBudget) -> str | None:
    """The log line for files the prompt cuts; None when it cuts none."""
    parts = [
        f"{cut.title} ({cut.size:,} bytes): "
        + (f"the first {cut.shown:,} characters" if cut.shown else "left out")
        for cut in cuts
    ]
    if not parts:
        return None
    return (
        f"The system prompt shows only part of {'; '.join(parts)} (at most "
        f"{budget.file_chars:,} characters a file, agent.prompt_file_chars, and "
        f"{budget.total_chars:,} in all, agent.prompt_total_chars); the model is told how "
        "to read the rest"
    )
