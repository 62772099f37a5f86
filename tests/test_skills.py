"""Skills: front matter parsed with a real YAML parser, requirements checked, files cached."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

import pytest

from nanobot.agent._files import FileCache
from nanobot.agent.skills import Skill, Skills
from nanobot.workspace import bundled


def write_skill(workspace: Path, folder: str, text: str) -> Path:
    path = workspace / "skills" / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def bump(path: Path) -> None:
    """Move the mtime a whole second on, so the change shows on any file system."""
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))


def by_name(skills: Skills) -> dict[str, Skill]:
    return {skill.name: skill for skill in skills.all()}


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str | PurePath]:
    """Every skill file read (through the workspace confinement), in order."""
    seen: list[str | PurePath] = []
    original = FileCache._read

    def counting(self: FileCache[Any], path: Path) -> bytes:
        seen.append(path)
        return original(self, path)

    monkeypatch.setattr(FileCache, "_read", counting)
    return seen


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A PATH directory holding one executable, `fakebin`."""
    directory = tmp_path / "bin"
    directory.mkdir()
    program = directory / "fakebin"
    program.write_text("#!/bin/sh\n", encoding="utf-8")
    program.chmod(0o755)
    return directory


def test_front_matter_is_yaml(tmp_path: Path) -> None:
    path = write_skill(
        tmp_path,
        "deploy",
        "---\n"
        "name: 'ship-it'\n"
        'description: "Deploy: build, test and release — in that order"\n'
        "always: true\n"
        "requires:\n"
        "  bins: [fakebin]\n"
        "  env:\n"
        "    - DEPLOY_KEY\n"
        "homepage: https://example.com  # unknown keys are ignored\n"
        "---\n"
        "# Deploy\n\nRun the pipeline.\n",
    )
    folded = write_skill(
        tmp_path,
        "notes",
        "---\ndescription: >\n  Two lines\n  folded into one.\n---\nBody.\n",
    )
    literal = write_skill(
        tmp_path, "poem", "---\ndescription: |\n  Line one\n  Line two\n---\nBody.\n"
    )
    skills = by_name(Skills(tmp_path, env={"PATH": ""}))
    assert skills["ship-it"] == Skill(
        name="ship-it",
        description="Deploy: build, test and release — in that order",
        path=path,
        always=True,
        missing=("bin:fakebin", "env:DEPLOY_KEY"),
        body="# Deploy\n\nRun the pipeline.",
    )
    assert skills["notes"].description == "Two lines folded into one."
    assert skills["notes"].path == folded
    assert skills["poem"].description == "Line one\nLine two"
    assert skills["poem"].path == literal


def test_name_defaults_to_folder_and_front_matter_is_optional(tmp_path: Path) -> None:
    write_skill(tmp_path, "plain", "# Plain\n\nNo front matter at all.\n")
    write_skill(tmp_path, "empty", "---\n---\nJust a body.\n")
    write_skill(tmp_path, "crlf", "---\r\ndescription: Windows line ends\r\n---\r\nBody.\r\n")
    skills = by_name(Skills(tmp_path, env={}))
    assert skills["plain"].body == "# Plain\n\nNo front matter at all."
    assert skills["plain"].available
    assert skills["empty"].body == "Just a body."
    assert skills["crlf"].description == "Windows line ends"
    assert all(skill.error is None for skill in skills.values())


def test_missing_requirements_are_marked(tmp_path: Path, bin_dir: Path) -> None:
    write_skill(
        tmp_path,
        "gh",
        "---\ndescription: GitHub.\nrequires: {bins: [fakebin, nothere], env: [TOKEN, EMPTY]}\n"
        "---\nUse gh.\n",
    )
    skills = Skills(tmp_path, env={"PATH": str(bin_dir), "TOKEN": "x", "EMPTY": ""})
    (skill,) = skills.all()
    assert skill.missing == ("bin:nothere", "env:EMPTY")
    assert not skill.available
    assert skills.prompt_parts()[0] == (
        "- gh — GitHub. — skills/gh/SKILL.md (unavailable: missing bin nothere, env EMPTY)"
    )


def test_requirements_follow_path_and_env(tmp_path: Path, bin_dir: Path) -> None:
    write_skill(tmp_path, "x", "---\nrequires: {bins: [fakebin], env: [TOKEN]}\n---\nBody.\n")
    env = {"PATH": str(tmp_path / "nowhere")}
    skills = Skills(tmp_path, env=env)
    assert skills.all()[0].missing == ("bin:fakebin", "env:TOKEN")
    env["PATH"] = str(bin_dir)
    env["TOKEN"] = "secret"
    assert skills.all()[0].available


