"""What only its owner may read under the folders the sandbox binds, kept current.

The sandbox runs as nanobot's own user, so file modes alone would not keep out `/etc/shadow`,
an SSH host key or a credentials file created after start under `/opt` or an interpreter's
prefix: each must be masked, at each call. Walking those trees per call would cost tens of
milliseconds (some 13,000 folders under a pyenv), so the walk is done once and inotify says
which folders changed since (a file created, moved in or chmod-ed: IN_ATTRIB on a folder
covers its entries); only those are looked at again, when the next call asks.

The first walk (a second of CPU for a big prefix) runs in a thread of its own when the
masks are first needed (the first exec call, which waits for it off the event loop) or, in
the gateway, just after start-up (`begin`): a one-shot start that runs no command pays
nothing for it. Where inotify is missing every
call walks everything again (slower, never stale). Where its watch limit is reached part way, the
folders left unwatched keep the masks of the first walk, and a warning says so.
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct
import threading
from collections.abc import Sequence
from pathlib import Path

from loguru import logger

_IN_EVENTS = (
    0x00000004  # IN_ATTRIB
    | 0x00000040  # IN_MOVED_FROM
    | 0x00000080  # IN_MOVED_TO
    | 0x00000100  # IN_CREATE
    | 0x00000200  # IN_DELETE
    | 0x00000400  # IN_DELETE_SELF
    | 0x00000800  # IN_MOVE_SELF
    | 0x01000000  # IN_ONLYDIR
    | 0x02000000  # IN_DONT_FOLLOW
)
_IN_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then the name)


class OwnerOnlyMasks:
    """bubblewrap arguments that hide, under each root, what others may not read.

    `roots`: the folders to watch, and whether to look below their first level. Folders
    under `skip` (the workspace) are not looked into. `background`: make the first walk in
    a thread of its own, when first asked for (`args` waits for it). Calls may come from any
    thread.
    """

    def __init__(
        self,
        roots: Sequence[tuple[Path, bool]],
        skip: Sequence[Path] = (),
        *,
        background: bool = False,
    ) -> None:
        self._roots = list(roots)
        self._skip = tuple(skip)
        self._masks: dict[Path, list[str]] = {}  # folder -> masks of its own entries
        self._watches: dict[int, Path] = {}
        self._fd = _inotify()
        self._watching = self._fd is not None  # False once the watch limit was reached
        self._stale = False
        self._lock = threading.Lock()
        self._args: list[str] = []
        self._ready = threading.Event()
        self._started = not background
        if not background:
            self._first_walk()

    def begin(self) -> None:
        """Start the first walk in the background, if not started yet."""
        with _SHARED_LOCK:
            if self._started:
                return
            self._started = True
        # A daemon: a walk cut short by the process's exit leaves nothing behind.
        threading.Thread(target=self._first_walk, name="sandbox masks", daemon=True).start()

    def _first_walk(self) -> None:
        with self._lock:
            for root, recursive in self._roots:
                self._walk(root, recursive=recursive)
            self._args = self._flat()
        self._ready.set()

    @classmethod
    def shared(
        cls, roots: Sequence[tuple[Path, bool]], skip: Sequence[Path] = ()
    ) -> OwnerOnlyMasks:
        """One instance per set of roots in the process (the first walk of a big prefix
        takes a second); it lives as long as the process."""
        relevant = tuple(p for p in skip if any(p.is_relative_to(r) for r, _ in roots))
        key = (tuple(roots), relevant)
        with _SHARED_LOCK:
            if key not in _SHARED:
                _SHARED[key] = cls(roots, relevant, background=True)
            return _SHARED[key]

    @property
    def ready(self) -> bool:
        """Whether the first walk is done (`args` would not wait); starts it if need be."""
        self.begin()
        return self._ready.is_set()

    def wait(self) -> None:
        """Block until the first walk is done (starting it if need be)."""
        self.begin()
        self._ready.wait()

    def args(self) -> list[str]:
        """The masks as they are now (rescanning what changed since the last call). Blocks
        until the first walk is done."""
        self.wait()
        with self._lock:
            if self._fd is None:
                self._masks.clear()
                for root, recursive in self._roots:
                    self._walk(root, recursive=recursive)
                self._args = self._flat()
            elif changed := self._changed():
                for folder in sorted(changed):
                    self._rescan(folder)
                self._args = self._flat()
            elif self._stale:
                self._stale = False
                self._args = self._flat()
            return self._args

    def _flat(self) -> list[str]:
        return [arg for masks in self._masks.values() for arg in masks]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _recursive(self, folder: Path) -> bool:
        return any(
            folder == root or (recursive and folder.is_relative_to(root))
            for root, recursive in self._roots
        )

    def _changed(self) -> set[Path]:
        assert self._fd is not None
        changed: set[Path] = set()
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return changed
            offset = 0
            while offset < len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + size
                if mask & 0x4000:  # IN_Q_OVERFLOW: events were lost
                    self._stale = True
                elif (folder := self._watches.get(wd)) is not None:
                    changed.add(folder)
            if self._stale:  # walk everything again; `args` then flattens it
                self._masks.clear()
                for root, recursive in self._roots:
                    self._walk(root, recursive=recursive)
                return set()

    def _forget(self, folder: Path) -> None:
        """Drop what is known of `folder` and everything under it."""
        inside = str(folder) + os.sep
        for known in [p for p in self._masks if p == folder or str(p).startswith(inside)]:
            del self._masks[known]

    def _walk(self, folder: Path, *, recursive: bool) -> None:
        if any(folder.is_relative_to(s) for s in self._skip):
            return
        self._watch(folder)
        masks, subfolders = _scan(folder)
        self._masks[folder] = masks
        if recursive:
            for sub in subfolders:
                self._walk(sub, recursive=True)

    def _rescan(self, folder: Path) -> None:
        """`folder`'s own entries changed: look at them again, walk the folders new in it
        and forget those gone (or made private), without walking again what is known."""
        if folder not in self._masks:
            return  # under a folder that went, or was made private, meanwhile
        try:
            still = folder.is_dir()
        except OSError:
            still = False
        if not still:
            self._forget(folder)
            return
        masks, subfolders = _scan(folder)
        self._masks[folder] = masks
        if not self._recursive(folder):
            return
        present = set(subfolders)
        for gone in [p for p in self._masks if p.parent == folder and p not in present]:
            self._forget(gone)
        for sub in subfolders:
            if sub not in self._masks:
                self._walk(sub, recursive=True)

    def _watch(self, folder: Path) -> None:
        if self._fd is None or not self._watching:
            return
        wd = _LIBC.inotify_add_watch(self._fd, os.fsencode(folder), _IN_EVENTS)
        if wd >= 0:
            self._watches[wd] = folder
            return
        if ctypes.get_errno() == 28:  # ENOSPC: the watch limit
            logger.warning(
                "exec sandbox: inotify's watch limit (fs.inotify.max_user_watches) is reached "
                "after {} folders: files made private after start in the other folders of "
                "{} stay visible to commands until nanobot restarts; raise the limit",
                len(self._watches),
                ", ".join(str(root) for root, _ in self._roots),
            )
            self._watching = False


def mask(path: Path, *, directory: bool) -> list[str]:
    """bubblewrap arguments that hide `path` (an empty read-only folder, or /dev/null)."""
    if directory:
        return ["--tmpfs", str(path), "--remount-ro", str(path)]
    return ["--ro-bind", "/dev/null", str(path)]


def _scan(folder: Path) -> tuple[list[str], list[Path]]:
    """(masks for `folder`'s entries that others may not read, its folders others may)."""
    masks: list[str] = []
    subfolders: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return masks, subfolders
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISLNK(info.st_mode):
            continue
        directory = stat.S_ISDIR(info.st_mode)
        readable = info.st_mode & stat.S_IROTH and (not directory or info.st_mode & stat.S_IXOTH)
        if not readable:
            masks += mask(Path(entry.path), directory=directory)
        elif directory:
            subfolders.append(Path(entry.path))
    return masks, subfolders


_LIBC = ctypes.CDLL(None, use_errno=True)
_SHARED: dict[tuple[tuple[tuple[Path, bool], ...], tuple[Path, ...]], OwnerOnlyMasks] = {}
_SHARED_LOCK = threading.Lock()


def _inotify() -> int | None:
    if not hasattr(_LIBC, "inotify_init1"):  # not Linux
        return None
    fd = int(_LIBC.inotify_init1(_IN_NONBLOCK_CLOEXEC))
    return fd if fd >= 0 else None
