"""The agent's workspace: the only way nanobot opens files in it.

Confinement. The model can create files, directories, symlinks and hard links in the workspace
(its shell runs there), and it can change them while nanobot is using them. So `Workspace`
never hands a path inside the workspace to the kernel to resolve: it opens the workspace
directory, then walks the path one component at a time relative to the directory it has
reached (`dir_fd`), each component opened with O_NOFOLLOW (and O_DIRECTORY on the way down). A
component swapped for a symlink between a check and the use therefore cannot redirect the
open; `..` returns to the directory it came from, and never above the workspace.

Symlinks are resolved here, one hop at a time, with the same walk: one that stays inside the
workspace is followed (at most `MAX_SYMLINK_HOPS` per path), so links a user keeps between
their own folders go on working; one that leads outside (an absolute target elsewhere, or
`..` past the top) raises `OutsideWorkspace` and nothing there is opened. A regular file with
more than one hard link is refused for reading and for writing: its other names may lie
outside, where the model cannot see what it would be reading or replacing.

The workspace directory itself is opened by its configured path, symlinks and all: the user
chose it, and the model cannot rename it (only its contents are writable in the sandbox).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path, PurePath
from typing import TypeVar

MAX_SYMLINK_HOPS = 40
"""Symlinks followed while resolving one path (Linux's own limit): more means a loop."""

MAX_UNIQUE_NAMES = 10_000
"""How many names `create` tries (`name`, `name-1`, …) before it gives up."""

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused right after).
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

T = TypeVar("T")


class ConfinementError(OSError):
    """A path nanobot refuses to use. `str()` is `"<path> <reason>"`; `reason` reads after
    the path ("leads outside the workspace (/ws)")."""

    def __init__(self, path: str, reason: str, code: int = errno.EPERM) -> None:
        super().__init__(code, reason, path)
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path} {self.reason}"


class OutsideWorkspace(ConfinementError):
    """The path, or a symlink on its way, leads outside the workspace."""


class UnsafeFile(ConfinementError):
    """Not outside, but not safe to use: a file with other hard links, not a regular file,
    a symlink loop, or a symlink where none may be followed."""


class _Symlink(Exception):
    """The component just tried is a symlink (raised to the walk, which follows it)."""


