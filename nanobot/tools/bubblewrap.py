"""Commands in bubblewrap (`bwrap`), the sandbox exec uses on Linux: the argv that runs one
(its mounts from `_bwrap_layout.py`, the owner-only masks, held at its gate), its seccomp
filter, its share of the egress proxy, and the check that it runs here at all.

A command sees: the system directories read-only (`/usr`, `/bin`, `/lib*`, `/sbin`, `/etc`,
`/opt`), the install prefixes of the interpreters on the gateway's PATH read-only, without
anything under them that only its owner may read (checked at each call: see `_masks.py`),
the workspace read-write at its own path as the working directory, a fresh empty private
`HOME` (`/home/nanobot`, a tmpfs) and a private `/tmp`. Nothing else: not nanobot's data
dir, config file, state database or logs, not the user's home. It has its own PID namespace
with a fresh `/proc` (no `/proc/<gateway pid>/environ`), its own IPC and UTS namespaces, no
capabilities, no kernel keyring (a seccomp filter, `_seccomp.py`), and a new session (no
terminal injection).

The network (`tools.exec.network`): `public`, a network namespace shared by the commands
(`netns.py`) whose only way out is nanobot's egress proxy (`egress.py`: public addresses
only, plus `allow_hosts`); `none`, a namespace of its own per command with nothing in it;
`host`, the host's network, loopback services included.

Lifetime: bubblewrap's init is PID 1 of the namespace and exits when the command does; the
kernel then kills every process left in the namespace, whatever `setsid`, `nohup` or a double
fork did. `--die-with-parent` ties that init to the bwrap process nanobot started, so killing
that one process (timeout, /stop, nanobot exiting) ends everything inside.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from nanobot.tools._bwrap_gate import Gate
from nanobot.tools._bwrap_layout import layout as bwrap_layout
from nanobot.tools._bwrap_layout import person_tail
from nanobot.tools._launcher import Launcher
from nanobot.tools._launcher import default as default_launcher
from nanobot.tools._masks import OwnerOnlyMasks
from nanobot.tools._seccomp import keyring_filter
from nanobot.tools.sandbox import Confinement, Network, Sandbox, SandboxCall, SandboxUnavailable

HOME: Final = Path("/home/nanobot")
_SPARE_HOME: Final = Path("/run/nanobot-home")  # when the workspace or a hidden path is in HOME
PROBE_TIMEOUT: Final = 10.0


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
            path_env=os.pathsep.join(
                e for e in (os.environ.get("PATH", ""), *confinement.programs) if e
            ),
            home=Path(self.home),
            tmp_size=confinement.tmp_size,
        )
        self.path = os.pathsep.join(layout.visible) or "/usr/local/bin:/usr/bin:/bin"
        self._head, self._tail = layout.head, layout.tail
        self._tails: dict[Path, list[str]] = {}
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
        person: Path | None = None,
    ) -> list[str]:
        tail = self._tail if person is None else self._person_tail(person)
        return self._argv(argv, call, self._masks.args(), gate, launched=launched, tail=tail)

    def _person_tail(self, person: Path) -> list[str]:
        """The binds after the masks for a command of `person` (kept per folder)."""
        tail = self._tails.get(person)
        if tail is None:
            tail = person_tail(
                self.confinement.workspace,
                person,
                self.confinement.hidden,
                home=Path(self.home),
                tmp_size=self.confinement.tmp_size,
            )
            self._tails[person] = tail
        return tail

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
        tail: Sequence[str] | None = None,
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
            *(self._tail if tail is None else tail),
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
            run_checked(argv, "a test command in the sandbox", pass_fds=fds)

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


def run_checked(argv: list[str], what: str, *, pass_fds: Sequence[int] = ()) -> str:
    """What `argv` printed, run with a bare PATH within PROBE_TIMEOUT.

    Raises:
        SandboxUnavailable: it could not run, or failed (with what it said).
    """
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
