"""The fake MCP server (`tests/fakes/mcp_server.py`) over HTTP, as a subprocess of the test::

    async with serve_http("--auth", "s3cret") as url:        # http://127.0.0.1:<port>/mcp
        ...
    async with serve_http(transport="sse") as url:           # http://127.0.0.1:<port>/sse
        ...

The server writes its URL into a pipe it is handed as `--url-file /dev/fd/N` once its port
listens; the pipe ends early (EOF) if it exits first, so a server that fails to start fails the
test at once with its exit status rather than after a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

SCRIPT = Path(__file__).with_name("mcp_server.py")
STOP_SECONDS = 5.0


@asynccontextmanager
async def serve_http(
    *options: str, transport: Literal["http", "sse"] = "http", start_seconds: float = 30.0
) -> AsyncIterator[str]:
    """Start the fake with `--transport <transport> --port 0` and `options` (e.g. "--auth",
    "TOKEN"); yield its URL once it listens. On exit: SIGTERM, and SIGKILL after 5 s.

    Raises RuntimeError if the server exits, or does not listen within `start_seconds`."""
    read_end, write_end = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            *("--transport", transport, "--port", "0", "--url-file", f"/dev/fd/{write_end}"),
            *options,
            pass_fds=(write_end,),
        )
    finally:
        os.close(write_end)  # from here on only the server holds it: EOF when it exits
    try:
        url = await _read_url(read_end, process, start_seconds)
        yield url
    finally:
        await stop(process)


async def _read_url(read_end: int, process: asyncio.subprocess.Process, seconds: float) -> str:
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_end, "rb")
    )
    try:
        async with asyncio.timeout(seconds):
            line = await reader.readline()
    except TimeoutError:
        raise RuntimeError(f"the fake MCP server did not listen within {seconds} s") from None
    finally:
        transport.close()
    if not line.endswith(b"\n"):
        status = await process.wait()
        raise RuntimeError(f"the fake MCP server exited ({status}) before it listened")
    return line.decode().strip()


async def stop(process: asyncio.subprocess.Process) -> int:
    """SIGTERM `process`, SIGKILL it if it still runs after 5 s; returns its exit status."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(STOP_SECONDS):
            return await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        return await process.wait()
