"""The disk reserve: room kept on the data volume (where the state database is) so that a
command filling the disk cannot stop the store from writing.

Two parts, one object. A ballast file of the reserve's size, `state.db.reserve` beside the
database (hidden from the sandbox), takes the space while all is well: a command that fills
the volume meets "No space left on device" while the reserve is still there. When the store
itself then meets a full disk it calls `release()`, which deletes the ballast, and writes
again into the space it freed.
`restore()` makes the ballast again once the volume has room for it and as much again.
And `short()`, which the exec tool asks while a command runs, says when free space (beside
the ballast) has fallen below what must stay free, so that the command is stopped.

Every method is blocking file-system work that takes microseconds (a `statvfs`, an unlink),
except `restore()`, which allocates the ballast (fast where the file system supports
`fallocate`, as ext4, XFS, btrfs and tmpfs do): call it off the event loop. The methods are
safe to call from several threads: they serialise on a lock.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from loguru import logger

from nanobot.sizes import format_size

# With the ballast in place, a command is stopped only once the volume is all but full.
FULL_MARGIN: Final = 1024**2
_CHUNK: Final = 1024**2


@dataclass(frozen=True, slots=True)
class Shortage:
    """Free space on the data volume (`free` bytes) fell below what must stay free there
    (`needed`: the reserve, or all but a margin while the reserve file holds it)."""

    volume: Path
    free: int
    needed: int
    reserve: int


class DiskReserve:
    """`size` bytes kept free for the store on the volume of the database file `database`
    (see the module); the ballast lies beside it, named after it."""

    def __init__(self, database: Path, size: int) -> None:
        self.folder = database.parent
        self.size = size
        self.ballast = database.with_name(database.name + ".reserve")
        self._lock = threading.Lock()
        self._said_no_room = False

    def free(self) -> int:
        """Bytes an unprivileged writer may still take on the volume (statvfs `f_bavail`)."""
        info = os.statvfs(self.folder)
        return info.f_bavail * info.f_frsize

    @property
    def in_place(self) -> bool:
        """Whether the ballast holds the reserve now (in blocks, not a sparse file's size)."""
        try:
            return self.ballast.stat().st_blocks * 512 >= self.size
        except OSError:
            return False

    def restore(self) -> bool:
        """Make the ballast if it is missing and the volume has room for twice the reserve
        (the ballast, and as much left free to work in); cut one larger than the reserve (a
        smaller `disk_reserve` configured) down to it. Says once, as a warning, why it cannot
        be made; says when it is made again after that. Returns whether it is in place.
        Never raises: an allocation that fails leaves no file."""
        with self._lock:
            try:
                if self.in_place:
                    if self.ballast.stat().st_size > self.size:
                        os.truncate(self.ballast, self.size)
                    return True
                free = self.free()
                if free < 2 * self.size:
                    self._warn_once(
                        f"{format_size(free)} free on the data volume ({self.folder}), less "
                        f"than twice tools.exec.limits.disk_reserve ({format_size(self.size)})"
                    )
                    return False
                _allocate(self.ballast, self.size)
            except OSError as exc:
                self._warn_once(f"cannot make {self.ballast}: {exc}")
                return False
            if self._said_no_room:
                logger.info(
                    "disk reserve: {} kept again at {}", format_size(self.size), self.ballast
                )
            self._said_no_room = False
            return True

    def _warn_once(self, why: str) -> None:
        if not self._said_no_room:
            self._said_no_room = True
            logger.warning(
                "disk reserve: {}: the reserve file is made once there is room; until then "
                "commands are stopped when less than {} is free",
                why,
                format_size(self.size),
            )

    def release(self) -> bool:
        """Delete the ballast so that the store can write into its space; True when there
        was one to delete. Logs a warning: the volume is full."""
        with self._lock:
            held = self.ballast.exists()
            with contextlib.suppress(FileNotFoundError):
                self.ballast.unlink()
            if held:
                self._said_no_room = True  # so that restore() says when it is back
                logger.warning(
                    "disk reserve: the data volume ({}) is full; the {} reserve was released "
                    "so that the store can write. Free some space: the reserve is made again "
                    "once there is room",
                    self.folder,
                    format_size(self.size),
                )
            return held

    def short(self) -> Shortage | None:
        """The shortage when free space has fallen below what must stay free: the reserve
        when the ballast is not in place, else all but `FULL_MARGIN`. None while there is
        enough (or the volume cannot be asked)."""
        needed = FULL_MARGIN if self.in_place else self.size
        try:
            free = self.free()
        except OSError:
            return None
        return Shortage(self.folder, free, needed, self.size) if free < needed else None


def _allocate(path: Path, size: int) -> None:
    """Create `path` holding `size` bytes of real blocks (not a sparse file), or nothing."""
    partial = path.with_name(path.name + ".new")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # no fallocate there
                raise
            _write_blocks(fd, size)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    os.close(fd)
    partial.replace(path)


def _write_blocks(fd: int, size: int) -> None:
    # Not zeros: a compressing file system (ZFS, btrfs) would store zeros as nothing.
    chunk = os.urandom(_CHUNK)
    written = 0
    while written < size:
        written += os.write(fd, chunk[: min(_CHUNK, size - written)])
