"""How a stdio MCP server is started (`nanobot.mcp.launch`): in exec's bubblewrap sandbox with
an environment of its own, bare only where its config says `sandbox: none`, never bare where
the sandbox cannot run.

The containment tests start the fake (`probe`, `environ`, `whoami`: what a malicious server
would try) in the real sandbox, laid out as a user's installation: a home with a private key,
the data dir with the config, the state database and the logs, the workspace inside it, and
nanobot's own environment holding a key. Without a working bubblewrap they are skipped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import nanobot.mcp.launch as launch_module
from nanobot.mcp.connection import Connection, State
from nanobot.mcp.launch import NotStartable, launch
from nanobot.mcp.settings import ServerSettings
from nanobot.tools.bubblewrap import HOME, Bubblewrap
from nanobot.tools.sandbox import (
    Confinement,
    SandboxUnavailable,
    Unavailable,
    Unconfined,
    probe,
)
from tests._mcp import eventually, log_lines, processes_with, running, servers_with
from tests.fakes.mcp_http import SCRIPT

CONFIG_SECRET = "sk-config-secret-0123456789abcdef"
DB_SECRET = "OTHER-CHAT: my PIN is 4711"
HOME_SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- HOME-SECRET"
NANOBOT_SECRET = "sk-ant-nanobots-own-environment-key"
SERVER_SECRET = "srvvalue-9c2e71b0d4"
INHERITED = ("LOGNAME", "SHELL", "TERM", "USER", "PWD")


@dataclass
class Install:
    home: Path
    data: Path
    config: Path
    db: Path
    logs: Path
    workspace: Path
    script: Path  # the fake, where the sandbox shows it: in the workspace

    def hidden(self) -> tuple[Path, ...]:
        return (self.data, self.db, self.logs, self.config)


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Install:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(HOME_SECRET)
    data = home / ".nanobot"
    (data / "logs").mkdir(parents=True)
    (data / "logs" / "nanobot.log").write_text(f"logged {CONFIG_SECRET}")
    config = data / "config.yaml"
    config.write_text(f"agent:\n  api_key: {CONFIG_SECRET}\n")
    db = data / "state.db"
    db.write_text(DB_SECRET)
    workspace = data / "workspace"
    workspace.mkdir()
    script = workspace / "mcp_server.py"
    shutil.copy(SCRIPT, script)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANTHROPIC_API_KEY", NANOBOT_SECRET)
    for name, value in zip(INHERITED, ("me", "/bin/bash", "xterm", "me", "/"), strict=True):
        monkeypatch.setenv(name, value)
    return Install(home, data, config, db, data / "logs", workspace, script)


@pytest.fixture
def sandbox(install: Install) -> Iterator[Bubblewrap]:
    """exec's sandbox as the gateway makes it for this installation."""
    confinement = Confinement(
        install.workspace,
        install.hidden(),
        network="none",
        programs=(str(Path(sys.executable).parent),),
    )
    try:
        made = probe("bwrap", confinement)
    except SandboxUnavailable as exc:
        pytest.skip(f"bubblewrap cannot run here: {exc}")
    assert isinstance(made, Bubblewrap)
    try:
        made.wait_ready()  # its first walk for private files, once a process: not the test's
        yield made
    finally:
        made.close()


def fake(install: Install, *options: str, **settings: Any) -> ServerSettings:
    return ServerSettings(
        "boxed", command=sys.executable, args=(str(install.script), *options), **settings
    )


async def structured(connection: Connection, tool: str, arguments: dict[str, Any]) -> Any:
    result = await connection.call(connection.tools[f"boxed_{tool}"], arguments)
    assert not result.is_error, result.content
    return result.structured_content


# -- containment ---------------------------------------------------------------------------------


