"""The agent's memory: long-term facts and daily notes, kept as files in the workspace.

The agent writes them itself with the file tools (the `memory` skill says how); this module
only knows where they are and shows the current ones to the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from pathlib import Path

from nanobot.agent._files import same, size, text_cache
from nanobot.agent.prompt_budget import Cut, PromptBudget
from nanobot.agent.taint import as_data

MEMORY_DIR = "memory"
LONG_TERM_FILE = f"{MEMORY_DIR}/MEMORY.md"


@dataclass(frozen=True, slots=True)
class Note:
    """One memory file as the prompt shows it: `title` names the file (workspace-relative)
    and, for daily notes, the day it belongs to."""

    title: str
    text: str


class Memory:
    """`memory/MEMORY.md` (long-term) and `memory/YYYY-MM-DD.md` (daily notes) of a workspace.

    Days are calendar days in `timezone` (the machine's local zone when None), so "today"
    rolls over at midnight where the user lives.
    """

    def __init__(
        self,
        workspace: Path,
        timezone: tzinfo | None = None,
        *,
        budget: PromptBudget | None = None,
    ) -> None:
        """`budget` bounds what of the files the prompt shows (see `prompt_within`)."""
        self._workspace = workspace
        self._timezone = timezone
        self._budget = budget if budget is not None else PromptBudget()
        self._files = text_cache(workspace, max_bytes=self._budget.read_bytes())
        self._long_term = workspace / LONG_TERM_FILE
        self._day: date | None = None
        self._day_paths: tuple[Path, Path] = (self._long_term, self._long_term)
        self._prompt_key: tuple[date, int] | None = None
        self._texts: tuple[str | None, ...] = ()
        self._tainted: Mapping[str, str] = {}
        self._prompt = ""
        self._cuts: tuple[Cut, ...] = ()

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
        exist and hold more than whitespace (of a long file, its start: see `PromptBudget`)."""
        return tuple(note for note, _ in self._notes(day))

    def _notes(self, day: date) -> list[tuple[Note, Path]]:
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
                notes.append((Note(title, text.strip()), path))
        return notes

    def prompt(self, day: date, tainted: Mapping[str, str] | None = None) -> str:
        """The notes of `notes(day)` as prompt sections, each headed by its title; "" when
        there are none. A note whose file `tainted` names (workspace-relative path → where
        its content came from) is shown as data (`taint.as_data`). Returns the same object
        while no file changed and `day` and `tainted` are the same.
        """
        return self.prompt_within(day, self._budget.total_chars, tainted)[0]

    def prompt_within(
        self, day: date, room: int, tainted: Mapping[str, str] | None = None
    ) -> tuple[str, tuple[Cut, ...]]:
        """`prompt(day)` with at most `room` characters of the files (and each within the
        budget's `file_chars`), and the files it cut. The same objects while no file, nor
        `day`, nor `room`, nor `tainted` changed."""
        tainted = tainted or {}
        today, yesterday = self._paths(day)
        texts = (
            self._files.get(self._long_term),
            self._files.get(today),
            self._files.get(yesterday),
        )
        if (
            (day, room) == self._prompt_key
            and same(texts, self._texts)
            and tainted == self._tainted
        ):
            return self._prompt, self._cuts
        # `_notes` reads the same cached objects, so this costs three more stat() calls, and
        # only when something changed.
        key, sections, cuts = (day, room), [], []
        for note, path in self._notes(day):
            text, cut = self._budget.fit(self._relative(path), note.text, room, size(path))
            room = max(0, room - (len(note.text) if cut is None else cut.shown))
            shown = as_data(self._relative(path), text, tainted)
            sections.append(f"## {note.title}\n\n{shown}")
            cuts += [cut] if cut is not None else []
        rendered = "\n\n".join(sections)
        self._prompt_key, self._texts, self._cuts = key, texts, tuple(cuts)
        self._tainted = dict(tainted)
        if rendered != self._prompt:
            self._prompt = rendered
        return self._prompt, self._cuts

    def _paths(self, day: date) -> tuple[Path, Path]:
        if day != self._day:
            self._day = day
            self._day_paths = (self.daily_path(day), self.daily_path(day - timedelta(days=1)))
        return self._day_paths

    def _relative(self, path: Path) -> str:
        return path.relative_to(self._workspace).as_posix()
