"""What a bubblewrap sandbox binds, masks and makes, as its arguments (see `bubblewrap.py`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nanobot.people import PEOPLE_DIR, SHARED_FILES
from nanobot.tools._masks import mask

# Read-only system roots, when they exist (as a directory, or as the symlink merged-/usr
# systems have: `/bin -> usr/bin`).
SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# A PATH entry in one of these needs no bind of its own.
_SYSTEM_PREFIXES = tuple(Path(p) for p in SYSTEM_ROOTS)
# Searched for what only its owner may read, at each call (the other roots hold none).
_MASKED_ROOTS = (Path("/etc"), Path("/opt"))
# Made fresh inside the sandbox (`/etc/mtab -> ../proc/self/mounts` works as it is).
_KERNEL_FILESYSTEMS = (Path("/proc"), Path("/sys"), Path("/dev"))


@dataclass(frozen=True, slots=True)
class Layout:
    """bubblewrap's arguments before and after the per-call masks, the folders whose private
    files those masks hide (and whether below their first level), the folders not to look
    into, and the PATH entries visible inside."""

    head: list[str]
    tail: list[str]
    watched: list[tuple[Path, bool]]
    unwatched: list[Path]
    visible: list[str]


def layout(
    workspace: Path,
    hidden: Sequence[Path],
    *,
    network: bool,
    path_env: str,
    home: Path,
    tmp_size: int | None = None,
) -> Layout:
    """The arguments for a sandbox of `workspace` without `hidden`, with the network of the
    namespace it starts in (`network`) or none, HOME at `home`, and PATH's prefixes bound."""
    workspace = workspace.resolve()
    hidden = [p.resolve() for p in hidden]
    head = [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        # Root outside stays uid 0 inside; without capabilities it cannot undo a mount.
        "--cap-drop",
        "ALL",
    ]
    if not network:
        head.append("--unshare-net")
    bound: list[Path] = []
    for root in _SYSTEM_PREFIXES:
        if root.is_symlink():
            head += ["--symlink", str(root.readlink()), str(root)]
        elif root.is_dir():
            head += ["--ro-bind", str(root), str(root)]
            bound.append(root)
    head += _etc_link_targets(bound)
    # Before the binds below, which may lie inside /tmp.
    head += ["--proc", "/proc", "--dev", "/dev", *_tmpfs("/dev/shm", tmp_size)]
    head += _tmpfs("/tmp", tmp_size)
    visible, prefixes = _path_prefixes(path_env, hidden, workspace)
    for prefix in prefixes:
        head += ["--ro-bind", str(prefix), str(prefix)]
    watched = [(root, True) for root in bound if root in _MASKED_ROOTS]
    watched += [(prefix, True) for prefix in prefixes]
    bound += prefixes
    # The masks come between: after what they lie in, before the workspace, which may lie
    # inside a bound folder and keeps its own files.
    tail = ["--perms", "0700", *_tmpfs(str(home), tmp_size)]
    tail += ["--bind", str(workspace), str(workspace)]
    bound.append(workspace)
    tail += _hidden_masks(hidden, bound)
    tail += ["--chdir", str(workspace)]
    return Layout(head, tail, watched, [workspace, *hidden], visible)


def person_tail(
    workspace: Path,
    person: Path,
    hidden: Sequence[Path],
    *,
    home: Path,
    tmp_size: int | None = None,
) -> list[str]:
    """The arguments after the masks for a command of one person (`nanobot.people`): their
    folder `person` read-write as the working directory, and of the rest of the workspace
    only the shared prompt files, read-only, at their own paths; other people's folders are
    not there at all.

    Raises:
        ValueError: `person` is not a folder of its own under the workspace's `people/` (a
            symlink there would bind someone else's).
    """
    real_workspace = workspace.resolve()
    expected = real_workspace / PEOPLE_DIR / person.name
    if Path(os.path.realpath(person)) != expected or not _is_plain_dir(expected):
        raise ValueError(f"{person} is not a person's own folder under {real_workspace}")
    tail = ["--perms", "0700", *_tmpfs(str(home), tmp_size)]
    tail += ["--bind", str(expected), str(expected)]
    bound = [expected]
    for name in SHARED_FILES:
        shared = real_workspace / name
        try:
            info = os.lstat(shared)
        except OSError:
            continue
        # Only what is itself a file or folder: a symlink's target could be anyone's.
        if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode):
            tail += ["--ro-bind", str(shared), str(shared)]
            bound.append(shared)
    tail += _hidden_masks([p.resolve() for p in hidden], bound)
    tail += ["--chdir", str(expected)]
    return tail


