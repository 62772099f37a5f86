"""One command's process as exec runs it: started, its output read, its exit seen, and its
whole process group stopped.

Started with `subprocess.Popen` (vfork and exec, about a millisecond, whatever the size of
the gateway) on the sandbox's launcher thread (`_launcher`), rather than the event loop's
`subprocess_exec`: uvloop's forks the whole gateway and closes every descriptor up to the
open-files limit one by one in the child, several milliseconds per command (more as the
gateway grows), and asyncio's own starts a thread per command to wait for it. The output
pipe is read on the loop, the exit is seen through a pidfd (Linux 5.3+; elsewhere one thread
waits). The loop's child watchers wait for their own children by pid, never for this one.

`stop_group` is the contract of exec's end: the group SIGTERMed, a grace, SIGKILL, and the
return only once no process of the group (nor of the sandbox's PID namespace) runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from loguru import logger

from nanobot.tools._cgroups import Group
from nanobot.tools._launcher import Launcher, abandon

TERM_GRACE = 2.0  # seconds between SIGTERM and SIGKILL
KILL_WAIT = 2.0  # seconds for SIGKILLed processes to be gone
_GROUP_POLL: Final = 0.05
_ENDED: Final = ("Z", "X")  # /proc states: zombie (exited, not yet reaped), dead


class Output(asyncio.Protocol):
    """A command's combined output (first `limit` bytes kept) and when its pipe closed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.dropped = 0
        self.closed = asyncio.Event()  # every holder of the pipe is gone

    def data_received(self, data: bytes) -> None:
        # Always read, also past the limit: a child blocked on a full pipe never finishes.
        room = max(0, self.limit - len(self.kept))
        self.kept += data[:room]
        self.dropped += max(0, len(data) - room)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[... {self.dropped} more bytes of output not shown]"
        return text or "(no output)"


class Process:
    """A started command: `pid` (also its process group's id), `output`, `exited` (set once
    the process itself has exited and been reaped) and `returncode` (negative: the signal).

    Made by `start`; `close` when done with it (idempotent): it stops reading the pipe.
    """

    def __init__(self, popen: subprocess.Popen[bytes], output: Output) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.output = output
        self.exited = asyncio.Event()
        self._pipe: asyncio.ReadTransport | None = None
        self._pidfd: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._popen.stdout is not None
        self._pipe, _ = await loop.connect_read_pipe(lambda: self.output, self._popen.stdout)
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
            loop.run_in_executor(None, self._wait_blocking, loop)
            return
        loop.add_reader(self._pidfd, self._reap, loop)

    def _reap(self, loop: asyncio.AbstractEventLoop) -> None:
        self._forget_pidfd(loop)
        self._popen.poll()
        self.exited.set()

    def _wait_blocking(self, loop: asyncio.AbstractEventLoop) -> None:
        self._popen.wait()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self.exited.set)

    def _forget_pidfd(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._pidfd is not None:
            loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def close(self) -> None:
        """Stop reading the output and watching the exit (a process still running is
        reaped by nobody until then: call it once the group is stopped)."""
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        if self._pidfd is not None:
            self._popen.poll()
            self._forget_pidfd(asyncio.get_running_loop())


async def start(
    argv: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    limit: int,
    pass_fds: Sequence[int] = (),
    *,
    launcher: Launcher,
    group: Group | None = None,
) -> Process:
    """Start `argv` from `launcher` (inside `group` where a thread can join it) in a new
    session (its pid is its process group's), stdin from /dev/null, stdout and stderr into
    one pipe kept by an `Output` of `limit` bytes.

    Raises OSError when it cannot start. Cancelled, it kills and reaps what it started
    before CancelledError propagates.
    """
    loop = asyncio.get_running_loop()
    popen = await launcher.popen(
        list(argv),
        group,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )
    process = Process(popen, Output(limit))
    watching = loop.create_task(process._watch(loop), name="exec watch start")
    try:
        await asyncio.shield(watching)
    except asyncio.CancelledError:
        while not watching.done():
            with contextlib.suppress(asyncio.CancelledError):  # a second one as well
                await asyncio.wait([watching])
        if watching.cancelled() or watching.exception() is not None:
            await abandon(popen)
        else:
            try:
                await stop_group(process.pid, process)
            finally:
                process.close()
        raise
    except BaseException:
        await abandon(popen)
        raise
    return process


async def stop_group(pgid: int, process: Process) -> None:
    """SIGTERM the process group, give it TERM_GRACE to go, SIGKILL it; return once the
    process has exited and no process of the group is running, nor of the sandbox's PID
    namespace if the sandbox was still running; or after KILL_WAIT more, with a warning.

    Safe to cancel: SIGKILL is sent synchronously whatever happens; only the wait is cut
    short.
    """
    loop = asyncio.get_running_loop()
    # Only while bwrap runs can its namespace's init be found: then it is bwrap's child.
    inits = () if process.exited.is_set() else namespace_inits(pgid)
    try:
        if _signal_group(pgid, signal.SIGTERM):
            await _ended(pgid, inits, loop.time() + TERM_GRACE)
    finally:
        _signal_group(pgid, signal.SIGKILL)
    await process.exited.wait()
    if not await _ended(pgid, inits, loop.time() + KILL_WAIT):
        logger.warning("exec: processes of command {} outlived SIGKILL by {} s", pgid, KILL_WAIT)


async def _ended(pgid: int, inits: Sequence[int], deadline: float) -> bool:
    """Wait until `_running(pgid, inits)` is false, by `deadline` (loop time)."""
    loop = asyncio.get_running_loop()
    # Grandchildren are not our children: there is nothing to wait on but polling.
    while _running(pgid, inits):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_GROUP_POLL)
    return True


def _running(pgid: int, inits: Sequence[int]) -> bool:
    """Whether a process of the group, or one of `inits` (whose namespace ends before they
    do), still runs. A zombie does not: it has ended, and an orphan waits for the host's
    init to reap it, which can take seconds. Without /proc (not Linux), whatever signal 0
    reaches counts as running."""
    if any(_state(pid)[0] not in _ENDED for pid in inits):
        return True
    if not _signal_group(pgid, 0):
        return False
    try:
        pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    except OSError:
        return True
    return any(state not in _ENDED and group == pgid for state, group in map(_state, pids))


def _state(pid: int) -> tuple[str, int]:
    """(state, process group) of `pid`, from /proc; ("X", 0) when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[2])
    except (OSError, IndexError, ValueError):
        return "X", 0


def namespace_inits(pid: int) -> tuple[int, ...]:
    """The children of `pid` that are PID 1 of a namespace of their own: bubblewrap's
    sandbox, whose init the kernel lets exit only once every other process in it is gone.
    Empty where /proc does not tell (not Linux)."""
    inits: list[int] = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return ()
    for child in children:
        try:
            status = Path(f"/proc/{child}/status").read_text()
        except OSError:  # exited meanwhile
            continue
        for line in status.splitlines():
            fields = line.split()  # "NSpid: <pid here> ... <pid in its own namespace>"
            if fields[:1] == ["NSpid:"] and len(fields) > 2 and fields[-1] == "1":
                inits.append(int(child))
    return tuple(inits)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the group; False when no process is left in it."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # only zombies left (seen on macOS)
        return False
    return True
