"""exec's sandbox as a user meets it: start-up checks, `nanobot status`, and a machine where
bubblewrap cannot run.

"Cannot run" is made real, not simulated: the command runs under `setpriv` without
CAP_SYS_ADMIN in its bounding set, as in a container started without it, so bubblewrap's
own namespace creation fails ("Operation not permitted").
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import Home
from tests.fakes.llm import Call, FakeLLM, Text, ToolCalls
from tests.test_cli import Result, nanobot

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)


def _can_drop_sys_admin() -> bool:
    if shutil.which("setpriv") is None:
        return False
    done = subprocess.run(
        ["setpriv", "--bounding-set", "-sys_admin", "true"], capture_output=True, check=False
    )
    return done.returncode == 0


no_sys_admin = pytest.mark.skipif(
    not _can_drop_sys_admin(),
    reason="needs setpriv and the right to drop CAP_SYS_ADMIN (root) to make bubblewrap fail",
)


async def without_namespaces(home: Home, *args: str) -> Result:
    """`nanobot *args` where no new namespace can be made."""
    return await nanobot(home, *args, prefix=("setpriv", "--bounding-set", "-sys_admin"))


async def test_status_names_the_sandbox(home: Home) -> None:
    result = await nanobot(home, "status")
    assert result.code == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("sandbox"))
    assert "bubblewrap 0." in line
    assert "network: public (a namespace of its own" in line


async def test_sandbox_none_warns_at_start_up(home: Home, fake_llm: FakeLLM) -> None:
    home.write_config(home.config.read_text() + "tools:\n  exec: {sandbox: none}\n")
    fake_llm.script(Text("hi"))
    result = await nanobot(home, "agent", "-m", "hello")
    assert result.code == 0, result.stderr
    assert "exec runs WITHOUT a sandbox (tools.exec.sandbox: none)" in result.stderr
    assert "sandbox" in (await nanobot(home, "status")).stdout


async def test_workspace_holding_the_data_dir_is_a_config_error(home: Home) -> None:
    home.write_config(home.config.read_text() + f"workspace: {home.root}\n")
    result = await nanobot(home, "agent", "-m", "hello")
    assert result.code == 2
    assert "workspace:" in result.stderr
    assert "holds data_dir" in result.stderr


@no_sys_admin
async def test_sandbox_bwrap_that_cannot_run_stops_start_up_with_exit_2(home: Home) -> None:
    home.write_config(home.config.read_text() + "tools:\n  exec: {sandbox: bwrap}\n")
    result = await without_namespaces(home, "gateway")
    assert result.code == 2, result.stderr
    # The network namespace is what is made first, and fails first.
    assert "tools.exec.sandbox is bwrap, but tools.exec.network is public" in result.stderr
    assert "Operation not permitted" in result.stderr
    assert "tools.exec.network: none" in result.stderr
    assert "tools.exec.sandbox: none" in result.stderr  # says how to accept the risk


@no_sys_admin
async def test_auto_without_a_working_sandbox_warns_and_refuses_exec(
    home: Home, fake_llm: FakeLLM
) -> None:
    outside = home.root / "should-not-exist"
    # Allowed without asking: what refuses it here must be the missing sandbox.
    home.write_config(home.config.read_text() + "tools:\n  approval: {exec: allow}\n")
    fake_llm.script(
        ToolCalls([Call("exec", {"command": f"touch {outside}"})]), Text("I could not.")
    )
    result = await without_namespaces(home, "agent", "-m", "make a file")
    assert result.code == 0, result.stderr
    assert result.stdout == "I could not.\n"
    assert "exec sandbox: unavailable, exec is refused" in result.stderr
    assert "tools.exec.sandbox: none" in result.stderr
    tool_result = fake_llm.requests[-1].messages[-1]
    assert tool_result["role"] == "tool"
    assert "the shell is disabled on this machine" in tool_result["content"]
    assert not outside.exists()
    status = await without_namespaces(home, "status")
    assert "unavailable, exec is refused" in status.stdout
