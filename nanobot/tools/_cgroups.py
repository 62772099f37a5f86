"""Control groups for exec's commands: one group per command, with a memory and a process
limit that hold for the command and everything it starts, together.

Two backends, tried in order by `find()`:

- cgroup v2 with a delegated subtree (systemd's `Delegate=yes`): nanobot's own cgroup is
  writable and offers the memory and pids controllers. A cgroup v2 group with controllers
  enabled for its children may hold no process itself, so `claim()` moves nanobot into a
  leaf child (`gateway`) first, then enables the controllers; each command gets a sibling
  `exec-<pid>-<n>` with `memory.max`, `memory.swap.max` = 0 and `pids.max`.
- cgroup v1 (hybrid hosts and older ones) where the memory and pids hierarchies are writable
  at nanobot's place in them, which in practice means running as root: each command gets
  `nanobot-exec-<pid>-<n>` under nanobot's own group in each of the two hierarchies, with
  `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`, so no swap either) and
  `pids.max`. v1 has no rule against processes in inner groups, so nothing moves.

Groups are made under nanobot's own, never beside it: whatever limits nanobot itself runs
under still hold for its commands. All of it is blocking file-system work on the cgroup file
system, which the kernel answers in microseconds: callers run it in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final, Literal

_PROC_CGROUP: Final = Path("/proc/self/cgroup")
_MOUNTINFO: Final = Path("/proc/self/mountinfo")
_V2_LEAF: Final = "gateway"
_V1_PREFIX: Final = "nanobot-exec-"
_counter = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Tree:
    """Where command groups are made: `version` 2 (one directory holds both controllers) or
    1 (`memory` and `pids` are two hierarchies)."""

    version: Literal[1, 2]
    memory: Path
    pids: Path

    @property
    def threads_home(self) -> tuple[Path, ...]:
        """The files a thread writes `0` into to go back to nanobot's own groups (v1)."""
        return (self.memory / "tasks", self.pids / "tasks")

    @property
    def description(self) -> str:
        if self.version == 2:
            return f"cgroup v2 ({self.memory})"
        return f"cgroup v1 (memory {self.memory}, pids {self.pids})"


@dataclass(frozen=True, slots=True)
class Group:
    """One command's group: the directories its first process joins, and its limits."""

    tree: Tree
    memory: Path
    pids: Path

    @property
    def joins(self) -> tuple[Path, ...]:
        """The files a single-threaded process writes `0` (itself) into to join the group.

        On v1 that is `tasks`, which moves the writing thread alone: the kernel then skips
        the lock it takes to move a whole process, which waits for an RCU grace period (7 to
        15 ms per command, measured here). v2 moves processes only (`cgroup.procs`) and pays
        it, unless the hierarchy is mounted with `favordynmods`."""
        if self.tree.version == 2:
            return (self.memory / "cgroup.procs",)
        return (self.memory / "tasks", self.pids / "tasks")

    @property
    def by_thread(self) -> bool:
        """Whether one thread can join the group alone (v1's `tasks`), so that what it forks
        starts inside; v2 moves whole processes."""
        return self.tree.version == 1

    def events(self) -> tuple[int, int]:
        """(forks refused at pids.max, processes the OOM killer ended at the memory limit)
        so far: the kernel's counters, which only grow."""
        pids = _counter_in(self.pids / "pids.events", "max")
        if self.tree.version == 2:
            memory = _counter_in(self.memory / "memory.events", "oom_kill")
        else:
            memory = _counter_in(self.memory / "memory.oom_control", "oom_kill")
        return pids, memory

    def empty(self) -> bool:
        """Whether no process is in the group any more (one that has exited but is not yet
        reaped still is)."""
        for folder in {self.memory, self.pids}:
            try:
                if (folder / "cgroup.procs").read_text().strip():
                    return False
            except FileNotFoundError:
                pass
        return True

    def remove(self) -> bool:
        """Remove the group's directories; False while a process is still in it (the
        kernel refuses with EBUSY until the last one has been reaped)."""
        done = True
        for folder in {self.memory, self.pids}:
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                done = False
        return done


class Groups:
    """The command groups of one tree, each with the same limits, reused one command at a
    time: making and removing a memory cgroup costs more wall time than the command `true`
    (about 10 ms on cgroup v1, waiting on the kernel), taking an idle one nothing. A group
    is given back only once empty; its event counters carry on, so a command's events are
    the difference between its start and its end.

    `take` and `give_back` run in the event loop (they touch only the list, or make a group
    in a thread); `close` removes the idle groups, at shutdown.
    """

    def __init__(self, tree: Tree, *, memory: int | None, processes: int | None) -> None:
        self.tree = tree
        self._limits = {"memory": memory, "processes": processes}
        self._idle: list[Group] = []

    async def take(self) -> Group:
        """An idle group, or a new one. Raises OSError when none can be made."""
        if self._idle:
            return self._idle.pop()
        return await asyncio.to_thread(partial(make, self.tree, **self._limits))

    def give_back(self, group: Group) -> None:
        """Keep `group`, which must be empty, for the next command."""
        self._idle.append(group)

    def close(self) -> None:
        """Remove the idle groups. Blocking (rmdir on the cgroup file system)."""
        while self._idle:
            self._idle.pop().remove()