def _is_plain_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _tmpfs(path: str, size: int | None) -> list[str]:
    """A fresh tmpfs at `path`; RAM-backed, so bounded by `size` bytes
    (tools.exec.limits.tmp_size) where one is set (bubblewrap's --size sizes the next one)."""
    return ["--tmpfs", path] if size is None else ["--size", str(size), "--tmpfs", path]


def _path_prefixes(
    path_env: str, hidden: Sequence[Path], workspace: Path
) -> tuple[list[str], list[Path]]:
    """PATH entries the command will see, and the install prefixes to bind for them.

    An entry under a system root needs nothing. Another (`~/.pyenv/shims`, `/nix/.../bin`)
    brings its prefix (the parent of a `bin`, `sbin` or `shims` folder) read-only, so the
    interpreter finds its libraries; never a prefix that is or holds the user's home, the
    workspace or a hidden path, nor one only its owner may enter (what it holds is private).
    An entry that cannot be bound is left out of PATH.
    """
    holders_forbidden = [*hidden, workspace, Path.home().resolve()]
    visible: list[str] = []
    prefixes: list[Path] = []
    for entry in path_env.split(os.pathsep):
        if not entry or not Path(entry).is_absolute() or not _is_dir(Path(entry)):
            continue
        real = Path(entry).resolve()
        if any(real.is_relative_to(root) for root in _SYSTEM_PREFIXES):
            visible.append(entry)
            continue
        prefix = real.parent if real.name in ("bin", "sbin", "shims") else real
        if (
            any(p.is_relative_to(prefix) for p in holders_forbidden)
            or any(prefix.is_relative_to(p) for p in hidden)
            or not _open_to_all(prefix)
        ):
            continue
        visible.append(entry)
        if not any(prefix.is_relative_to(p) for p in prefixes):
            prefixes = [p for p in prefixes if not p.is_relative_to(prefix)] + [prefix]
    return visible, prefixes


def _open_to_all(folder: Path) -> bool:
    try:
        mode = folder.stat().st_mode
    except OSError:
        return False
    return bool(mode & stat.S_IROTH and mode & stat.S_IXOTH)


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a folder nanobot's user may not enter (pathlib raises EACCES)
        return False


def _etc_link_targets(bound: Iterable[Path]) -> list[str]:
    """Bind the targets of /etc's symlinks that lead out of what is bound (`resolv.conf ->
    /run/systemd/resolve/stub-resolv.conf`), read-only, when everyone may read them."""
    args: list[str] = []
    roots = list(bound)
    try:
        entries = list(os.scandir("/etc"))
    except OSError:
        return args
    for entry in entries:
        if not entry.is_symlink():
            continue
        target = Path(entry.path).resolve()
        if any(target.is_relative_to(root) for root in [*roots, *_KERNEL_FILESYSTEMS]):
            continue
        try:
            info = target.stat()
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_mode & stat.S_IROTH:
            args += ["--ro-bind", str(target), str(target)]
    return args


def _hidden_masks(hidden: Iterable[Path], bound: Sequence[Path]) -> list[str]:
    """Mask each hidden path that lies under something bound (a data dir in /opt, a config
    file in /etc)."""
    args: list[str] = []
    for path in hidden:
        if path.exists() and any(path.is_relative_to(root) for root in bound):
            args.extend(mask(path, directory=path.is_dir()))
    return args
