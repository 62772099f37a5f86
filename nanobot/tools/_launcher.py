"""Where exec's commands are started from: a thread of the gateway of their own, which has
joined the sandbox's network namespace and, on cgroup v1, joins each command's group for
the moment of its start.

A new process is born in the network namespace and the control groups of the thread that
forks it. Started from this thread, a command is in both from its first instruction, with no
program in front of it: `nsenter` and a shell that joins the group cost about a millisecond
each per command, and a group joined from outside (writing the command's pid) waits for the
kernel's RCU grace period, up to 15 ms under load.

- The network namespace: `setns` on the thread, once. It takes CAP_SYS_ADMIN in the host's
  user namespace, i.e. root; otherwise `in_namespace` is False and the sandbox starts
  commands through `nsenter` (`NetworkNamespace.enter`).
- The group: cgroup v1's `tasks` moves one thread, and the thread moves back when the start
  is done. cgroup v2 moves whole processes (the gateway, here): there the sandbox's init
  joins its group at bubblewrap's gate (`limit_scope.Scope.hold`), or without a sandbox a shell in
  front (`limit_scope.Scope.outer`).

The thread does nothing else: nothing but the start runs in its namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from loguru import logger

from nanobot.tools._cgroups import Group

_CLONE_NEWNET: Final = 0x40000000


class Launcher:
    """One thread that starts commands (see the module docstring). `close` at shutdown."""

    def __init__(self, network: int | None = None) -> None:
        """`network`: a descriptor of the network namespace to start commands in (used
        once, here; the caller keeps it). Blocking: joins it on the thread."""
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="nanobot-exec-start")
        self.in_namespace = False
        self.thread_id: int = self._pool.submit(threading.get_native_id).result()
        if network is not None:
            self.in_namespace = self._pool.submit(_join_network, network).result()

    async def popen(
        self, argv: list[str], group: Group | None, **options: Any
    ) -> subprocess.Popen[bytes]:
        """`subprocess.Popen(argv, **options)` on the thread, inside `group` where a thread
        can join it alone (see `Group.by_thread`).

        Raises OSError when it cannot start. Cancelled, it still waits for the start and
        then kills and reaps what it started before CancelledError propagates.
        """
        starting = asyncio.get_running_loop().run_in_executor(
            self._pool, _start, argv, group, options
        )
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            while not starting.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([starting])
            if not starting.cancelled() and starting.exception() is None:
                await abandon(starting.result())
            raise

    def close(self) -> None:
        """Let the thread end (it starts nothing more). Idempotent."""
        self._pool.shutdown(wait=False)


@functools.cache
def default() -> Launcher:
    """The launcher of sandboxes without a network namespace of their own (made at first
    use; its thread, idle, ends with the process)."""
    return Launcher()


async def abandon(popen: subprocess.Popen[bytes]) -> None:
    """Kill a started command's whole group (its pid is the group's: it starts a session),
    close its pipes and reap it, off the loop."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, 9)
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            pipe.close()
    await asyncio.to_thread(popen.wait)


def _start(
    argv: list[str], group: Group | None, options: dict[str, Any]
) -> subprocess.Popen[bytes]:
    if group is None or not group.by_thread:
        return subprocess.Popen(argv, **options)
    try:
        for joins in group.joins:
            joins.write_text("0")  # this thread alone
        return subprocess.Popen(argv, **options)
    finally:
        for home in group.tree.threads_home:
            try:
                home.write_text("0")
            except OSError as exc:  # the next start joins its own group first all the same
                logger.warning("exec: the start thread could not leave {}: {}", home, exc)


def _join_network(fd: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.setns(fd, _CLONE_NEWNET) == 0)
