"""Runs a bare MCP server (`sandbox: none`) so that nothing it starts outlives it.

A script, run by path with nanobot's python before the server's own command line::

    python _reaper.py COMMAND [ARG...]

In the sandbox, the PID namespace ends every process of a server with it. A bare server has
no such bound: the SDK stops its process group, and whatever the server moved out of it
(`setsid`, a daemon's double fork) would live on. This process stays the server's parent, as
a child subreaper (Linux): whatever the server leaves behind is re-parented here, not to
init. When the server exits, or this process is asked to stop (SIGTERM, SIGINT, SIGHUP; or
SIGTERM when nanobot itself ends, even killed), it ends every process below it (SIGTERM, then
SIGKILL after GRACE seconds, within the SDK's two seconds before it kills the group) and
exits as the server did. It imports nothing but the standard library; elsewhere than Linux
it only runs the command.
"""

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE = 1.0
STOPS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: _reaper.py COMMAND [ARG...]\n")
        return 2
    if not sys.platform.startswith("linux"):
        os.execvp(argv[0], argv)
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getppid()
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    watched = {*STOPS, signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    if os.getppid() != parent:  # nanobot ended before the death signal was set
        return 1
    server = os.fork()
    if server == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        try:
            os.execvp(argv[0], argv)
        except OSError as error:
            sys.stderr.write(f"{argv[0]}: {error.strerror}\n")
        os._exit(127)
    # The pipes are the server's: held here too, they would hide its end from the SDK.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    status = _serve(server, watched)
    _end_all_below()
    return _exit_code(status)


def _serve(server: int, watched: set[signal.Signals]) -> int | None:
    """Wait for the server to exit (its wait status) or for a stop (then None)."""
    while True:
        if signal.sigwait(watched) in STOPS:
            return None
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 0
            if pid == 0:
                break
            if pid == server:
                return status


def _end_all_below() -> None:
    """SIGTERM every process below this one, SIGKILL what is left after GRACE, reap them;
    given up after twice GRACE (a process stuck in the kernel: the SDK's kill is next)."""
    start = time.monotonic()
    told: set[int] = set()
    while below := _descendants():
        late = time.monotonic() - start
        if late >= 2 * GRACE:
            return
        for pid in below:
            if late >= GRACE or pid not in told:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL if late >= GRACE else signal.SIGTERM)
                told.add(pid)
        time.sleep(0.01)
        _reap()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _descendants() -> list[int]:
    """The live processes below this one (as a subreaper, orphans included)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] in ("Z", "X"):  # ended, only not reaped yet
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _exit_code(status: int | None) -> int:
    if status is None:
        return 128 + signal.SIGTERM
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
