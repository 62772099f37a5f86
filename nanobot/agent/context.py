"""What the model is told: the system prompt from the workspace, and the history window.

Identical inputs give byte-identical messages, so provider prompt caches keep hitting: the
system prompt depends only on the workspace files and the calendar day (which daily notes
exist), never on the time. The time travels in a short envelope on each user message.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, tzinfo
from pathlib import Path

from loguru import logger

from nanobot.agent._files import same, size, text_cache
from nanobot.agent.memory import Memory
from nanobot.agent.prompt_budget import Cut, PromptBudget, warning
from nanobot.agent.skills import SKILLS_DIR, Skills
from nanobot.agent.taint import as_data
from nanobot.providers.base import Message
from nanobot.workspace import Workspace

PROMPT_FILES = ("AGENTS.md", "SOUL.md", "USER.md", "TOOLS.md")
"""Workspace files shown in the system prompt, in this order, each under its own heading."""
HEARTBEAT_FILE = "HEARTBEAT.md"
PERSONAL_PROMPT_FILES = ("USER.md",)
"""Prompt files each person has their own of, when people are kept apart."""

# Fixed English names: strftime("%a") follows the process locale, and the envelope must not.
_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

_SKILLS_PREAMBLE = (
    "A skill holds instructions for one kind of task. When a task matches a skill, read its "
    "SKILL.md with read_file first and follow it. A skill marked unavailable needs the missing "
    "program or variable set up first; tell your user what is missing."
)


class ContextBuilder:
    """Builds model messages from the workspace and a session's history.

    Building the system prompt when nothing changed costs a handful of stat() calls and
    returns the very same string object as last time.
    """

    def __init__(
        self,
        workspace: Path,
        *,
        timezone: tzinfo | None = None,
        skills: Skills | None = None,
        memory: Memory | None = None,
        budget: PromptBudget | None = None,
        personal: Path | None = None,
    ) -> None:
        """`timezone` decides when "today" begins for the daily notes (default: the machine's
        local zone); it is ignored when `memory` is given, which carries its own. `budget`
        bounds how much of the prompt files and memory the prompt holds (`memory`'s own
        budget bounds each of its files). `personal`: the folder of the person the prompt is
        for (`nanobot.people`), which holds their USER.md and memory (`memory` should be
        that folder's); the other prompt files and the skills stay the workspace's."""
        self._workspace = workspace
        self._personal = personal
        self._confined = Workspace(workspace)
        self._budget = budget if budget is not None else PromptBudget()
        if memory is None:
            memory = Memory(workspace, timezone, budget=self._budget)
        self._memory = memory
        self._skills = skills if skills is not None else Skills(workspace, budget=self._budget)
        self._files = text_cache(workspace, max_bytes=self._budget.read_bytes())
        own = personal if personal is not None else workspace
        self._paths = tuple(
            (own if name in PERSONAL_PROMPT_FILES else workspace) / name for name in PROMPT_FILES
        )
        self._identity = (
            _identity(workspace) if personal is None else _personal(personal, workspace)
        )
        self._parts: tuple[str | None, ...] = ()
        self._tainted: Mapping[str, str] = {}
        self._prompt = ""
        self._texts: tuple[str | None, ...] = ()
        self._fitted: tuple[tuple[str | None, ...], int, tuple[Cut, ...]] = ((), 0, ())
        self._warned: frozenset[Cut] = frozenset()

    @property
    def files(self) -> Workspace:
        """The workspace, for reading files confined to it (the photos of a turn)."""
        return self._confined

    @property
    def memory(self) -> Memory:
        return self._memory

    @property
    def skills(self) -> Skills:
        return self._skills

    def prompt_paths(self, now: datetime | None = None) -> tuple[Path, ...]:
        """The workspace files `system_prompt(now)` shows: the prompt files and memory (and
        the skills, under `skills_dir`)."""
        return (*self._paths, *self._memory.paths(self._memory.today(now)))

    @property
    def skills_dir(self) -> Path:
        return self._skills.directory

    @property
    def heartbeat_file(self) -> Path:
        """HEARTBEAT.md: not in the prompt; the heartbeat hands it to its turns."""
        return self._workspace / HEARTBEAT_FILE

    def system_prompt(
        self, now: datetime | None = None, tainted: Mapping[str, str] | None = None
    ) -> str:
        """The system prompt for a model call at `now` (default: the current time).

        Layout: who nanobot is and how its workspace works; AGENTS.md, SOUL.md, USER.md and
        TOOLS.md; memory (long-term, today's and yesterday's notes); the skills list; the
        bodies of `always` skills. Empty or missing files are left out. `now` only selects
        the daily notes; the prompt never contains the time. `tainted`: the files among
        `prompt_paths` and under `skills_dir` that hold content from outside
        (workspace-relative path → where it came from), each shown as data inside the
        untrusted-content markers (the skills all together, when one of them is).
        """
        tainted = tainted or {}
        summary, inlined = self._skills.prompt_parts()
        files, room, cuts = self._fit(tuple(self._files.get(path) for path in self._paths))
        memory, memory_cuts = self._memory.prompt_within(self._memory.today(now), room, tainted)
        parts = (*files, memory, summary, inlined)
        if same(parts, self._parts) and tainted == self._tainted:
            return self._prompt
        self._warn((*cuts, *memory_cuts))
        prompt = self._render(parts, tainted)
        self._parts, self._tainted = parts, dict(tainted)
        # A file saved without changes gives an equal prompt: keep the old object so callers
        # comparing by identity see no change.
        if prompt != self._prompt:
            self._prompt = prompt
        return self._prompt

    def _fit(
        self, texts: tuple[str | None, ...]
    ) -> tuple[tuple[str | None, ...], int, tuple[Cut, ...]]:
        """The prompt files as the prompt shows them (within the budget), the room they
        leave for memory, and what they cut; the same objects while no file changed."""
        if not same(texts, self._texts):
            room = self._budget.total_chars
            shown: list[str | None] = []
            cuts: list[Cut] = []
            for name, path, text in zip(PROMPT_FILES, self._paths, texts, strict=True):
                whole = (text or "").strip()
                if not whole:
                    shown.append(None)
                    continue
                body, cut = self._budget.fit(name, whole, room, size(path))
                room = max(0, room - (len(whole) if cut is None else cut.shown))
                shown.append(body)
                cuts += [cut] if cut is not None else []
            self._texts, self._fitted = texts, (tuple(shown), room, tuple(cuts))
        return self._fitted

    def _warn(self, cuts: tuple[Cut, ...]) -> None:
        """Say once in the log which files the prompt cuts, each time a cut is new."""
        if not set(cuts) <= self._warned and (line := warning(cuts, self._budget)):
            logger.warning(line)
        self._warned = frozenset(cuts)

    def _render(self, parts: tuple[str | None, ...], tainted: Mapping[str, str]) -> str:
        *files, memory, summary, inlined = parts
        sections = [self._identity]
        for name, text in zip(PROMPT_FILES, files, strict=True):
            if text is not None and text.strip():
                sections.append(f"## {name}\n\n{as_data(name, text.strip(), tainted)}")
        if memory:
            sections.append(memory)
        # Skills are many files: one marked among them shows all of them as data.
        marked = {k: v for k, v in tainted.items() if k.startswith(f"{SKILLS_DIR}/")}
        skills = {SKILLS_DIR: "; ".join(f"{k}, {v}" for k, v in marked.items())} if marked else {}
        if summary:
            listed = as_data(SKILLS_DIR, summary, skills)
            sections.append(f"## Skills\n\n{_SKILLS_PREAMBLE}\n\n{listed}")
        if inlined:
            sections.append(as_data(SKILLS_DIR, inlined, skills))
        return "\n\n".join(sections) + "\n"


def _identity(workspace: Path) -> str:
    return (
        f"You are nanobot, a personal AI assistant. Your workspace is {workspace}. File tools "
        "take paths relative to it and `exec` runs there. The sections below are workspace "
        "files: AGENTS.md (your instructions), SOUL.md (your character), USER.md (your user), "
        "TOOLS.md (tool notes), your memory (memory/MEMORY.md and daily notes in "
        "memory/YYYY-MM-DD.md) and your skills (skills/<name>/SKILL.md). Edit them with the "
        "file tools to change what you know and how you work; edits take effect at your next "
        "step. Each user message starts with its local date and time in brackets, like "
        "[2026-01-31 09:05 Sat CET]."
    )


def _personal(folder: Path, workspace: Path) -> str:
    return (
        f"You are nanobot, a personal AI assistant. You are working for one person; their "
        f"folder {folder} is your workspace: file tools take paths relative to it and `exec` "
        "runs there. You cannot see other people's folders, memory or private chats. The "
        "sections below are files: AGENTS.md (your instructions), SOUL.md (your character), "
        "TOOLS.md (tool notes) and your skills (skills/<name>/SKILL.md) are shared by "
        f"everyone and read-only (read_file finds them by those names; `exec` sees them in "
        f"{workspace}); USER.md (your user) and their memory (memory/MEMORY.md and daily "
        "notes in memory/YYYY-MM-DD.md) are in their folder: edit those with the file tools "
        "to change what you know; edits take effect at your next step. Each user message "
        "starts with its local date and time in brackets, like [2026-01-31 09:05 Sat CET]."
    )


def time_envelope(now: datetime) -> str:
    """`now` as the user message envelope shows it: `2026-11-22 10:49 Sun UTC` (no zone name
    when `now` is naive). Depends only on `now`, never on the locale."""
    stamp = f"{now:%Y-%m-%d %H:%M} {_WEEKDAYS[now.weekday()]}"
    zone = now.tzname()
    return f"{stamp} {zone}" if zone else stamp


def user_message(text: str, now: datetime) -> Message:
    """The user's message with a short time envelope (kept out of the system prompt, so the
    prompt stays byte-identical and provider prompt caches keep working)."""
    return {"role": "user", "content": f"[{time_envelope(now)}]\n{text}"}
