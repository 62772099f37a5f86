"""The agent's memory: long-term facts and daily notes, kept as files in the workspace.

The agent writes them itself with the file tools (the `memory` skill says how); this module
only knows where they are and shows the current ones to the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, tzinfo
from pathlib import Path

from nanobot.agent._files import same, text_cache
from nanobot.agent.taint import as_data

MEMORY_DIR = "memory"
LONG_TERM_FILE = f"{MEMORY_DIR}/MEMORY.md"


@dataclass(frozen=True, slots=True)
class Note:
    """One memory file as the prompt shows it: `title` names the file (workspace-relative)
    and, for daily notes, the day it belongs to."""

    title: str
    text: str
    file: str = field(default="", compare=False)  # workspace-relative path (what `title` names)


class Memory:
    """`memory/MEMORY.md` (long-term) and `memory/YYYY-MM-DD.md` (daily notes) of a workspace.

    Days are calendar days in `timezone` (the machine's local zone when None), so "today"
    rolls over at midnight where the user lives.
    """

    def __init__(self, workspace: Path, timezone: tzinfo | None = None) -> None:
        self._workspace = workspace
        self._timezone = timezone
        self._files = text_cache(workspace)
        self._long_term = workspace / LONG_TERM_FILE
        self._day: date | None = None
        self._day_paths: tuple[Path, Path] = (self._long_term, self._long_term)
        self._prompt_day: date | None = None
        self._texts: tuple[str | None, ...] = ()
        self._tainted: Mapping[str, str] = {}
        self._prompt = ""

    def daily_path(self, day: date) -> Path:
        return self._workspace / MEMORY_DIR / f"{day.isoformat()}.md"

    def today(self, now: datetime | None = None) -> date:
        """The calendar day of `now` (default: the current time) in the memory's time zone.

        A naive `now` is taken to be in that zone already.
        """
        if now is None:
            now = datetime.now(self._timezone)
        if now.tzinfo is None:
            return now.date()
        return now.astimezone(self._timezone).date()

    def paths(self, day: date) -> tuple[Path, ...]:
        """The files `prompt(day)` shows: long-term memory, `day`'s and the day before's."""
        return (self._long_term, *self._paths(day))

    def notes(self, day: date) -> tuple[Note, ...]:
        """Long-term memory, then `day`'s and the previous day's notes: only the files that
        exist and hold more than whitespace."""
        today, yesterday = self._paths(day)
        files = (
            (LONG_TERM_FILE, self._long_term),
            (f"{self._relative(today)} (today)", today),
            (f"{self._relative(yesterday)} (yesterday)", yesterday),
        )
        notes = []
        for title, path in files:
            text = self._files.get(path)
            if text is not None and text.strip():
                notes.append(Note(title, text.strip(), self._relative(path)))
        return tuple(notes)

    def prompt(self, day: date, tainted: Mapping[str, str] | None = None) -> str:
        """The notes of `notes(day)` as prompt sections, each headed by its title; "" when
        there are none. A note whose file `tainted` names (workspace-relative path → where
        its content came from) is shown as data (`taint.as_data`). Returns the same object
        while no file changed and `day` and `tainted` are the same.
        """
        tainted = tainted or {}
        today, yesterday = self._paths(day)
        texts = (
            self._files.get(self._long_term),
            self._files.get(today),
            self._files.get(yesterday),
        )
        if day == self._prompt_day and same(texts, self._texts) and tainted == self._tainted:
            return self._prompt
        # `notes` reads the same cached objects, so this costs three more stat() calls, and
        # only when something changed.
        rendered = "\n\n".join(
            f"## {note.title}\n\n{as_data(note.file, note.text, tainted)}"
            for note in self.notes(day)
        )
        self._prompt_day, self._texts, self._tainted = day, texts, dict(tainted)
        if rendered != self._prompt:
            self._prompt = rendered
        return self._prompt

    def _paths(self, day: date) -> tuple[Path, Path]:
        if day != self._day:
            self._day = day
            self._day_paths = (self.daily_path(day), self.daily_path(day - timedelta(days=1)))
        return self._day_paths

    def _relative(self, path: Path) -> str:
        return path.relative_to(self._workspace).as_posix()
