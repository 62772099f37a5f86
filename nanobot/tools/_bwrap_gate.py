"""A gate that holds a bubblewrap sandbox once it is set up, before its command starts.

bubblewrap writes its sandbox's init's pid (as the host sees it) to `--info-fd` right after
making it, and that init, once the mounts are done, waits on `--block-fd` before it forks the
command. Meanwhile the gateway puts the init under the command's limits (its control group,
its rlimits: `limit_scope.Scope.hold`), which the command and everything it starts then inherit.
The alternative, a shell in front that joins the group and `prlimit` inside, costs two more
programs started per command (about 3 ms here).

Use: `args()` go into bubblewrap's options and `pass_fds` to the started process; then
`started()`, `await init()`, the limits, `release()`; `close()` in any case (idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os


class Gate:
    """The two pipes of one command's gate. Not reusable: one per command."""

    def __init__(self) -> None:
        # Python's pipes are close-on-exec: only the ends in pass_fds reach bubblewrap.
        self._info_read, self._info_write = os.pipe()
        self._block_read, self._block_write = os.pipe()
        self._parent_ends: list[int] = [self._info_read, self._block_write]
        self._child_ends: list[int] = [self._info_write, self._block_read]

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._info_write, self._block_read)

    def args(self) -> list[str]:
        """bubblewrap's options for this gate."""
        return ["--info-fd", str(self._info_write), "--block-fd", str(self._block_read)]

    def started(self) -> None:
        """Close this process's copies of bubblewrap's ends, once it has started (so its
        exit is an end of file here, and it cannot wait on itself)."""
        _close(self._child_ends)

    async def init(self) -> int | None:
        """The host pid of the sandbox's init, read from bubblewrap's info; None when
        bubblewrap ended (or closed the pipe) without saying. May be cancelled."""
        loop = asyncio.get_running_loop()
        os.set_blocking(self._info_read, False)
        chunks: list[bytes] = []
        done: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            try:
                chunk = os.read(self._info_read, 4096)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if chunk:
                chunks.append(chunk)
            elif not done.done():
                done.set_result(None)

        loop.add_reader(self._info_read, readable)
        try:
            await done
        finally:
            loop.remove_reader(self._info_read)
        try:
            pid = json.loads(b"".join(chunks))["child-pid"]
        except (ValueError, KeyError, TypeError):
            return None
        return pid if isinstance(pid, int) and pid > 0 else None

    def release(self) -> None:
        """Let the command start."""
        if self._block_write in self._parent_ends:
            with contextlib.suppress(OSError):  # bubblewrap already gone
                os.write(self._block_write, b"1")
        self.close()

    def close(self) -> None:
        """Close every end. A closed gate lets the command start as `release` does (an end of
        file): close a gate that was not released only once its sandbox is stopped."""
        _close(self._parent_ends)
        _close(self._child_ends)


def _close(fds: list[int]) -> None:
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())
