"""The exec tool: output and exit code, the minimal environment, and process-group cleanup."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from nanobot.tools import shell
from nanobot.tools.registry import ToolRegistry
from nanobot.tools.shell import ExecParams, ExecTool

# A child shell that starts a grandchild, records the grandchild's pid, and waits for it.
GRANDCHILD = "sh -c 'sleep 100 & echo $! > gc.pid; wait' & wait"


def registry(ws: Path, *, timeout: float = 60) -> ToolRegistry:
    return ToolRegistry([ExecTool(ws, timeout=timeout)])


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie waiting for init to reap it does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state not in ("Z", "X")


async def gone(pid: int, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def pid_from(path: Path, within: float = 3.0) -> int:
    deadline = time.monotonic() + within
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.02)
    return int(path.read_text())


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shell, "TERM_GRACE", 0.3)


async def test_output_and_exit_code(tmp_path: Path) -> None:
    result = await registry(tmp_path).execute("exec", {"command": "echo out; echo err >&2; exit 3"})
    assert not result.is_error  # a failing command is a result, not a tool failure
    assert result.content == "exit code 3\nout\nerr\n"


async def test_runs_in_the_workspace(tmp_path: Path) -> None:
    result = await registry(tmp_path).execute("exec", {"command": "pwd; echo ~"})
    real = os.path.realpath(tmp_path)
    assert result.content == f"exit code 0\n{real}\n{tmp_path}\n"


async def test_environment_has_no_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-secret-value")
    monkeypatch.setenv("NANOBOT_AGENT__API_KEY", "sk-nanobot-secret-value")
    monkeypatch.setenv("TELEGRAM_TOKEN", "123:telegram-secret")
    result = await registry(tmp_path).execute(
        "exec", {"command": 'env; echo "[$OPENAI_API_KEY][$NANOBOT_AGENT__API_KEY]"'}
    )
    for leaked in ("sk-openai-secret-value", "sk-nanobot-secret-value", "telegram", "API_KEY"):
        assert leaked not in result.content
    assert "[][]" in result.content
    names = {line.split("=", 1)[0] for line in result.content.splitlines()[1:-1]}
    assert names <= {"PATH", "HOME", "LANG", "TERM", "PWD", "SHLVL", "_", "OLDPWD"}


async def test_stderr_and_stdout_are_combined_and_output_is_capped(tmp_path: Path) -> None:
    tool = ExecTool(tmp_path, max_output_bytes=1000)
    text = await tool.run(ExecParams(command="head -c 200000 /dev/zero | tr '\\0' a"))
    assert text == "exit code 0\n" + "a" * 1000 + "\n[... 199000 more bytes of output not shown]"


async def test_no_output(tmp_path: Path) -> None:
    result = await registry(tmp_path).execute("exec", {"command": "true"})
    assert result.content == "exit code 0\n(no output)"


async def test_timeout_kills_the_process_group_with_its_grandchild(tmp_path: Path) -> None:
    started = time.monotonic()
    result = await registry(tmp_path).execute(
        "exec", {"command": f"echo before; {GRANDCHILD}", "timeout": 0.5}
    )
    assert time.monotonic() - started < 3
    assert result.is_error
    assert "timed out after 0.5 s" in result.content
    assert "before" in result.content
    assert await gone(await pid_from(tmp_path / "gc.pid"))


async def test_requested_timeout_is_capped_at_the_configured_one(tmp_path: Path) -> None:
    started = time.monotonic()
    result = await registry(tmp_path, timeout=0.3).execute(
        "exec", {"command": "sleep 5", "timeout": 100}
    )
    assert "timed out after 0.3 s" in result.content
    assert time.monotonic() - started < 2


async def test_a_process_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    command = "trap '' TERM; echo $$ > sh.pid; sleep 5; sleep 5"
    result = await registry(tmp_path).execute("exec", {"command": command, "timeout": 0.3})
    assert result.is_error
    assert await gone(await pid_from(tmp_path / "sh.pid"))


async def test_background_children_are_stopped_when_the_command_ends(tmp_path: Path) -> None:
    started = time.monotonic()
    result = await registry(tmp_path).execute(
        "exec", {"command": "sleep 100 & echo $! > bg.pid; echo started"}
    )
    assert result.content == "exit code 0\nstarted\n"
    assert time.monotonic() - started < 3
    assert await gone(await pid_from(tmp_path / "bg.pid"))


async def test_cancellation_kills_the_process_group(tmp_path: Path) -> None:
    tool = ExecTool(tmp_path)
    call = asyncio.create_task(tool.run(ExecParams(command=GRANDCHILD)))
    grandchild = await pid_from(tmp_path / "gc.pid")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await gone(grandchild)


@pytest.mark.parametrize(
    "scenario",
    [
        test_timeout_kills_the_process_group_with_its_grandchild,
        test_a_process_ignoring_sigterm_is_killed,
        test_background_children_are_stopped_when_the_command_ends,
        test_cancellation_kills_the_process_group,
    ],
)
def test_process_groups_are_cleaned_up_under_uvloop_too(
    scenario: Callable[[Path], Coroutine[Any, Any, None]], tmp_path: Path
) -> None:
    # The gateway runs on uvloop by default (gateway.event_loop); its subprocesses and
    # signals are libuv's, not asyncio's.
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(scenario(tmp_path))


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
    result = await registry(tmp_path).execute("exec", {"command": command})
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
async def test_ordinary_commands_are_not_refused(tmp_path: Path, command: str) -> None:
    result = await registry(tmp_path).execute("exec", {"command": command})
    assert not result.is_error, result.content


async def test_deny_patterns_are_configurable(tmp_path: Path) -> None:
    tools = ToolRegistry([ExecTool(tmp_path, deny_patterns=[r"\bcurl\b"])])
    assert (await tools.execute("exec", {"command": "curl http://x"})).is_error
    assert not (await tools.execute("exec", {"command": "echo rm -rf /"})).is_error
    with pytest.raises(ValueError, match="invalid exec deny pattern"):
        ExecTool(tmp_path, deny_patterns=["("])


@pytest.mark.parametrize(
    ("args", "expected"),
    [({}, "command: Field required"), ({"command": "true", "timeout": 0}, "timeout:")],
)
async def test_invalid_arguments_name_the_field(
    tmp_path: Path, args: dict[str, object], expected: str
) -> None:
    result = await registry(tmp_path).execute("exec", args)
    assert result.is_error
    assert expected in result.content