async def test_a_sandboxed_server_reads_nothing_of_nanobots_and_leaves_nothing_behind(
    install: Install, sandbox: Bubblewrap
) -> None:
    """The server forks a detached child (a session of its own) and serves on."""
    forked = install.workspace / "child.pid"
    config = fake(install, "--fork-child", str(forked), env={"SERVICE_TOKEN": SERVER_SECRET})
    wanted = [
        str(install.config),
        str(install.db),
        str(install.logs / "nanobot.log"),
        str(install.home / ".ssh" / "id_ed25519"),
        "/proc/*/environ",
        f"/proc/{os.getpid()}/environ",
        f"{Path(sys.executable).parent.parent}/../*.secret",
    ]
    async with running(config, install.workspace, sandbox=sandbox) as connection:
        assert connection.status.state is State.RUNNING, connection.status.reason
        found = await structured(connection, "probe", {"paths": wanted})
        environ = await structured(connection, "environ", {})
        who = await structured(connection, "whoami", {})
        mine = await structured(connection, "probe", {"paths": [str(install.script)]})
        assert len(servers_with(str(forked))) == 2  # the server and its child
    await eventually(lambda: not processes_with(str(forked)))
    for path in wanted[:4]:
        assert found[path].startswith("error: "), (path, found[path])
    seen = json.dumps(found)
    for secret in (CONFIG_SECRET, DB_SECRET, HOME_SECRET, NANOBOT_SECRET):
        assert secret not in seen
    # Its own PID namespace: the only environ it can read is its own, not nanobot's.
    environs = [path for path in found if path.endswith("/environ") and "*" not in path]
    assert all(NANOBOT_SECRET not in found[path] for path in environs)
    assert found[f"/proc/{os.getpid()}/environ"].startswith("error: ") or who["pid"] == os.getpid()
    assert set(environ) == {"PATH", "HOME", "LANG", "SERVICE_TOKEN"}, sorted(environ)
    assert environ["HOME"] == str(HOME)
    assert environ["SERVICE_TOKEN"] == SERVER_SECRET
    assert environ["LANG"] == (os.environ.get("LANG") or "C.UTF-8")
    assert (who["cwd"], who["home"]) == (str(install.workspace), str(HOME))
    assert mine[str(install.script)].startswith('"""A fake MCP server')  # its workspace


async def test_where_people_are_kept_apart_a_sandboxed_server_sees_no_ones_folder(
    install: Install, sandbox: Bubblewrap
) -> None:
    """An MCP server is everyone's: with `people.isolation: person` the workspace it sees
    has an empty `people/` (covered, not emptied); the rest of the workspace is there."""
    folder = install.workspace / "people" / "telegram-111"
    (folder / "memory").mkdir(parents=True)
    (folder / "private.txt").write_text(DB_SECRET)
    (folder / "memory" / "MEMORY.md").write_text(HOME_SECRET)
    people = install.workspace / "people"
    wanted = [
        str(folder / "private.txt"),
        f"{people}/*",
        f"{people}/*/*",
        f"{people}/*/memory/*",
        str(install.script),
    ]
    config = fake(install, "--fork-child", str(install.workspace / "mark.pid"))
    async with running(
        config, install.workspace, sandbox=sandbox, hiding=(Path("people"),)
    ) as connection:
        assert connection.status.state is State.RUNNING, connection.status.reason
        found = await structured(connection, "probe", {"paths": wanted})
    assert found[str(folder / "private.txt")].startswith("error: ")
    assert all(found[pattern] == "error: no match" for pattern in wanted[1:4]), found
    assert found[str(install.script)].startswith('"""A fake MCP server')
    seen = json.dumps(found)
    assert DB_SECRET not in seen and HOME_SECRET not in seen
    assert (folder / "private.txt").read_text() == DB_SECRET  # covered, not emptied


def test_a_cwd_in_peoples_folders_is_refused_where_they_are_hidden(install: Install) -> None:
    (install.workspace / "people" / "telegram-111").mkdir(parents=True)
    config = fake(install, sandbox="none", cwd="people/telegram-111")
    with pytest.raises(NotStartable, match="in people's own folders"):
        launch("boxed", config, install.workspace, None, None, hiding=(Path("people"),))