def test_which_is_cached_per_path(
    tmp_path: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_skill(tmp_path, "x", "---\nrequires: {bins: [fakebin]}\n---\nBody.\n")
    calls: list[str] = []
    real_which: Callable[..., str | None] = shutil.which

    def which(name: str, mode: int = os.F_OK | os.X_OK, path: str | None = None) -> str | None:
        calls.append(name)
        return real_which(name, mode, path)

    monkeypatch.setattr(shutil, "which", which)
    env = {"PATH": str(bin_dir)}
    skills = Skills(tmp_path, env=env)
    skills.all()
    bump(tmp_path / "skills" / "x" / "SKILL.md")
    skills.all()
    assert calls == ["fakebin"]
    env["PATH"] = str(bin_dir) + os.pathsep + str(tmp_path)
    skills.all()
    assert calls == ["fakebin", "fakebin"]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('---\ndescription: "unclosed\n---\nBody.\n', "invalid front matter: "),
        ("---\n- a\n- list\n---\nBody.\n", "invalid front matter: expected a mapping, got list"),
        ("---\nalways: maybe\n---\nBody.\n", "invalid front matter: 'always' must be"),
        ("---\nrequires: {bins: gh: x}\n---\n", "invalid front matter: "),
        ("---\nrequires: {bins: [1, 2]}\n---\n", "invalid front matter: 'requires.bins' must"),
        ("---\nname: [a]\n---\n", "invalid front matter: 'name' must be a string"),
        ("---\ndescription: never closed\n", "invalid front matter: no closing '---' line"),
    ],
)
def test_broken_front_matter_is_listed_not_fatal(
    tmp_path: Path, warnings: list[str], text: str, reason: str
) -> None:
    write_skill(tmp_path, "broken", text)
    write_skill(tmp_path, "fine", "---\ndescription: Works.\n---\nBody.\n")
    skills = Skills(tmp_path, env={})
    broken, fine = skills.all()
    assert broken.name == "broken"
    assert broken.error is not None
    assert broken.error.startswith(reason)
    assert not broken.available
    assert fine.available
    assert (
        f"- broken — skills/broken/SKILL.md (unavailable: {broken.error})"
        in skills.prompt_parts()[0]
    )
    skills.prompt_parts()[0]
    skills.all()
    assert len(warnings) == 1
    assert "broken" in warnings[0]


def test_yaml_error_names_the_line(tmp_path: Path) -> None:
    write_skill(tmp_path, "bad", "---\nname: ok\ndescription: 'it's'\n---\n")
    (skill,) = Skills(tmp_path, env={}).all()
    assert skill.error is not None
    assert "(line 3)" in skill.error


def test_always_skills_are_inlined_when_available(tmp_path: Path) -> None:
    write_skill(tmp_path, "rules", "---\ndescription: House rules.\nalways: true\n---\nBe kind.\n")
    write_skill(tmp_path, "needy", "---\nalways: true\nrequires: {env: [NOPE]}\n---\nNeeds NOPE.\n")
    write_skill(tmp_path, "lazy", "---\ndescription: Read on demand.\n---\nLazy body.\n")
    skills = Skills(tmp_path, env={})
    assert skills.prompt_parts()[1] == "## Skill rules (skills/rules/SKILL.md)\n\nBe kind."
    assert skills.prompt_parts()[0].splitlines() == [
        "- lazy — Read on demand. — skills/lazy/SKILL.md",
        "- needy — skills/needy/SKILL.md (unavailable: missing env NOPE)",
        "- rules — House rules. — skills/rules/SKILL.md (always loaded, below)",
    ]


def test_order_is_sorted_by_name(tmp_path: Path) -> None:
    write_skill(tmp_path, "a-folder", "---\nname: zeta\n---\n")
    write_skill(tmp_path, "z-folder", "---\nname: alpha\n---\n")
    write_skill(tmp_path, "m-folder", "---\nname: mu\n---\n")
    assert [skill.name for skill in Skills(tmp_path, env={}).all()] == ["alpha", "mu", "zeta"]


def test_unchanged_files_are_not_read_again(tmp_path: Path, reads: list[str | PurePath]) -> None:
    write_skill(tmp_path, "one", "---\ndescription: One.\n---\nBody.\n")
    write_skill(tmp_path, "two", "---\ndescription: Two.\nalways: true\n---\nBody.\n")
    skills = Skills(tmp_path, env={})
    first = skills.prompt_parts()[0]
    inlined = skills.prompt_parts()[1]
    assert len(reads) == 2
    assert skills.prompt_parts()[0] is first
    assert skills.prompt_parts()[1] is inlined
    assert len(reads) == 2


