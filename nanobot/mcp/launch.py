"""How a stdio MCP server is started: its command inside exec's sandbox (or bare, where the
config says `sandbox: none`), with an environment of its own.

The server sees PATH, HOME (the sandbox's), LANG, the sandbox's proxy variables where its
network is nanobot's egress proxy, and exactly the `env` its config gives: nothing of
nanobot's own environment (the SDK's stdio client adds the user's LOGNAME, SHELL, TERM and
USER, the shell before bubblewrap PWD; the server's command line takes them away again with
`env -u`). Secrets travel in the environment only, never on a command line another local
user could read in `ps`.

A sandboxed server's processes end with its PID namespace; a bare one runs under
`_reaper.py`, which ends whatever the server started when it exits or is stopped.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nanobot.mcp.settings import ServerSettings
from nanobot.tools.bubblewrap import Bubblewrap
from nanobot.tools.sandbox import Sandbox, SandboxCall, Unavailable

# What the SDK's stdio client passes on from nanobot's environment, besides PATH and HOME;
# and PWD, which the shell that hands bubblewrap its filter exports.
_INHERITED = ("LOGNAME", "SHELL", "TERM", "USER", "PWD")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_REAPER = Path(__file__).with_name("_reaper.py")
# bubblewrap reads its seccomp filter from a descriptor; the SDK starts the server with only
# its three pipes, so a shell opens the filter as descriptor 3 and then becomes bubblewrap.
_WITH_FILTER = 'exec 3<"$0" || exit 126; exec "$@"'


class NotStartable(Exception):
    """This server cannot be started here; the message says why (for the log and `mcp list`)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """The process to start (`argv`, `env`, `cwd`), and whether it runs bare."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    bare: bool


def launch(
    name: str,
    server: ServerSettings,
    workspace: Path,
    sandbox: Sandbox | None,
    call: SandboxCall | None,
    *,
    hiding: Sequence[Path] = (),
) -> Launch:
    """The command that starts `server` (a stdio one) in `sandbox`, for the lifetime of
    `call` (the sandbox's per-command share: its seccomp filter, its proxy credentials),
    with the workspace's folders `hiding` (relative to it: `people`, where people are kept
    apart) covered by an empty one. A bare server sees them: nothing hides them from it.

    Raises:
        NotStartable: the server asks for the sandbox (`sandbox: auto`) and none works here
            (or exec's is `none` by the owner's choice: that choice is for exec, not for
            servers), or its `cwd` leaves the workspace or lies in a folder it may not see.
    """
    assert server.command is not None
    folder = _folder(name, server, workspace, hiding)
    env_tool = shutil.which("env") or "/usr/bin/env"
    inner = [env_tool, *(arg for var in _INHERITED for arg in ("-u", var))]
    inner += ["-C", str(folder), server.command, *server.args]
    given = dict(server.env)
    lang = os.environ.get("LANG") or "C.UTF-8"
    if server.sandbox == "none":
        home = os.environ.get("HOME") or str(workspace)
        path = os.environ.get("PATH") or _DEFAULT_PATH
        env = {"PATH": path, "HOME": home, "LANG": lang, **given}
        # No PID namespace ends what it starts: the reaper does (see _reaper.py).
        # -I: the server's own PYTHON* variables are not the reaper's.
        reaper = (sys.executable, "-I", str(_REAPER))
        return Launch((*reaper, *inner), env, str(folder), bare=True)
    if not isinstance(sandbox, Bubblewrap) or call is None:
        raise NotStartable(_why_no_sandbox(name, sandbox))
    fds = call.pass_fds
    shared = SandboxCall(call.env, (3,) if fds else (), call.egress)
    argv = sandbox.command(inner, call=shared, hiding=hiding)
    if fds:
        argv = ["/bin/sh", "-c", _WITH_FILTER, f"/proc/{os.getpid()}/fd/{fds[0]}", *argv]
    env = {"PATH": sandbox.path, "LANG": lang, **call.env, **given}
    return Launch(tuple(argv), env, str(workspace), bare=False)


def _folder(name: str, server: ServerSettings, workspace: Path, hiding: Sequence[Path]) -> Path:
    root = Path(os.path.realpath(workspace))
    if server.cwd is None:
        return root
    folder = Path(os.path.realpath(root / server.cwd))
    if not folder.is_relative_to(root):
        raise NotStartable(
            f"mcp.servers.{name}.cwd ({server.cwd}) is outside the workspace ({root})"
        )
    if any(folder.is_relative_to(root / hidden) for hidden in hiding):
        raise NotStartable(
            f"mcp.servers.{name}.cwd ({server.cwd}) is in people's own folders, which MCP "
            "servers do not see (people.isolation: person)"
        )
    if not folder.is_dir():
        raise NotStartable(f"mcp.servers.{name}.cwd ({folder}) is not a folder")
    return folder


def _why_no_sandbox(name: str, sandbox: Sandbox | None) -> str:
    hint = (
        f"it is not started bare: set mcp.servers.{name}.sandbox: none to run it with "
        "nanobot's own rights"
    )
    if isinstance(sandbox, Unavailable):
        return f"no sandbox can run here ({sandbox.reason}); {hint}"
    if sandbox is not None and not sandbox.confined:
        return f"tools.exec.sandbox is none, so there is no sandbox for it; {hint}"
    return f"no sandbox is available; {hint}"