async def test_a_sandboxed_server_that_forks_and_exits_leaves_no_process_behind(
    install: Install, sandbox: Bubblewrap
) -> None:
    """It never starts (it exits at once); each try forks a detached child again."""
    forked = install.workspace / "exiting.pid"
    config = fake(install, "--fork-child", str(forked), "--exit-after-fork")
    async with running(config, install.workspace, sandbox=sandbox) as connection:
        assert connection.status.state is State.FAILED
        assert connection.status.reason == "the server closed the connection"
        assert forked.exists()
        await eventually(lambda: not processes_with(str(forked)))
    assert not processes_with(str(forked))


async def test_sandbox_none_starts_the_server_bare_and_says_so(install: Install) -> None:
    config = fake(install, sandbox="none", env={"SERVICE_TOKEN": SERVER_SECRET})
    with log_lines() as lines:
        async with running(config, install.workspace) as connection:
            environ = await structured(connection, "environ", {})
            who = await structured(connection, "whoami", {})
    assert (
        "WARNING MCP server boxed runs WITHOUT the sandbox (mcp.servers.boxed.sandbox: none): "
        "it has nanobot's own rights, its files and network"
    ) in lines
    assert set(environ) == {"PATH", "HOME", "LANG", "SERVICE_TOKEN"}, sorted(environ)
    assert environ["HOME"] == str(install.home)
    assert who["pid"] != os.getpid()


@pytest.mark.parametrize("exits", [False, True], ids=["serves-on", "exits-after-fork"])
async def test_a_bare_server_that_forks_leaves_no_process_behind(
    install: Install, exits: bool
) -> None:
    """Without the PID namespace: its detached child (a session of its own, out of the
    process group the SDK stops) is ended all the same."""
    forked = install.workspace / "bare.pid"
    options = ("--fork-child", str(forked), *(("--exit-after-fork",) if exits else ()))
    async with running(fake(install, *options, sandbox="none"), install.workspace) as connection:
        assert connection.status.state is (State.FAILED if exits else State.RUNNING)
        await eventually(forked.exists)
        if not exits:
            child = int(forked.read_text())  # the host's pid: no namespace of its own
            assert child in servers_with(str(forked))  # alive beside the server
            assert os.getsid(child) == child  # out of the server's session and group
    await eventually(lambda: not processes_with(str(forked)))


@pytest.mark.parametrize(
    ("sandbox", "why"),
    [
        (
            Unavailable("bwrap: setting up uid map: Permission denied"),
            "no sandbox can run here (bwrap: setting up uid map: Permission denied)",
        ),
        (Unconfined(), "tools.exec.sandbox is none, so there is no sandbox for it"),
        (None, "no sandbox is available"),
    ],
)
async def test_without_a_sandbox_a_sandboxed_server_is_not_started(
    install: Install, sandbox: Any, why: str
) -> None:
    hint = (
        "it is not started bare: set mcp.servers.boxed.sandbox: none to run it with "
        "nanobot's own rights"
    )
    mark = str(install.workspace / "never-started")
    with log_lines() as lines:
        async with running(fake(install, "--name", mark), install.workspace, sandbox=sandbox) as (
            connection
        ):
            assert connection.status.state is State.FAILED
            assert connection.status.reason == f"{why}; {hint}"
            assert not processes_with(mark)
    said = [line for line in lines if "boxed" in line]
    assert said == [f"ERROR MCP server boxed: not started: {why}; {hint}"]


# -- the command line and the environment ---------------------------------------------------------


