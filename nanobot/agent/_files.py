"""Workspace files read and parsed once per version, keyed by modification time and size.

The prompt is rebuilt for every turn, so an unchanged file must cost one stat() and nothing
else. These are tiny local files, which is why DESIGN §4 allows the blocking calls on the event
loop.
"""

from __future__ import annotations

import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from loguru import logger

T = TypeVar("T")

Version = tuple[int, int]
"""A file's (st_mtime_ns, st_size): when either changes, the file is read again."""


def version(path: Path) -> Version | None:
    """The version of `path`, or None when it does not exist or cannot be stat()ed."""
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size)


class FileCache(Generic[T]):
    """Values parsed from files, each cached by the file's `Version`.

    `get` stats the file on every call and reads and parses it only when its version changed,
    so an unchanged file returns the very same object as last time: callers detect change
    cheaply by identity (see `same`).
    """

    def __init__(self, parse: Callable[[Path, str], T]) -> None:
        """`parse(path, text)` turns a file's text into the cached value. It runs once per
        version of a file; it should not raise (a file's problems belong in its value)."""
        self._parse = parse
        self._entries: dict[Path, tuple[Version, T | None]] = {}

    def get(self, path: Path) -> T | None:
        """The parsed content of `path`; None when it is missing, not a regular file or
        unreadable (the last two logged once per version)."""
        try:
            info = path.stat()
        except OSError:
            self._entries.pop(path, None)
            return None
        key = (info.st_mtime_ns, info.st_size)
        cached = self._entries.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        value = self._load(path, stat.S_ISREG(info.st_mode))
        self._entries[path] = (key, value)
        return value

    def _load(self, path: Path, regular: bool) -> T | None:
        # Reading a FIFO or a device would block the event loop indefinitely.
        if not regular:
            logger.warning("Ignoring {}: not a regular file", path)
            return None
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            logger.warning("Cannot read {}: {}", path, exc)
            return None
        return self._parse(path, text)


def _keep(_path: Path, text: str) -> str:
    return text


def text_cache() -> FileCache[str]:
    """A cache of files' plain text."""
    return FileCache(_keep)


def same(a: Sequence[object], b: Sequence[object]) -> bool:
    """Whether two sequences hold the very same objects: with `FileCache`, whether any of the
    files behind them changed."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
