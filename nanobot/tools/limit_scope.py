"""One exec command under the limits (`tools.exec.limits`, see `limits.py`): its control group,
the rlimits its first process gets, the watch over the disks while it runs, and which limit
ended it.

In bubblewrap the gateway puts the sandbox's init under the limits while it waits at its gate
(`_bwrap_gate`, `Scope.hold`): into the command's group, the rlimits set on it (so they bind
the command and not bubblewrap, and RLIMIT_NPROC counts in the sandbox's user namespace);
the command and everything it starts inherit both. Without a sandbox, a shell in front joins
the group (`Scope.outer`) and util-linux's `prlimit` sets the rlimits (`Scope.inner`).
`verdict()` reads what the kernel counted (the group's events, the exit status) and, for
what only the command's own output can tell (too many open files, a refused fork, a full
/tmp), its output.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shlex
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from loguru import logger

from nanobot.reserve import DiskReserve, Shortage
from nanobot.tools import _cgroups
from nanobot.tools.limits import KEY, Enforcement, values

# Seconds between looks at the disks while a command runs: the kernel tells no one when free
# space falls, so there is nothing to wait on but polling (statvfs costs microseconds).
WATCH_EVERY: Final = 0.1
# A group is empty once the kernel has reaped its last process: looked at for about 2 s.
_REMOVE_TRIES: Final = 30
_REMOVE_FIRST_WAIT: Final = 0.001
_REMOVE_MAX_WAIT: Final = 0.1
# Output that says the command met a limit only its own error messages can show.
_EMFILE: Final = ("Too many open files",)
_NOFORK: Final = ("Cannot fork", "fork: Resource temporarily unavailable", "can't fork")
_NOMEM: Final = ("MemoryError", "Cannot allocate memory", "out of memory", "bad_alloc")
_NOSPACE: Final = ("No space left on device",)
# What the shell says when a child of it was killed by SIGXCPU or SIGXFSZ.
_XCPU: Final = ("CPU time limit exceeded",)
_XFSZ: Final = ("File size limit exceeded",)
_EFBIG: Final = ("File too large",)  # a program that ignores SIGXFSZ, as Python does
_PRLIMIT_FLAGS: Final = {
    resource.RLIMIT_CPU: "cpu",
    resource.RLIMIT_NOFILE: "nofile",
    resource.RLIMIT_FSIZE: "fsize",
    resource.RLIMIT_DATA: "data",
    resource.RLIMIT_NPROC: "nproc",
}


@dataclass
class Scope:
    """One command under the limits: its group (if any), what the watch saw, and the argv
    wrappers. Made by `open_scope`, closed by `close_scope`."""

    enforcement: Enforcement
    group: _cgroups.Group | None
    reserve: DiskReserve | None
    workspace: Path | None = None
    events: tuple[int, int] = (0, 0)  # the group's event counters when the command started
    tmp_full: bool = False
    shortage: Shortage | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def rlimits(self) -> list[tuple[int, int, int]]:
        """(resource, soft, hard) to set on the command's first process: what the group
        does not hold."""
        limits, wanted = self.enforcement.limits, []
        if limits.cpu_time is not None:
            seconds = max(1, int(limits.cpu_time.total_seconds()))
            wanted.append((resource.RLIMIT_CPU, seconds, seconds + 1))  # SIGXCPU, then KILL
        if limits.open_files is not None:
            wanted.append((resource.RLIMIT_NOFILE, limits.open_files, limits.open_files))
        if limits.file_size is not None:
            wanted.append((resource.RLIMIT_FSIZE, limits.file_size, limits.file_size))
        if limits.memory is not None and self.group is None:
            wanted.append((resource.RLIMIT_DATA, limits.memory, limits.memory))
        if limits.processes is not None and self.group is None and self.enforcement.confined:
            wanted.append((resource.RLIMIT_NPROC, limits.processes, limits.processes))
        return wanted

    @property
    def _joined_outside(self) -> bool:
        """Whether the command's first process must be moved into the group (v2), not
        started inside it by the launcher's thread (v1, `_launcher`)."""
        return self.group is not None and not self.group.by_thread

    @property
    def held(self) -> bool:
        """Whether the command's first process must be put under anything (`hold`)."""
        return self._joined_outside or bool(self.rlimits())

    def hold(self, pid: int) -> None:
        """Put process `pid` under the limits before it starts the command (a sandbox's init
        held at its gate): into the group, the rlimits set (never above a hard limit already
        in force, which only a privileged process could raise). What it forks inherits both.

        Raises:
            OSError: the process is gone, or a limit cannot be set.
        """
        if self.group is not None and self._joined_outside:
            for joins in self.group.joins:
                joins.write_text(f"{pid}\n")
        for kind, soft, hard in self.rlimits():
            _, ceiling = resource.prlimit(pid, kind)
            if ceiling == resource.RLIM_INFINITY:
                ceiling = hard
            resource.prlimit(pid, kind, (min(soft, ceiling), min(hard, ceiling)))

    def inner(self, argv: Sequence[str]) -> list[str]:
        """Without a sandbox to hold: `argv` with `prlimit` setting the rlimits in front."""
        prlimit, wanted = self.enforcement.prlimit, self.rlimits()
        if prlimit is None or not wanted:
            return list(argv)
        flags = [f"--{_PRLIMIT_FLAGS[kind]}={soft}:{hard}" for kind, soft, hard in wanted]
        return [prlimit, *flags, "--", *argv]

    def outer(self, argv: Sequence[str]) -> list[str]:
        """Without a sandbox to hold: `argv` made to join the command's group before it
        starts, by a shell in front."""
        if self.group is None or not self._joined_outside:
            return list(argv)
        joins = " && ".join(f"echo 0 > {shlex.quote(str(f))}" for f in self.group.joins)
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *argv]

    async def watch(self, sandbox_tmp: Callable[[], Path | None]) -> None:
        """Until cancelled, look at the data volume and the sandbox's /tmp every
        WATCH_EVERY: set `stop` when free space on the data volume is short (see
        `DiskReserve.short`), note when /tmp is full. Never raises but CancelledError."""
        tmp: Path | None = None
        while True:
            # First after a while: the reserve was looked at just before the start, and a
            # command of less than WATCH_EVERY (most) costs the watch nothing.
            await asyncio.sleep(WATCH_EVERY)
            if self.reserve is not None and (short := self.reserve.short()) is not None:
                self.shortage = short
                self.stop.set()
                return
            tmp = tmp or sandbox_tmp()
            if tmp is not None and not self.tmp_full:
                self.tmp_full = _full(tmp)

    def verdict(self, code: int | None, output: str) -> tuple[str | None, str | None]:
        """(what the kernel says ended the command, what it met otherwise), each a phrase
        naming the limit and its key, or None. A command that exited 0 was not ended by a
        limit: what one of its processes met is in the second."""
        limits, shown = self.enforcement.limits, values(self.enforcement.limits)
        pids_hit, oom = False, False
        if self.group is not None:
            (pids, kills), (pids_before, kills_before) = self.group.events(), self.events
            pids_hit, oom = pids > pids_before, kills > kills_before
        ended: list[str] = []
        if oom:
            ended.append(_limit("memory", shown))
        if pids_hit:
            ended.append(_limit("processes", shown))
        signal_number = -code if code is not None and code < 0 else (code or 0) - 128
        if limits.cpu_time is not None and signal_number == signal.SIGXCPU:
            ended.append(_limit("cpu_time", shown))
        if limits.file_size is not None and signal_number == signal.SIGXFSZ:
            ended.append(_limit("file_size", shown))
        if code == 0:  # a child met it, and the command coped: said, not an error
            return None, " and ".join(ended or self._met(code, output, shown)) or None
        met = [] if ended else self._met(code, output, shown)
        return (" and ".join(ended) or None), (" and ".join(met) or None)

    def _met(self, code: int | None, output: str, shown: dict[str, str]) -> list[str]:
        limits, met = self.enforcement.limits, []
        # Only a shell says these, of a child it ran: a command that went on after it.
        if limits.cpu_time is not None and _says(output, _XCPU):
            met.append(_limit("cpu_time", shown))
        if limits.file_size is not None and _says(output, _XFSZ):
            met.append(_limit("file_size", shown))
        if code in (0, None):
            return met
        if limits.file_size is not None and not met and _says(output, _EFBIG):
            met.append(_limit("file_size", shown))
        if limits.open_files is not None and _says(output, _EMFILE):
            met.append(_limit("open_files", shown))
        if limits.processes is not None and _says(output, _NOFORK):
            met.append(_limit("processes", shown))
        if limits.memory is not None and self.group is None and _says(output, _NOMEM):
            met.append(_limit("memory", shown))
        # A full disk where the workspace is has its own message; else it was /tmp's tmpfs.
        tmp = self.tmp_full or (self.workspace is not None and not _full(self.workspace))
        if limits.tmp_size is not None and tmp and _says(output, _NOSPACE):
            met.append(f"the size of its /tmp ({shown['tmp_size']}, {KEY}.tmp_size)")
        return met


