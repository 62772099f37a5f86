"""A throwaway PostgreSQL server, for a test that restarts or stops its database: nobody
else uses it, so nothing else breaks when it goes down.

`throwaway_server()` runs `initdb` into a new temporary folder (trust authentication, the
superuser `postgres`, no fsync: nothing here outlives the test) and starts the server
listening on 127.0.0.1 only, its unix socket in that folder; the block's end stops it
(immediately) and removes the folder, however the block ends. A process killed with -9
leaves the server running: the folder's `data/postmaster.pid` names it.

The binaries are found through `pg_config --bindir`, else `initdb` on the PATH, else the
newest `/usr/lib/postgresql/*/bin` (Debian's layout). initdb and postgres refuse to run as
root: as root both run as the OS user `postgres`, and the folder is made theirs. Where no
initdb is found, or it cannot run, the test is skipped with one line saying why.

The port: one below the kernel's ephemeral range (`ip_local_port_range`), free when probed
and taken by the server a moment later; a server that finds it taken meanwhile (another
throwaway server chose it too) starts again on another. Not one the kernel hands out
(`bind(("127.0.0.1", 0))`, as the fakes' `free_port()` does): any outgoing connection may be
given that one, and a `restart()` must get its port back after a few milliseconds without
it, since the clients' URLs name it.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import random
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

HOST: Final = "127.0.0.1"
SUPERUSER: Final = "postgres"
OS_USER: Final = "postgres"  # who runs the server when this process is root
LOWEST_PORT: Final = 10000
START_TRIES: Final = 5
_TAKEN: Final = ("could not bind", "could not create any TCP/IP sockets")  # the port, in its log
_SETTINGS: Final = "throwaway.conf"  # in the data directory: where it listens


class ServerError(RuntimeError):
    """The server would not start, restart or stop; the message ends with its log's tail."""


@dataclass(frozen=True)
class PgServer:
    """A running throwaway server (see the module); made by `throwaway_server()`."""

    bindir: Path
    root: Path  # the temporary folder: the data directory, the socket, the log
    port: int
    os_user: str | None  # who runs it; None: this process's user

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        """The URL of `database` on this server, over TCP, as the superuser."""
        return f"postgresql://{SUPERUSER}@{HOST}:{self.port}/{database}"

    async def restart(self) -> None:
        """Stop the server as an operator would (`-m fast`: every session ended, clients
        refused meanwhile) and start it again on the same port; returns once it accepts
        connections. Raises `ServerError`."""
        await self._pg_ctl("restart", "-m", "fast", "-l", str(self.log))

    async def stop(self) -> None:
        """Stop the server at once (`-m immediate`); idempotent. Raises `ServerError`."""
        if (self.data / "postmaster.pid").exists():
            await self._pg_ctl("stop", "-m", "immediate")

    async def _pg_ctl(self, *args: str) -> None:
        code, output = await _run(
            [str(self.bindir / "pg_ctl"), *args, "-w", "-t", "60", "-D", str(self.data)],
            self,
        )
        if code != 0:
            raise ServerError(f"pg_ctl {args[0]} failed ({output.strip()}): {self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])


@asynccontextmanager
async def throwaway_server() -> AsyncIterator[PgServer]:
    """A new server, running for the block, stopped and removed after it (see the module).

    Skips the test where no initdb is found or it cannot run; raises `ServerError` where
    the server it made will not start."""
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("no throwaway PostgreSQL server: no initdb (pg_config --bindir, PATH)")
    os_user = _os_user()
    root = Path(tempfile.mkdtemp(prefix="nanobot-pg-"))
    try:
        if os_user is not None:
            entry = pwd.getpwnam(os_user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        server = PgServer(bindir, root, 0, os_user)
        await _initdb(server)
        server = await _start(server)
        try:
            yield server
        finally:
            await server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def find_bindir() -> Path | None:
    """The folder holding `initdb` and `pg_ctl`, or None."""
    candidates: list[Path] = []
    if pg_config := shutil.which("pg_config"):
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if found.returncode == 0 and found.stdout.strip():
            candidates.append(Path(found.stdout.strip()))
    if initdb := shutil.which("initdb"):
        candidates.append(Path(initdb).resolve().parent)
    versions = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(versions, key=_version, reverse=True)
    for folder in candidates:
        if all(os.access(folder / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def _version(bindir: Path) -> list[int]:
    """`/usr/lib/postgresql/15/bin`'s version, as numbers to compare."""
    return [int(n) for n in re.findall(r"\d+", bindir.parent.name)]


def _os_user() -> str | None:
    """Who must run initdb and the server: nobody in particular, unless this is root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        pytest.skip(f"no throwaway PostgreSQL server: as root it needs an OS user {OS_USER!r}")
    return OS_USER


async def _initdb(server: PgServer) -> None:
    code, output = await _run(
        [
            str(server.bindir / "initdb"),
            "--auth=trust",
            f"--username={SUPERUSER}",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
            "--no-instructions",
            "-D",
            str(server.data),
        ],
        server,
    )
    if code != 0:
        last = output.strip().splitlines()[-1:] or ["no output"]
        pytest.skip(f"no throwaway PostgreSQL server: initdb failed ({last[0]})")
    with (server.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
        conf.write(f"include '{_SETTINGS}'\n")  # last: it wins over what initdb wrote


async def _start(server: PgServer) -> PgServer:
    """`server` started on a free port (see the module), tried again on another while the
    one it chose turns out taken."""
    for _ in range(START_TRIES):
        started = PgServer(server.bindir, server.root, _free_port(), server.os_user)
        _configure(started)
        started.log.unlink(missing_ok=True)  # what it says is about this try only
        try:
            await started._pg_ctl("start", "-l", str(started.log))
        except ServerError:
            if not any(taken in started.log_tail(20) for taken in _TAKEN):
                raise
            continue
        return started
    raise ServerError(f"no free port in {START_TRIES} tries: {server.log_tail()}")


def _configure(server: PgServer) -> None:
    """Write where the server listens; `restart()` reads it again, so it keeps its port."""
    settings = {
        "listen_addresses": HOST,
        "port": str(server.port),
        "unix_socket_directories": str(server.root),
        "fsync": "off",
    }
    (server.data / _SETTINGS).write_text(
        "".join(f"{name} = '{value}'\n" for name, value in settings.items()), encoding="utf-8"
    )


def _free_port() -> int:
    """A port below the ephemeral range that nothing listens on now."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    while True:
        port = random.randrange(LOWEST_PORT, max(low, LOWEST_PORT + 1000))
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        return port


async def _run(command: list[str], server: PgServer) -> tuple[int, str]:
    """Run `command` as the server's OS user, in its folder; its exit code and output."""
    as_user: dict[str, Any] = {}
    if server.os_user is not None:
        entry = pwd.getpwnam(server.os_user)
        as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            cwd=server.root,  # the server's user may not enter this process's
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            **as_user,
        )
    except OSError as exc:
        return 127, str(exc)
    try:
        output, _ = await process.communicate()
    except BaseException:
        with suppress(ProcessLookupError):
            process.kill()
        raise
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")
