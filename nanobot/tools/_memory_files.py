"""The memory files as the memory search reads them: `memory/MEMORY.md` and the other
`memory/*.md` of the workspace, scanned line by line (they are small and few)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from nanobot.recall import Term
from nanobot.recall.ranking import has_phrase, recency
from nanobot.recall.words import index_text

MEMORY_DIR: Final = "memory"
MAX_FILES: Final = 400  # the newest; older daily notes are rarely what is looked for
MAX_FILE_BYTES: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class FileHit:
    """A line of a memory file holding every term: `path` relative to the workspace, its
    1-based `line`, the file's time, the line's text and its score (as `recall.ranking`)."""

    path: str
    line: int
    modified: datetime
    text: str
    score: float

    @property
    def ref(self) -> str:
        return f"{self.path}:{self.line}"


def memory_files(workspace: Path) -> list[Path]:
    """The memory files inside the workspace, newest first (none through a symlink that
    leads out of it)."""
    folder = workspace / MEMORY_DIR
    root = workspace.resolve()
    try:
        found = [p for p in folder.iterdir() if p.suffix == ".md" and p.is_file()]
    except OSError:
        return []
    inside = [p for p in found if p.resolve().is_relative_to(root)]
    inside.sort(key=_mtime, reverse=True)
    return inside[:MAX_FILES]


def scan(workspace: Path, terms: tuple[Term, ...], now: datetime) -> list[FileHit]:
    """Every line of the memory files that holds all of `terms` (blocking: run in a thread)."""
    hits = []
    for path in memory_files(workspace):
        modified = datetime.fromtimestamp(_mtime(path), UTC)
        weight = recency((now - modified).total_seconds() / 86_400)
        try:
            with path.open("rb") as file:
                text = file.read(MAX_FILE_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        relative = path.relative_to(workspace).as_posix()
        for number, line in enumerate(text.splitlines(), start=1):
            folded = f" {index_text(line)} "
            if all(f" {' '.join(term)} " in folded for term in terms):
                boost = 1.5 if has_phrase(line, terms) else 1.0
                hits.append(FileHit(relative, number, modified, line.strip(), weight * boost))
    return hits


def lines_around(
    workspace: Path, path: str, line: int, spread: int
) -> list[tuple[int, str]] | None:
    """Lines `line - spread` to `line + spread` of the memory file `path`; None when it is
    not a memory file of the workspace (blocking: run in a thread)."""
    wanted = (workspace / path).resolve()
    if not any(p.resolve() == wanted for p in memory_files(workspace)):
        return None
    with wanted.open("rb") as file:
        lines = file.read(MAX_FILE_BYTES).decode("utf-8", "replace").splitlines()
    first = max(1, line - spread)
    return [(n, lines[n - 1]) for n in range(first, min(len(lines), line + spread) + 1)]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