def test_an_edited_file_is_read_again(tmp_path: Path, reads: list[str | PurePath]) -> None:
    path = write_skill(tmp_path, "one", "---\ndescription: Before.\n---\nBody.\n")
    skills = Skills(tmp_path, env={})
    assert "Before." in skills.prompt_parts()[0]
    # Same size, so only the modification time tells the versions apart.
    path.write_text("---\ndescription: After!.\n---\nBody.\n", encoding="utf-8")
    bump(path)
    assert "After!." in skills.prompt_parts()[0]
    assert reads == [path, path]


def test_touching_a_file_without_changes_keeps_the_same_objects(tmp_path: Path) -> None:
    path = write_skill(tmp_path, "one", "---\ndescription: Same.\n---\nBody.\n")
    skills = Skills(tmp_path, env={})
    listed, summary = skills.all(), skills.prompt_parts()[0]
    bump(path)
    assert skills.all() is listed
    assert skills.prompt_parts()[0] is summary


def test_skills_appear_and_disappear(tmp_path: Path) -> None:
    skills = Skills(tmp_path, env={})
    assert skills.all() == ()
    assert skills.prompt_parts()[0] == ""
    write_skill(tmp_path, "first", "---\ndescription: First.\n---\n")
    assert [skill.name for skill in skills.all()] == ["first"]
    (tmp_path / "skills" / "later").mkdir()
    assert [skill.name for skill in skills.all()] == ["first"]
    # A SKILL.md written into a folder that already existed changes only that folder.
    write_skill(tmp_path, "later", "---\ndescription: Later.\n---\n")
    assert [skill.name for skill in skills.all()] == ["first", "later"]
    shutil.rmtree(tmp_path / "skills" / "first")
    assert [skill.name for skill in skills.all()] == ["later"]


def test_template_skills_parse() -> None:
    template = bundled("workspace_template")
    skills = by_name(Skills(template, env={"PATH": ""}))
    assert set(skills) == {"github", "memory", "summarize", "weather"}
    for skill in skills.values():
        assert skill.error is None, skill
        assert skill.description
        assert skill.body
        assert skill.path == template / "skills" / skill.name / "SKILL.md"
    assert skills["memory"].always
    assert skills["memory"].available
    assert skills["weather"].missing == ("bin:curl",)
    assert skills["github"].missing == ("bin:gh",)
    assert not skills["summarize"].missing


# --- skills the model linked to something outside the workspace ------------------------

OUTSIDE_SKILL = "---\ndescription: Leaked.\nalways: true\n---\nSECRET BODY sk-live-1234\n"


def test_a_skill_file_linked_outside_is_refused_once(tmp_path: Path, warnings: list[str]) -> None:
    ws = tmp_path / "ws"
    write_skill(ws, "good", "---\ndescription: Fine.\n---\nBody.\n")
    (tmp_path / "evil.md").write_text(OUTSIDE_SKILL, encoding="utf-8")
    (ws / "skills" / "evil").mkdir()
    (ws / "skills" / "evil" / "SKILL.md").symlink_to(tmp_path / "evil.md")
    skills = Skills(ws, env={})
    for _ in range(3):
        summary, inlined = skills.prompt_parts()
        assert "SECRET BODY" not in summary + inlined
        assert "Leaked." not in summary
    assert [skill.name for skill in skills.all()] == ["good"]
    refusals = [w for w in warnings if "evil" in w]
    assert len(refusals) == 1
    assert "outside the workspace" in refusals[0]


def test_a_skills_folder_linked_outside_is_refused(tmp_path: Path, warnings: list[str]) -> None:
    ws, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    write_skill(elsewhere, "x", OUTSIDE_SKILL)
    ws.mkdir()
    (ws / "skills").symlink_to(elsewhere / "skills")
    skills = Skills(ws, env={})
    assert skills.all() == ()
    assert "SECRET BODY" not in "".join(skills.prompt_parts())
    assert any("outside the workspace" in w for w in warnings)


def test_a_skill_folder_linked_inside_is_used(tmp_path: Path) -> None:
    write_skill(tmp_path / "shared", "tool", "---\ndescription: Shared.\n---\nUse it.\n")
    (tmp_path / "skills").mkdir()
    (tmp_path / "skills" / "tool").symlink_to("../shared/skills/tool")
    assert [skill.description for skill in Skills(tmp_path, env={}).all()] == ["Shared."]
