"""The exec tool: output and exit code, the minimal environment, and stopping everything a
command started, in the real bubblewrap sandbox and without one (`tools.exec.sandbox: none`).

When exec stops a command (timeout, cancellation) the tests look right after the call: it
returns, or raises, only once every process of the command is gone. When the command ends by
itself, bubblewrap exits first and the kernel ends the rest of its namespace just after.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from nanobot.tools import _process
from nanobot.tools.base import ToolError
from nanobot.tools.registry import ToolRegistry
from nanobot.tools.sandbox import Confinement, Sandbox, Unavailable, Unconfined, probe
from nanobot.tools.shell import ExecParams, ExecTool

_serial = itertools.count(1)


def make_sandbox(kind: str, ws: Path) -> Sandbox:
    if kind == "none":
        return Unconfined()
    sandbox = probe("bwrap", Confinement(ws, network="none"))
    sandbox.wait_ready()  # the masks' first walk, once per process: not a command's time
    return sandbox


@pytest.fixture(params=["bwrap", "none"])
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Sandbox:
    return make_sandbox(request.param, tmp_path)


@pytest.fixture
def bwrap(tmp_path: Path) -> Sandbox:
    return make_sandbox("bwrap", tmp_path)


def registry(ws: Path, sandbox: Sandbox, *, timeout: float = 60) -> ToolRegistry:
    return ToolRegistry([ExecTool(ws, sandbox=sandbox, timeout=timeout)])


def marker() -> str:
    """A `sleep` duration no other process uses, to find the sleeper from outside (a pid
    written inside the sandbox is of its own PID namespace)."""
    return f"{1000 + os.getpid() % 1000}.{next(_serial)}{time.monotonic_ns() % 10_000}"


def alive(mark: str) -> dict[int, list[bytes]]:
    """The command lines of live processes (not zombies) that mention `mark`, by host pid:
    the sleeper, the shells around it, a child forked but not yet exec'd, bwrap itself."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if any(mark.encode() in arg for arg in cmdline) and state not in ("Z", "X"):
            found[int(entry.name)] = cmdline
    return found


def sleepers(mark: str) -> list[int]:
    """Host pids of live processes whose command line is `sleep <mark>`."""
    return [pid for pid, cmdline in alive(mark).items() if cmdline[:2] == [b"sleep", mark.encode()]]


async def started(mark: str, count: int = 1, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while len(sleepers(mark)) < count:
        assert time.monotonic() < deadline, f"sleep {mark} never started"
        await asyncio.sleep(0.02)


async def gone(mark: str, within: float = 3.0) -> bool:
    """Whether every process mentioning `mark` is gone by `within` seconds from now."""
    deadline = time.monotonic() + within
    while alive(mark):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_process, "TERM_GRACE", 0.3)


async def test_output_and_exit_code(tmp_path: Path, sandbox: Sandbox) -> None:
    result = await registry(tmp_path, sandbox).execute(
        "exec", {"command": "echo out; echo err >&2; exit 3"}
    )
    assert not result.is_error  # a failing command is a result, not a tool failure
    assert result.content == "exit code 3\nout\nerr\n"


async def test_runs_in_the_workspace(tmp_path: Path, sandbox: Sandbox) -> None:
    result = await registry(tmp_path, sandbox).execute("exec", {"command": "pwd; echo ~"})
    real = os.path.realpath(tmp_path)
    # HOME: sandboxed, a fresh empty folder of the call's own; unsandboxed, the workspace.
    home = "/home/nanobot" if sandbox.confined else str(tmp_path)
    assert result.content == f"exit code 0\n{real}\n{home}\n"