def find() -> Tree | None:
    """The cgroup tree nanobot may make command groups in, or None. Changes nothing."""
    own = _own_groups()
    mounts = {kind: (point, root) for kind, point, root in _mounts()}
    v2 = _folder(mounts.get("cgroup2"), own.get(""))
    if v2 is not None and _delegated_v2(v2):
        return Tree(2, v2, v2)
    memory = _folder(mounts.get("memory"), own.get("memory"))
    pids = _folder(mounts.get("pids"), own.get("pids"))
    if memory is None or pids is None:
        return None
    if all(os.access(d, os.W_OK | os.X_OK) for d in (memory, pids)):
        return Tree(1, memory, pids)
    return None


def _folder(mount: tuple[Path, str] | None, own: str | None) -> Path | None:
    """Where nanobot's group `own` (a path in the hierarchy) is in the file system, given
    the hierarchy's mount (its mount point, and which of its folders is mounted there, as a
    container mounts only its own part); None when it is not mounted or not visible."""
    if mount is None or own is None:
        return None
    point, root = mount
    inside = Path(own)
    if not inside.is_relative_to(root):
        return None
    return point / inside.relative_to(root)


def claim(tree: Tree) -> None:
    """Get `tree` ready for command groups: on v2, move nanobot's processes into a leaf
    child and enable the memory and pids controllers for children; on v1, remove the empty
    groups a nanobot that is gone left. Raises OSError when the kernel refuses."""
    if tree.version == 1:
        for folder in (tree.memory, tree.pids):
            for stale in folder.glob(f"{_V1_PREFIX}*"):
                if not _alive(stale.name.removeprefix(_V1_PREFIX).split("-")[0]):
                    with contextlib.suppress(OSError):
                        stale.rmdir()
        return
    for stale in tree.memory.glob("exec-*"):
        if not _alive(stale.name.removeprefix("exec-").split("-")[0]):
            with contextlib.suppress(OSError):
                stale.rmdir()
    leaf = tree.memory / _V2_LEAF
    leaf.mkdir(exist_ok=True)
    for pid in (tree.memory / "cgroup.procs").read_text().split():
        with contextlib.suppress(ProcessLookupError):  # exited meanwhile
            (leaf / "cgroup.procs").write_text(pid)
    (tree.memory / "cgroup.subtree_control").write_text("+memory +pids")


def make(tree: Tree, *, memory: int | None, processes: int | None) -> Group:
    """A new, empty group for one command with these limits (None: not limited).

    Raises OSError when it cannot be made; nothing is left behind then."""
    name = f"{_V1_PREFIX if tree.version == 1 else 'exec-'}{os.getpid()}-{next(_counter)}"
    group = Group(tree, tree.memory / name, tree.pids / name)
    try:
        for folder in {group.memory, group.pids}:
            folder.mkdir()
        if memory is not None:
            if tree.version == 2:
                _write(group.memory / "memory.max", memory)
                _write(group.memory / "memory.swap.max", 0, optional=True)
                # The OOM killer ends the whole command, not one process the rest depends on.
                _write(group.memory / "memory.oom.group", 1, optional=True)
            else:
                _write(group.memory / "memory.limit_in_bytes", memory)
                _write(group.memory / "memory.memsw.limit_in_bytes", memory, optional=True)
        if processes is not None:
            _write(group.pids / "pids.max", processes)
    except OSError:
        group.remove()
        raise
    return group


def _alive(pid: str) -> bool:
    """Whether the nanobot that made a group (its pid, from the group's name) still runs:
    another's groups, empty between their making and their command joining, are not stale."""
    return not pid.isdigit() or Path(f"/proc/{pid}").exists()


def _delegated_v2(folder: Path) -> bool:
    """Whether nanobot may make groups with the memory and pids controllers under `folder`."""
    try:
        controllers = (folder / "cgroup.controllers").read_text().split()
    except OSError:
        return False
    writable = all(
        os.access(folder / name, os.W_OK) for name in ("cgroup.procs", "cgroup.subtree_control")
    )
    return {"memory", "pids"} <= set(controllers) and writable and os.access(folder, os.W_OK)


def _own_groups() -> dict[str, str]:
    """nanobot's group in each hierarchy: controller name (or "" for v2) -> path."""
    groups: dict[str, str] = {}
    try:
        lines = _PROC_CGROUP.read_text().splitlines()
    except OSError:
        return groups
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path
    return groups


def _mounts() -> Iterator[tuple[str, Path, str]]:
    """("cgroup2", mount point, mounted root) for the v2 mount, (controller, mount point,
    mounted root) for the v1 ones of memory and pids."""
    try:
        lines = _MOUNTINFO.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        if " - " not in line:
            continue
        before, after = line.split(" - ", 1)
        fields, described = before.split(), after.split()
        if len(described) < 3 or len(fields) < 5:
            continue
        fstype, options = described[0], described[2].split(",")
        root, point = fields[3], Path(fields[4])
        if fstype == "cgroup2":
            yield "cgroup2", point, root
        elif fstype == "cgroup":
            for controller in ("memory", "pids"):
                if controller in options:
                    yield controller, point, root


def _write(file: Path, value: int, *, optional: bool = False) -> None:
    try:
        file.write_text(str(value))
    except FileNotFoundError:  # swap accounting is off: there is no swap limit to set
        if not optional:
            raise


def _counter_in(file: Path, key: str) -> int:
    """The value of `key` in a flat "key value" file; 0 when the file or key is missing."""
    try:
        lines = file.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0