async def open_scope(
    enforcement: Enforcement, reserve: DiskReserve | None, workspace: Path | None = None
) -> Scope:
    """A scope for one command in `workspace`: a group of its own (reused, or made in a
    thread), the disk reserve restored where there is room. Raises OSError when no group
    can be made."""
    group, events = None, (0, 0)
    if enforcement.groups is not None:
        group = await enforcement.groups.take()
        events = group.events()
    if reserve is not None and not reserve.in_place:
        await asyncio.to_thread(reserve.restore)
    return Scope(enforcement, group, reserve, workspace, events)


async def close_scope(scope: Scope) -> None:
    """Give the command's group back for reuse once the kernel has reaped its last process
    (usually within a millisecond of the command's end); after about two seconds, remove it
    instead, or leave it with a warning. Safe to cancel: the group is then not reused."""
    group, groups = scope.group, scope.enforcement.groups
    if group is None or groups is None:
        return
    wait = _REMOVE_FIRST_WAIT
    try:
        for _ in range(_REMOVE_TRIES):
            if group.empty():
                groups.give_back(group)
                return
            await asyncio.sleep(wait)
            wait = min(2 * wait, _REMOVE_MAX_WAIT)
    except asyncio.CancelledError:
        group.remove()  # where it is empty by now; else it is left until a later start
        raise
    if not group.remove():
        logger.warning("exec limits: {} still holds processes; it is left", group.memory)


_NAMES: Final = {
    "processes": "the process limit",
    "memory": "the memory limit",
    "cpu_time": "the CPU time limit",
    "open_files": "the open files limit",
    "file_size": "the file size limit",
}


def _limit(key: str, shown: dict[str, str]) -> str:
    return f"{_NAMES[key]} ({shown[key]}, {KEY}.{key})"


def _says(output: str, phrases: Sequence[str]) -> bool:
    return any(phrase in output for phrase in phrases)


def _full(folder: Path) -> bool:
    """Whether the file system at `folder` has no block left (False when it cannot tell)."""
    with contextlib.suppress(OSError):
        info = os.statvfs(folder)
        return info.f_bavail * info.f_frsize < 64 * 1024
    return False
