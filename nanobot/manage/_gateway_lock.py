"""The lock a running gateway holds on its data dir, and how a command sees who holds it."""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

GATEWAY_LOCK = "gateway.lock"
"""The file in the data dir that a running gateway holds locked (`nanobot.launch` takes it;
this module must not import the app). It holds the gateway's pid, then its member id."""


def lock_holder(fd: int) -> str:
    """The pid written in the open gateway lock file `fd` ("unknown" if none is)."""
    words = os.pread(fd, 100, 0).decode("ascii", "replace").split()
    return words[0] if words else "unknown"


@dataclass(frozen=True, slots=True)
class Holder:
    """The gateway holding a data dir's lock: its pid, and its member id in the state
    database ("" while it starts, before it has registered)."""

    pid: str
    member: str


def gateway_pid(data_dir: Path) -> str | None:
    """The pid of the gateway running on `data_dir`, or None when none is."""
    holder = lock_holder_of(data_dir)
    return None if holder is None else holder.pid


def lock_holder_of(data_dir: Path) -> Holder | None:
    """The gateway running on `data_dir`, as its lock file names it; None when none runs.

    The gateway holds an exclusive `flock` on its lock file while it runs (the kernel drops
    it however the process ends). This takes a shared one for an instant to see whether it
    can: a gateway starting in that very instant would be refused and say so.
    """
    try:
        fd = os.open(data_dir / GATEWAY_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            words = os.pread(fd, 100, 0).decode("ascii", "replace").split()
            return Holder(words[0] if words else "unknown", words[1] if len(words) > 1 else "")
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
