"""The code a command would run, pinned: which files count, what changes void a pin, and
what cannot be pinned at all; real files in a temporary workspace."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nanobot.agent.code_pins import ABSENT, Pinned, Unpinned, changed, pin


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "tool.py").write_text("print('v1')\n")
    (workspace / "helper.py").write_text("X = 1\n")
    (workspace / "run.sh").write_text("echo hi\n")
    (workspace / "data").mkdir()
    return workspace


def pinned(command: str, ws: Path) -> Pinned:
    pins = pin(command, ws)
    assert isinstance(pins, Pinned), pins
    return pins


@pytest.mark.parametrize(
    ("command", "files"),
    [
        ("ls -la", set()),
        ("echo hi > tool.py", set()),  # what it writes is output, not code
        ("cat < tool.py", {"tool.py"}),
        ("./run.sh", {"run.sh"}),
        ("bash run.sh && echo done", {"run.sh"}),
        ("python3 tool.py", {"tool.py", "helper.py"}),  # beside the script: importable
        ("python3 -u tool.py --fast", {"tool.py", "helper.py"}),
        ("python3 -m tool", {"tool.py", "helper.py"}),
        ("python3 -m site", {"site.py", "tool.py", "helper.py"}),  # a shadowing site.py counts
        ("PYTHONSTARTUP=tool.py true", {"tool.py"}),
        ("make", {"Makefile", "makefile", "GNUmakefile"}),
        ("npm run build", {"package.json", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pnpmfile.cjs"}),
    ],
)
def test_what_a_command_pins(command: str, files: set[str], ws: Path) -> None:
    assert set(pinned(command, ws).files) == files


def test_absent_configuration_is_pinned_as_absent(ws: Path) -> None:
    files = pinned("git status", ws).files
    assert files[".git/config"] == ABSENT and files[".gitattributes"] == ABSENT


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("ls data", "folder (data)"),
        ("cat *.py", "pattern (*.py)"),
        ("cat $HOME/x", "variable"),
        ("./missing.sh", "does not exist yet"),
        ("python3 new.py", "does not exist yet"),
        ("sh /tmp/x.sh", "the command itself must make"),
        ("pytest -q", "pytest finds and runs code"),
        ("cargo run", "cargo finds and runs code"),
        ("echo 'unclosed", "could not be parsed"),
        (".venv/bin/python tool.py", "an interpreter from the workspace"),
    ],
)
def test_what_cannot_be_pinned_says_why(command: str, words: str, ws: Path) -> None:
    pins = pin(command, ws)
    assert isinstance(pins, Unpinned) and words in pins.reason, pins


def test_a_rewritten_script_or_a_new_import_changes_the_pin(ws: Path) -> None:
    before = pinned("python3 tool.py", ws).text
    assert changed(before, pinned("python3 tool.py", ws).text) is None
    (ws / "tool.py").write_text("print('v2')\n")
    assert changed(before, pinned("python3 tool.py", ws).text) == "tool.py changed"
    again = pinned("python3 tool.py", ws).text
    (ws / "sitecustomize.py").write_text("import os\n")
    assert changed(again, pinned("python3 tool.py", ws).text) == "sitecustomize.py was created"
    (ws / "sitecustomize.py").unlink()
    (ws / "lib").mkdir()
    (ws / "lib" / "evil.pth").write_text("import os; os.system('touch PROOF')\n")
    assert changed(again, pinned("python3 tool.py", ws).text) == "lib/evil.pth was created"


def test_git_configuration_and_hooks_change_the_pin(ws: Path) -> None:
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    before = pinned("git status", ws).text
    config = ws / ".git" / "config"
    config.write_text(config.read_text() + "[core]\n\tfsmonitor = touch PROOF\n")
    assert changed(before, pinned("git status", ws).text) == ".git/config changed"
    again = pinned("git status", ws).text
    hook = ws / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\ntouch PROOF\n")
    assert changed(again, pinned("git status", ws).text) == ".git/hooks/pre-commit was created"
    third = pinned("git status", ws).text
    (ws / ".gitconfig").write_text("[core]\n\tfsmonitor = touch PROOF\n")  # HOME's, if ws
    assert changed(third, pinned("git status", ws).text) == ".gitconfig was created"


def test_a_symbolic_link_pins_its_target(ws: Path, tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("print('a')\n")
    (tmp_path / "b.py").write_text("print('a')\n")  # the same content, elsewhere
    (ws / "link.py").symlink_to(tmp_path / "a.py")
    before = pinned("python3 link.py", ws).text
    (ws / "link.py").unlink()
    (ws / "link.py").symlink_to(tmp_path / "b.py")
    assert changed(before, pinned("python3 link.py", ws).text) == "link.py changed"


def test_a_rule_from_before_fingerprints_never_matches(ws: Path) -> None:
    assert changed("", pinned("ls", ws).text) == (
        "it was saved before approvals recorded the code a command runs"
    )
    assert changed('{"x":"1"}', '{"x":"1"}') is None
    assert changed('{"x":"1"}', "{}") == "x was removed"


def test_a_git_worktree_pointer_pins_the_folder_it_names(ws: Path) -> None:
    (ws / "real-git" / "hooks").mkdir(parents=True)
    (ws / ".git").write_text("gitdir: real-git\n")
    before = pinned("git status", ws).text
    (ws / "real-git" / "config").write_text("[core]\n\tfsmonitor = touch PROOF\n")
    assert changed(before, pinned("git status", ws).text) == "real-git/config was created"
    (ws / ".git").write_text("not a pointer\n")
    assert isinstance(pin("git status", ws), Unpinned)