class Workspace:
    """Opens files and directories beneath `root`, never anything outside it.

    Paths may be relative to `root` or absolute (then they must lie under `root`, as given or
    as its real path). Every method opens `root` afresh and closes whatever it opened, so a
    `Workspace` holds no file descriptors and can be shared by threads. Blocking; errors are
    `OSError`s: `FileNotFoundError`, `IsADirectoryError`, `NotADirectoryError` (a file where a
    directory is needed on the way), `OutsideWorkspace`, `UnsafeFile`.

    `allow_hard_links` lifts the one-link rule, for a root that is not a boundary (the file
    tools with `restrict_to_workspace` off use `Workspace(Path("/"), allow_hard_links=True)`).
    """

    def __init__(self, root: Path, *, allow_hard_links: bool = False) -> None:
        self.root = root.expanduser()
        self._allow_hard_links = allow_hard_links
        given = self.root.absolute()
        real = Path(os.path.realpath(self.root))
        self._tops = (real,) if real == given else (real, given)

    def open_file(self, path: str | PurePath) -> tuple[int, os.stat_result]:
        """A read-only descriptor of the regular file at `path`, and its `fstat`; the caller
        closes it. Symlinks inside are followed; a directory raises `IsADirectoryError`, a
        FIFO, device or socket and a file with several hard links `UnsafeFile`."""
        raw = str(path)
        with self._walk(raw, _open_file) as (_, fd):
            try:
                info = os.fstat(fd)
                if stat.S_ISDIR(info.st_mode):
                    raise IsADirectoryError(errno.EISDIR, "is a directory", raw)
                if not stat.S_ISREG(info.st_mode):
                    raise UnsafeFile(raw, "is not a regular file (a device, pipe or socket)")
                self._check_links(raw, info)
            except BaseException:
                os.close(fd)
                raise
        return fd, info

    def read_bytes(self, path: str | PurePath) -> bytes:
        """The content of the regular file at `path` (see `open_file`)."""
        fd, _ = self.open_file(path)
        with os.fdopen(fd, "rb") as file:
            return file.read()

    def open_dir(self, path: str | PurePath, *, create: bool = False, follow: bool = True) -> int:
        """A descriptor of the directory at `path`; the caller closes it. `create` makes it
        and any missing parents; without `follow`, any symlink on the way is refused
        (`UnsafeFile`) instead of followed."""
        with self._walk(str(path), _dir_opener(create), create=create, follow=follow) as (_, fd):
            return fd

    def replace(self, path: str | PurePath, data: bytes) -> None:
        """Make `data` the content of the file at `path`, atomically: a finished temporary file
        in the same directory is renamed over it, so a crash leaves the old content or the new,
        never half. Missing parent directories are created; a symlink at `path` that stays
        inside is written through (its target is replaced). Keeps an existing file's mode; a
        new one gets 0o666 minus the umask.

        Raises `IsADirectoryError` when `path` is a directory and `UnsafeFile` when the file
        has other hard links, besides the usual errors.
        """
        raw = str(path)
        with self._walk(raw, _entry, create=True) as (dir_fd, (name, info)):
            if info is not None and stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory", raw)
            if info is not None and stat.S_ISREG(info.st_mode):
                self._check_links(raw, info)
                mode: int | None = stat.S_IMODE(info.st_mode)
            else:
                mode = None
            temp = _write_new(dir_fd, f".{name}.{secrets.token_hex(4)}.tmp", data, mode)
            try:
                os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with suppress(OSError):
                    os.unlink(temp, dir_fd=dir_fd)
                raise

    def create(
        self, directory: str | PurePath, name: str, data: bytes, *, follow: bool = False
    ) -> str:
        """Write `data` to a new file in `directory` (made if missing) and return the name it
        got: `name`, or `name` with `-1`, `-2`, … before its suffix when that name is taken.

        Nothing existing is replaced, and the file's name is never followed if it is a
        symlink: the data goes to a temporary file created with O_EXCL|O_NOFOLLOW, which is
        then linked under its final name (a link never replaces what is there) and unlinked.
        Without `follow`, a symlink on the way to `directory` is refused too (`UnsafeFile`).
        """
        saved = self._add(directory, name, data, follow, unique=True)
        if saved is None:
            raise FileExistsError(errno.EEXIST, "no free name left", name)
        return saved

    def put_new(
        self, directory: str | PurePath, name: str, data: bytes, *, follow: bool = True
    ) -> bool:
        """Like `create`, but only under `name`: False (and nothing written) when it is taken,
        by anything, a dangling symlink included."""
        return self._add(directory, name, data, follow, unique=False) is not None

    def _add(
        self, directory: str | PurePath, name: str, data: bytes, follow: bool, *, unique: bool
    ) -> str | None:
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            raise UnsafeFile(repr(name), "is not the name of a file in a folder")
        dir_fd = self.open_dir(directory, create=True, follow=follow)
        try:
            temp = _write_new(dir_fd, f".{name}.{secrets.token_hex(4)}.part", data, None)
            try:
                for candidate in _unique_names(name) if unique else (name,):
                    with suppress(FileExistsError):
                        os.link(
                            temp,
                            candidate,
                            src_dir_fd=dir_fd,
                            dst_dir_fd=dir_fd,
                            follow_symlinks=False,
                        )
                        return candidate
                return None
            finally:
                os.unlink(temp, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

    def _check_links(self, raw: str, info: os.stat_result) -> None:
        if info.st_nlink > 1 and not self._allow_hard_links:
            raise UnsafeFile(
                raw,
                f"has {info.st_nlink} hard links (other names for the same file, which may be "
                "outside the workspace), so it is not used; a copy of it would be",
            )

    @contextmanager
    def _walk(
        self,
        raw: str,
        final: Callable[[int, str], T],
        *,
        create: bool = False,
        follow: bool = True,
    ) -> Iterator[tuple[int, T]]:
        """Walk `raw` down from the root; yield the directory reached and what `final` made
        of the last component there (`"."` when the path ends at a directory, as `a/..`)."""
        walk = _Position(os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        try:
            found = self._descend(walk, raw, final, create, follow)
            yield walk.fd, found
        finally:
            walk.close()

    def _descend(
        self, walk: _Position, raw: str, final: Callable[[int, str], T], create: bool, follow: bool
    ) -> T:
        pending = self._parts(raw, raw)
        hops = 0
        while pending:
            name = pending.pop()
            if name == "..":
                if not walk.up():
                    raise self._outside(raw)
                continue
            try:
                if not pending:
                    return final(walk.fd, name)
                walk.down(_subdir(walk.fd, name, create))
                continue
            except _Symlink:
                pass
            if not follow:
                raise UnsafeFile(
                    raw, f"has a symbolic link on its way ({name!r}); none is followed"
                )
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                raise UnsafeFile(raw, "has too many levels of symbolic links", errno.ELOOP)
            try:
                target = os.readlink(name, dir_fd=walk.fd)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                pending.append(name)  # no longer a symlink: look at it again
                continue
            if PurePath(target).is_absolute():
                walk.top()
            pending.extend(self._parts(target, raw))
        return final(walk.fd, ".")

    def _parts(self, path: str, raw: str) -> list[str]:
        """The components of `path`, last first (the walk pops them); absolute paths are
        taken relative to the root they must lie under."""
        parts = PurePath(path).parts
        if parts and parts[0] == os.sep:
            for top in self._tops:
                if parts[: len(top.parts)] == top.parts:
                    parts = parts[len(top.parts) :]
                    break
            else:
                raise self._outside(raw)
        return [part for part in reversed(parts) if part not in ("", ".")]

    def _outside(self, raw: str) -> OutsideWorkspace:
        return OutsideWorkspace(raw, f"leads outside the workspace ({self._tops[0]})", errno.EXDEV)


class _Position:
    """The directories a walk has descended into, each held open, the root first."""

    def __init__(self, root_fd: int) -> None:
        self._fds = [root_fd]

    @property
    def fd(self) -> int:
        return self._fds[-1]

    def down(self, fd: int) -> None:
        self._fds.append(fd)

    def up(self) -> bool:
        """Back to the parent; False at the root, which has none here."""
        if len(self._fds) == 1:
            return False
        os.close(self._fds.pop())
        return True

    def top(self) -> None:
        while self.up():
            pass

    def close(self) -> None:
        for fd in reversed(self._fds):
            os.close(fd)
        self._fds = []


def _is_symlink(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _opener(flags: int) -> Callable[[int, str], int]:
    def open_(dir_fd: int, name: str) -> int:
        try:
            return os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            # O_NOFOLLOW on a symlink: ELOOP, or ENOTDIR together with O_DIRECTORY.
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_symlink(dir_fd, name):
                raise _Symlink from None
            raise

    return open_


_open_file = _opener(_FILE)
_open_dir = _opener(_DIR)


def _subdir(dir_fd: int, name: str, create: bool) -> int:
    try:
        return _open_dir(dir_fd, name)
    except FileNotFoundError:
        if not create:
            raise
    with suppress(FileExistsError):  # made meanwhile: opened below like any other
        os.mkdir(name, 0o777, dir_fd=dir_fd)
    return _open_dir(dir_fd, name)


def _dir_opener(create: bool) -> Callable[[int, str], int]:
    return lambda dir_fd, name: _subdir(dir_fd, name, create)


def _entry(dir_fd: int, name: str) -> tuple[str, os.stat_result | None]:
    """`name` in `dir_fd` and its lstat (None when it does not exist); a symlink is raised
    to the walk instead."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return name, None
    if stat.S_ISLNK(info.st_mode):
        raise _Symlink
    return name, info


def _write_new(dir_fd: int, name: str, data: bytes, mode: int | None) -> str:
    """Create `name` in `dir_fd` (it must not exist), write `data` and flush it to disk."""
    fd = os.open(name, _NEW, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as file:
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        with suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    return name


def _unique_names(name: str) -> Iterator[str]:
    """`name`, then `stem-1.suffix`, `stem-2.suffix`, …"""
    yield name
    pure = PurePath(name)
    for counter in range(1, MAX_UNIQUE_NAMES):
        yield f"{pure.stem}-{counter}{pure.suffix}"
