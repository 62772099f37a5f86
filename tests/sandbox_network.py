"""The sandbox's own network for tests: the shared namespace and the egress proxy, as the
gateway makes them (`app.open_sandbox`), on the test's event loop; and far hosts (a LAN and
a cloud metadata address) in a network namespace of their own, where root can make one."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from nanobot.allowed_hosts import AllowedHost
from nanobot.tools.egress import EgressProxy
from nanobot.tools.netns import NetworkNamespace
from nanobot.tools.sandbox import Network


@asynccontextmanager
async def public_network(allow_hosts: Sequence[str] = ()) -> AsyncIterator[Network]:
    """A namespace with its proxy serving it; both closed on exit."""
    namespace = NetworkNamespace.create()
    proxy = EgressProxy(namespace.listener, allow_hosts=[AllowedHost.parse(h) for h in allow_hosts])
    await proxy.start()
    try:
        yield Network.of(namespace, proxy)
    finally:
        await proxy.close()
        namespace.close()


@dataclass(frozen=True)
class Far:
    """A LAN host and a cloud metadata host, each serving `SECRET` over HTTP on `port`."""

    lan: str
    metadata: str
    port: int
    log: Path  # the server's request log

    SECRET = "FAR-HOST-SECRET"

    def requests(self) -> int:
        """How many requests reached the far hosts so far."""
        return self.log.read_text().count('"GET ')


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def far_hosts_made(tmp_path: Path) -> Iterator[Far]:
    """A network namespace made for the test, reached from the host over a veth pair: a LAN
    address (10.x.y.5, x and y from the pid so parallel runs do not collide) and the cloud
    metadata address 169.254.169.254 (one test at a time holds it: a lock file)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a LAN and a metadata host need root and iproute2 (ip netns)")
    lock = (Path(tempfile.gettempdir()) / "nanobot-test-metadata.lock").open("w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    tag = f"{os.getpid() % 10000}"
    ns, outer, inner = f"nbt{tag}", f"nbh{tag}", f"nbn{tag}"
    subnet = f"10.{os.getpid() % 200 + 20}.{os.getpid() // 200 % 250}"
    (tmp_path / "far").mkdir()
    (tmp_path / "far" / "index.html").write_text(Far.SECRET)
    server: subprocess.Popen[str] | None = None
    log = (tmp_path / "far.log").open("w")
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns)
        _ip("addr", "add", f"{subnet}.1/24", "dev", outer)
        _ip("link", "set", outer, "up")
        _ip("-n", ns, "addr", "add", f"{subnet}.5/24", "dev", inner)
        _ip("-n", ns, "addr", "add", "169.254.169.254/32", "dev", inner)
        _ip("-n", ns, "link", "set", inner, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("route", "replace", "169.254.169.254/32", "via", f"{subnet}.5", "dev", outer)
        server = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                ns,
                sys.executable,
                "-u",
                "-m",
                "http.server",
                "0",
                "--bind",
                "0.0.0.0",
                "--directory",
                str(tmp_path / "far"),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        assert server.stdout is not None
        ready = server.stdout.readline()  # "Serving HTTP on 0.0.0.0 port N ..."
        port = int(ready.split(" port ")[1].split()[0])
        yield Far(f"{subnet}.5", "169.254.169.254", port, tmp_path / "far.log")
    finally:
        if server is not None:
            server.kill()
            server.wait()
            assert server.stdout is not None
            server.stdout.close()
        log.close()
        for args in (
            ("route", "del", "169.254.169.254/32", "via", f"{subnet}.5"),
            ("link", "del", outer),
            ("netns", "del", ns),
        ):
            subprocess.run(["ip", *args], check=False, capture_output=True)
        lock.close()
