"""Limits on what one exec command may take (`tools.exec.limits`), and how they are enforced
here.

Enforcement, decided once at start-up (`enforce`):

- processes and memory: per command, for the command and everything it starts together, in
  a control group of its own (`_cgroups`: cgroup v2 with delegation, else cgroup v1 where it
  is writable, i.e. as root). Without one, rlimits stand in: RLIMIT_DATA bounds each
  process's memory (not their sum); RLIMIT_NPROC bounds the processes of the sandbox's user
  namespace, which the kernel does not apply to root;
- CPU time (RLIMIT_CPU, per process: SIGXCPU, then SIGKILL a second later), open files
  (RLIMIT_NOFILE), the size of any one file written (RLIMIT_FSIZE: SIGXFSZ): rlimits;
- the sandbox's `/tmp`: the size of its tmpfs (`Confinement.tmp_size`, bubblewrap's --size).

One command under them, and which of them ended it, is `limit_scope.py`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final

from loguru import logger

from nanobot.sizes import format_size
from nanobot.tools import _cgroups

KEY: Final = "tools.exec.limits"


@dataclass(frozen=True, slots=True)
class Limits:
    """What one command may take; None: not limited."""

    processes: int | None = 256
    memory: int | None = 1024**3
    cpu_time: timedelta | None = timedelta(minutes=5)
    open_files: int | None = 1024
    file_size: int | None = 1024**3
    tmp_size: int | None = 256 * 1024**2


@dataclass(frozen=True, slots=True)
class Enforcement:
    """How `limits` are enforced here: `tree` for processes and memory where there is one,
    rlimits for the rest; `confined` whether commands run in bubblewrap (which bounds /tmp,
    gives RLIMIT_NPROC a user namespace to count in, and is held for the gateway to set the
    rlimits); `prlimit` the path of util-linux's, which sets them without a sandbox; `root`
    whether nanobot runs as root (which RLIMIT_NPROC ignores)."""

    limits: Limits
    tree: _cgroups.Tree | None
    prlimit: str | None
    confined: bool
    root: bool
    groups: _cgroups.Groups | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        groups = None
        if self.tree is not None:
            limits = self.limits
            groups = _cgroups.Groups(self.tree, memory=limits.memory, processes=limits.processes)
        object.__setattr__(self, "groups", groups)

    def close(self) -> None:
        """Remove the command groups kept for reuse. Blocking: call it at shutdown, in a
        thread."""
        if self.groups is not None:
            self.groups.close()

    def enforced(self) -> dict[str, str]:
        """Each limit (by its key) -> how it is enforced, or why it is not ("not enforced
        (...)"). Limits set to null are left out."""
        said: dict[str, str] = {}
        limits, tree = self.limits, self.tree
        rlimit = "rlimit, per process" if self.confined or self.prlimit else _NO_PRLIMIT
        whole = f"{tree.description}, for the whole command" if tree is not None else ""
        if limits.processes is not None:
            if whole:
                said["processes"] = whole
            elif self.confined and not self.root:
                said["processes"] = "rlimit, in the sandbox's user namespace"
            else:
                why = "root is exempt from RLIMIT_NPROC" if self.root else "no sandbox"
                said["processes"] = f"not enforced (no cgroup to use, and {why})"
        if limits.memory is not None:
            said["memory"] = whole or rlimit
        for key in ("cpu_time", "open_files", "file_size"):
            if getattr(limits, key) is not None:
                said[key] = rlimit
        if limits.tmp_size is not None:
            said["tmp_size"] = "tmpfs size" if self.confined else "not enforced (no sandbox)"
        return said

    def describe(self) -> str:
        """One line for the start-up log and `nanobot status`: the limits grouped by how
        they are enforced."""
        shown = values(self.limits)
        groups: dict[str, list[str]] = {}
        for key, how in self.enforced().items():
            groups.setdefault(how, []).append(f"{key} {shown[key]}")
        parts = [f"{', '.join(keys)} ({how})" for how, keys in groups.items()]
        return "; ".join(parts) if parts else "none (all set to null)"

    @property
    def incomplete(self) -> bool:
        """Whether a limit is not enforced, or processes and memory only per process."""
        partial = self.tree is None and (
            self.limits.processes is not None or self.limits.memory is not None
        )
        return partial or any(h.startswith("not enforced") for h in self.enforced().values())


_NO_PRLIMIT: Final = "not enforced (util-linux prlimit is missing)"


def enforce(limits: Limits, *, confined: bool) -> Enforcement:
    """How `limits` can be enforced on this machine; takes the cgroup tree it will use
    (`_cgroups.claim`: on cgroup v2 nanobot moves into a leaf child). Blocking: call it at
    start-up, off the event loop."""
    tree = _cgroups.find() if limits.processes is not None or limits.memory is not None else None
    if tree is not None:
        try:
            _cgroups.claim(tree)
        except OSError as exc:
            logger.warning("exec limits: cannot use {}: {}", tree.description, exc)
            tree = None
    return _enforcement(limits, tree, confined=confined)


def inspect(limits: Limits, *, confined: bool) -> Enforcement:
    """What `enforce` would decide, changing nothing (for `nanobot status`)."""
    tree = _cgroups.find() if limits.processes is not None or limits.memory is not None else None
    return _enforcement(limits, tree, confined=confined)


def _enforcement(limits: Limits, tree: _cgroups.Tree | None, *, confined: bool) -> Enforcement:
    return Enforcement(limits, tree, shutil.which("prlimit"), confined, os.geteuid() == 0)


def log_enforcement(enforcement: Enforcement) -> None:
    """Say once at start-up which limits hold and how; a warning, with how to get the rest,
    when some are not enforced or only per process."""
    line = enforcement.describe()
    if not enforcement.incomplete:
        logger.info("exec limits: {}", line)
        return
    logger.warning(
        "exec limits: {}. For the process and memory limits to hold for a command as a "
        "whole, run nanobot with a delegated cgroup v2 subtree (systemd's Delegate=, as in "
        "contrib/nanobot.service) or as root on a cgroup v1 host",
        line,
    )


NO_LIMITS: Final = Enforcement(Limits(None, None, None, None, None, None), None, None, False, False)
"""Nothing limited (a tool built without limits, as in some tests)."""


def values(limits: Limits) -> dict[str, str]:
    """Each limit (by its key) as the log and the results show it ("128 MB", "5 s")."""
    cpu = limits.cpu_time
    return {
        "processes": str(limits.processes),
        "memory": format_size(limits.memory) if limits.memory else "",
        "cpu_time": f"{int(cpu.total_seconds())} s" if cpu else "",
        "open_files": str(limits.open_files),
        "file_size": format_size(limits.file_size) if limits.file_size else "",
        "tmp_size": format_size(limits.tmp_size) if limits.tmp_size else "",
    }