def test_a_bare_launch_has_its_own_environment_and_drops_the_inherited_names(
    install: Install,
) -> None:
    config = fake(install, sandbox="none", env={"SERVICE_TOKEN": SERVER_SECRET})
    started = launch("boxed", config, install.workspace, None, None)
    assert started.bare
    assert started.env == {
        "PATH": os.environ["PATH"],
        "HOME": str(install.home),
        "LANG": os.environ.get("LANG") or "C.UTF-8",
        "SERVICE_TOKEN": SERVER_SECRET,
    }
    # The SDK adds these from nanobot's environment; the command line takes them away.
    for name in INHERITED:
        assert ("-u", name) in zip(started.argv, started.argv[1:], strict=False)
    assert started.argv[-2:] == (sys.executable, str(install.script))
    # A bare server runs under the reaper, which ends what it leaves behind.
    reaper = Path(launch_module.__file__).with_name("_reaper.py")
    assert started.argv[:3] == (sys.executable, "-I", str(reaper))
    assert SERVER_SECRET not in " ".join(started.argv)


def test_a_sandboxed_launch_keeps_secrets_off_the_command_line(
    install: Install, sandbox: Bubblewrap
) -> None:
    config = fake(install, env={"SERVICE_TOKEN": SERVER_SECRET})
    with sandbox.call() as call:
        started = launch("boxed", config, install.workspace, sandbox, call)
    assert not started.bare
    assert started.env["SERVICE_TOKEN"] == SERVER_SECRET
    assert started.env["HOME"] == str(HOME)
    assert SERVER_SECRET not in " ".join(started.argv)
    assert str(sandbox.binary) in started.argv


@pytest.mark.parametrize(
    ("cwd", "why"),
    [
        ("../..", "is outside the workspace"),
        ("/etc", "is outside the workspace"),
        ("missing", "is not a folder"),
    ],
)
def test_a_cwd_outside_the_workspace_or_missing_is_refused(
    install: Install, cwd: str, why: str
) -> None:
    config = fake(install, sandbox="none", cwd=cwd)
    with pytest.raises(NotStartable) as refused:
        launch("boxed", config, install.workspace, None, None)
    assert str(refused.value).startswith("mcp.servers.boxed.cwd (")
    assert why in str(refused.value)


def test_a_cwd_inside_the_workspace_is_the_servers_folder(install: Install) -> None:
    (install.workspace / "sub").mkdir()
    config = fake(install, sandbox="none", cwd="sub")
    started = launch("boxed", config, install.workspace, None, None)
    at = started.argv.index("-C")
    assert started.argv[at + 1] == str((install.workspace / "sub").resolve())


# A stand-in for nanobot: starts the server as launched and waits. Its own parent, the
# holder, is a child subreaper: the server's reaper, orphaned, becomes the holder's, not
# init's (which may end orphans of its own accord and hide what the reaper does).
HOLDER = """
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
code = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(60)"
subprocess.Popen([sys.executable, "-c", code, *sys.argv[1:]])
while True:  # until nothing is left below it
    try:
        os.wait()
    except ChildProcessError:
        break
"""


async def test_a_bare_servers_processes_end_when_nanobot_is_killed(install: Install) -> None:
    """nanobot killed outright (kill -9) stops nothing itself: the reaper learns it from
    the kernel (its parent-death signal) and ends the server and what it forked, although
    the server's input stays open (it is this test's pipe)."""
    forked = install.workspace / "orphaned.pid"
    config = fake(install, "--fork-child", str(forked), sandbox="none")
    started = launch("boxed", config, install.workspace, None, None)
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLDER,
        *started.argv,
        env=started.env,
        cwd=started.cwd,
        stdin=asyncio.subprocess.PIPE,
    )
    assert holder.stdin is not None
    try:
        await eventually(forked.exists)
        await eventually(lambda: len(servers_with(str(forked))) == 2)  # server and child
        (stand_in,) = [pid for pid in processes_with(str(forked)) if _is_stand_in(pid)]
        os.kill(stand_in, signal.SIGKILL)
        await eventually(lambda: not processes_with(str(forked)))
    finally:
        holder.stdin.close()
        with contextlib.suppress(ProcessLookupError):  # it ends with the last one below it
            holder.kill()
        await holder.wait()


def _is_stand_in(pid: int) -> bool:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return argv[1:3] == [
        b"-c",
        b"import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(60)",
    ]
