"""Workspace files read and parsed once per version, keyed by modification time and size.

The prompt is rebuilt for every turn, so an unchanged file must cost one lstat() and nothing
else. These are tiny local files, which is why DESIGN §4 allows the blocking calls on the event
loop.

The model can replace any of these files with a symlink or a hard link to something outside
the workspace (`USER.md -> ../config.yaml`). The lstat() only notices that something changed;
every read goes through `Workspace`, which refuses such files, so a cached text was always
read from inside the workspace, and a forged version (a link given the old file's mtime and
size) can at most keep showing the file's earlier, confined text.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from loguru import logger

from nanobot.workspace import ConfinementError, Workspace

T = TypeVar("T")

Version = tuple[int, ...]
"""A file's (st_mtime_ns, st_size, st_ino), from lstat(): when any changes, the file is read
again. For a symlink, its target's three follow, so an edit of the target is seen too."""


def version(path: Path) -> Version | None:
    """The version of `path`, or None when it does not exist or cannot be lstat()ed."""
    try:
        info = path.lstat()
    except OSError:
        return None
    found: Version = (info.st_mtime_ns, info.st_size, info.st_ino)
    if stat.S_ISLNK(info.st_mode):
        # Only metadata: a target outside is never opened (`FileCache` refuses to read it).
        try:
            target = path.stat()
        except OSError:
            return found
        found += (target.st_mtime_ns, target.st_size, target.st_ino)
    return found


class FileCache(Generic[T]):
    """Values parsed from files in a workspace, each cached by the file's `Version`.

    `get` lstats the file on every call and reads and parses it only when its version changed,
    so an unchanged file returns the very same object as last time: callers detect change
    cheaply by identity (see `same`).
    """

    def __init__(
        self, parse: Callable[[Path, str], T], workspace: Path, *, max_bytes: int | None = None
    ) -> None:
        """`parse(path, text)` turns a file's text into the cached value. It runs once per
        version of a file; it should not raise (a file's problems belong in its value). Files
        are read confined to `workspace` (see `Workspace`); with `max_bytes`, only their first
        `max_bytes` bytes are read (the text of a longer file is its start)."""
        self._parse = parse
        self._workspace = Workspace(workspace)
        self._max_bytes = max_bytes
        self._entries: dict[Path, tuple[Version, T | None]] = {}

    def get(self, path: Path) -> T | None:
        """The parsed content of `path`, a file in the workspace; None when it is missing, or
        when it cannot or may not be read: not a regular file, leading outside the workspace,
        with other hard links, unreadable (each logged once per version)."""
        key = version(path)
        if key is None:
            self._entries.pop(path, None)
            return None
        cached = self._entries.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        value = self._load(path)
        self._entries[path] = (key, value)
        return value

    def _load(self, path: Path) -> T | None:
        try:
            data = self._read(path)
        except FileNotFoundError:  # a dangling symlink, or removed since the lstat
            return None
        except ConfinementError as exc:
            logger.warning("Ignoring {}: it {}", path, exc.reason)
            return None
        except OSError as exc:
            logger.warning("Cannot read {}: {}", path, exc)
            return None
        text = data.decode("utf-8", errors="replace")
        # As text-mode reading does: "\r\n" and "\r" end lines too.
        return self._parse(path, text.replace("\r\n", "\n").replace("\r", "\n"))

    def _read(self, path: Path) -> bytes:
        if self._max_bytes is None:
            return self._workspace.read_bytes(path)
        fd, _ = self._workspace.open_file(path)
        with os.fdopen(fd, "rb") as file:
            return file.read(self._max_bytes)


def _keep(_path: Path, text: str) -> str:
    return text


def text_cache(workspace: Path, *, max_bytes: int | None = None) -> FileCache[str]:
    """A cache of the plain text of files in `workspace` (of their first `max_bytes`)."""
    return FileCache(_keep, workspace, max_bytes=max_bytes)


def size(path: Path) -> int:
    """The size of `path` in bytes (of a symlink's target); 0 when it cannot be found."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def same(a: Sequence[object], b: Sequence[object]) -> bool:
    """Whether two sequences hold the very same objects: with `FileCache`, whether any of the
    files behind them changed."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