async def test_environment_has_no_secrets(
    tmp_path: Path, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-secret-value")
    monkeypatch.setenv("NANOBOT_AGENT__API_KEY", "sk-nanobot-secret-value")
    monkeypatch.setenv("TELEGRAM_TOKEN", "123:telegram-secret")
    result = await registry(tmp_path, sandbox).execute(
        "exec", {"command": 'env; echo "[$OPENAI_API_KEY][$NANOBOT_AGENT__API_KEY]"'}
    )
    for leaked in ("sk-openai-secret-value", "sk-nanobot-secret-value", "telegram", "API_KEY"):
        assert leaked not in result.content
    assert "[][]" in result.content
    names = {line.split("=", 1)[0] for line in result.content.splitlines()[1:-1]}
    assert names <= {"PATH", "HOME", "LANG", "TERM", "PWD", "SHLVL", "_", "OLDPWD"}


async def test_stderr_and_stdout_are_combined_and_output_is_capped(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    tool = ExecTool(tmp_path, sandbox=sandbox, max_output_bytes=1000)
    text = await tool.run(ExecParams(command="head -c 200000 /dev/zero | tr '\\0' a"))
    assert text == "exit code 0\n" + "a" * 1000 + "\n[... 199000 more bytes of output not shown]"


async def test_no_output(tmp_path: Path, sandbox: Sandbox) -> None:
    result = await registry(tmp_path, sandbox).execute("exec", {"command": "true"})
    assert result.content == "exit code 0\n(no output)"


async def test_timeout_kills_the_command_with_its_grandchild(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    mark = marker()
    started_at = time.monotonic()
    result = await registry(tmp_path, sandbox).execute(
        "exec", {"command": f"echo before; sh -c 'sleep {mark} & wait' & wait", "timeout": 0.5}
    )
    assert time.monotonic() - started_at < 3
    assert result.is_error
    assert "timed out after 0.5 s" in result.content
    assert "before" in result.content
    assert alive(mark) == {}


async def test_requested_timeout_is_capped_at_the_configured_one(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    started_at = time.monotonic()
    result = await registry(tmp_path, sandbox, timeout=0.3).execute(
        "exec", {"command": "sleep 5", "timeout": 100}
    )
    assert "timed out after 0.3 s" in result.content
    assert time.monotonic() - started_at < 2


async def test_a_process_ignoring_sigterm_is_killed(tmp_path: Path, sandbox: Sandbox) -> None:
    mark = marker()
    command = f"trap '' TERM; sleep {mark}; sleep 5"
    result = await registry(tmp_path, sandbox).execute("exec", {"command": command, "timeout": 0.3})
    assert result.is_error
    assert alive(mark) == {}


async def test_background_children_are_stopped_when_the_command_ends(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    mark = marker()
    started_at = time.monotonic()
    result = await registry(tmp_path, sandbox).execute(
        "exec", {"command": f"sleep {mark} & echo started"}
    )
    assert result.content == "exit code 0\nstarted\n"
    assert time.monotonic() - started_at < 3
    assert await gone(mark)


async def test_cancellation_kills_the_command_and_its_children(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    mark = marker()
    tool = ExecTool(tmp_path, sandbox=sandbox)
    call = asyncio.create_task(tool.run(ExecParams(command=f"sh -c 'sleep {mark} & wait'")))
    await started(mark)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert alive(mark) == {}


async def test_cancellation_while_the_command_starts_kills_what_it_started(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    # The loop tells the output's protocol its pipe is connected (connection_made) before
    # the start returns: a cancellation then lands while the start watches the command.
    mark = marker()
    tool = ExecTool(tmp_path, sandbox=sandbox)
    call = asyncio.create_task(tool.run(ExecParams(command=f"sh -c 'sleep {mark} & wait'")))

    def connection_made(protocol: asyncio.BaseProtocol, transport: asyncio.BaseTransport) -> None:
        deadline = time.monotonic() + 5
        while not sleepers(mark):  # blocking: the start must not complete meanwhile
            assert time.monotonic() < deadline, f"sleep {mark} never started"
            time.sleep(0.01)
        call.cancel()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_process.Output, "connection_made", connection_made)
        with pytest.raises(asyncio.CancelledError):
            await call
    assert alive(mark) == {}


# What leaves the process group: only the sandbox's PID namespace contains these.
ESCAPES = [
    "setsid sleep {m} > /dev/null 2>&1 &",
    "nohup sleep {m} > /dev/null 2>&1 &",
    "(sleep {m} > /dev/null 2>&1 &) &",
    "setsid sh -c '(setsid sleep {m} > /dev/null 2>&1 &)' &",
    "python3 -c 'import os,subprocess; os.fork() or (os.setsid(), "
    'subprocess.Popen(["sleep", "{m}"], start_new_session=True))\' &',
]


@pytest.mark.parametrize("escape", ESCAPES)
async def test_escaped_processes_die_with_the_sandbox_when_the_command_ends(
    tmp_path: Path, bwrap: Sandbox, escape: str
) -> None:
    mark = marker()
    command = escape.format(m=mark) + f"\nwhile ! pgrep -f 'sleep {mark}' >/dev/null; do :; done"
    result = await registry(tmp_path, bwrap).execute("exec", {"command": command})
    assert result.content.startswith("exit code 0"), result.content
    assert await gone(mark)


@pytest.mark.parametrize("ending", ["timeout", "cancel"])
async def test_escaped_processes_die_on_timeout_and_on_stop(
    tmp_path: Path, bwrap: Sandbox, ending: str
) -> None:
    mark = marker()
    command = "\n".join(e.format(m=mark) for e in ESCAPES) + "\nsleep 60"
    tool = ExecTool(tmp_path, sandbox=bwrap, timeout=30)
    call = asyncio.create_task(
        tool.run(ExecParams(command=command, timeout=30 if ending == "cancel" else 3))
    )
    await started(mark, count=len(ESCAPES))
    if ending == "cancel":
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    else:
        with pytest.raises(ToolError, match="timed out"):
            await call
    assert alive(mark) == {}


async def test_without_a_working_sandbox_exec_is_refused(tmp_path: Path) -> None:
    unavailable = Unavailable("user namespaces are not available")
    result = await registry(tmp_path, unavailable).execute("exec", {"command": "touch ran"})
    assert result.is_error
    assert "no sandbox can run here (user namespaces are not available)" in result.content
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "scenario",
    [
        test_timeout_kills_the_command_with_its_grandchild,
        test_a_process_ignoring_sigterm_is_killed,
        test_background_children_are_stopped_when_the_command_ends,
        test_cancellation_kills_the_command_and_its_children,
        test_cancellation_while_the_command_starts_kills_what_it_started,
    ],
)
@pytest.mark.parametrize("kind", ["bwrap", "none"])
def test_commands_are_cleaned_up_under_uvloop_too(
    scenario: Callable[[Path, Sandbox], Coroutine[Any, Any, None]], kind: str, tmp_path: Path
) -> None:
    # The gateway runs on uvloop by default (gateway.event_loop); its subprocesses and
    # signals are libuv's, not asyncio's.
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(scenario(tmp_path, make_sandbox(kind, tmp_path)))


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf /",
        "rm -rf / ",
        "rm -fr /*",
        "rm -r -f /",
        "rm -f -r ~",
        "rm -rf ~/",
        'rm -rf "/"',
        "rm --recursive --force $HOME",
        "sudo rm -rf --no-preserve-root /",
        "cd /tmp && rm -Rf /;",
        "mkfs.ext4 /dev/sda1",
        "mkfs -t ext4 /dev/sdb",
        "dd if=/dev/zero of=/dev/sda bs=1M",
        ":(){ :|:& };:",
        ":() { : | : & } ; :",
        "shutdown -h now",
        "sudo reboot",
        "echo bye; poweroff",
        "systemctl reboot",
        "cat image > /dev/sda",
        "echo x >/dev/nvme0n1",
    ],
)
async def test_dangerous_commands_are_refused(tmp_path: Path, command: str) -> None:
    result = await registry(tmp_path, Unconfined()).execute("exec", {"command": command})
    assert result.is_error
    assert "refused as dangerous" in result.content


@pytest.mark.parametrize(
    "command",
    [
        "echo rm -rf build/",
        "echo rm -rf /tmp/scratch",
        "echo rm -rf ./~cache",
        "echo grep reboot /var/log/syslog",
        "echo ls -l /dev/sda",
        "echo dd if=a.img of=b.img",
        "dd if=/dev/zero of=/dev/null count=1",
    ],
)
async def test_ordinary_commands_are_not_refused(
    tmp_path: Path, bwrap: Sandbox, command: str
) -> None:
    result = await registry(tmp_path, bwrap).execute("exec", {"command": command})
    assert not result.is_error, result.content


async def test_deny_patterns_are_configurable(tmp_path: Path, bwrap: Sandbox) -> None:
    tools = ToolRegistry([ExecTool(tmp_path, sandbox=bwrap, deny_patterns=[r"\bcurl\b"])])
    assert (await tools.execute("exec", {"command": "curl http://x"})).is_error
    assert not (await tools.execute("exec", {"command": "echo rm -rf /"})).is_error
    with pytest.raises(ValueError, match="invalid exec deny pattern"):
        ExecTool(tmp_path, sandbox=bwrap, deny_patterns=["("])


@pytest.mark.parametrize(
    ("args", "expected"),
    [({}, "command: Field required"), ({"command": "true", "timeout": 0}, "timeout:")],
)
async def test_invalid_arguments_name_the_field(
    tmp_path: Path, args: dict[str, object], expected: str
) -> None:
    result = await registry(tmp_path, Unconfined()).execute("exec", args)
    assert result.is_error
    assert expected in result.content
