"""The system prompt and the messages the model is sent."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path, PurePath
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from nanobot.agent._files import text_cache
from nanobot.agent.context import ContextBuilder, user_message
from nanobot.agent.memory import Memory
from nanobot.agent.prompt_budget import PromptBudget
from nanobot.agent.skills import Skills
from nanobot.workspace import Workspace, copy_template

NOW = datetime(2026, 11, 22, 10, 49, tzinfo=UTC)
TOKYO = timezone(timedelta(hours=9), "JST")


def write(workspace: Path, name: str, text: str) -> Path:
    path = workspace / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def bump(path: Path) -> None:
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    copy_template(tmp_path)
    return tmp_path


def builder(workspace: Path, **kwargs: Any) -> ContextBuilder:
    return ContextBuilder(workspace, skills=Skills(workspace, env={"PATH": ""}), **kwargs)


def test_identical_inputs_give_byte_identical_prompts(workspace: Path) -> None:
    write(workspace, "memory/2026-11-22.md", "- Booked a table.\n")
    first = builder(workspace, timezone=UTC)
    prompt = first.system_prompt(NOW)
    assert first.system_prompt(NOW) is prompt
    assert builder(workspace, timezone=UTC).system_prompt(NOW) == prompt
    # Later the same day: the time never reaches the system prompt.
    evening = NOW.replace(hour=21, minute=7)
    assert first.system_prompt(evening) is prompt
    assert "10:49" not in prompt
    assert "21:07" not in prompt


def test_unchanged_workspace_is_not_read_again(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = builder(workspace, timezone=UTC)
    reads: list[str | PurePath] = []
    original = Workspace.open_file

    def counting(self: Workspace, path: str | PurePath) -> tuple[int, os.stat_result]:
        reads.append(path)
        return original(self, path)

    monkeypatch.setattr(Workspace, "open_file", counting)
    context.system_prompt(NOW)
    assert workspace / "AGENTS.md" in reads  # every file is read through the confinement
    reads.clear()
    context.system_prompt(NOW)
    assert reads == []


def test_layout(workspace: Path) -> None:
    write(workspace, "memory/2026-11-22.md", "- Today's line.\n")
    write(workspace, "memory/2026-11-21.md", "- Yesterday's line.\n")
    prompt = builder(workspace, timezone=UTC).system_prompt(NOW)
    assert prompt.startswith(
        f"You are nanobot, a personal AI assistant. Your workspace is {workspace}."
    )
    headings = [line for line in prompt.splitlines() if line.startswith("## ")]
    assert headings[0] == "## AGENTS.md"
    order = [
        "## AGENTS.md",
        "## SOUL.md",
        "## USER.md",
        "## TOOLS.md",
        "## memory/MEMORY.md",
        "## memory/2026-11-22.md (today)",
        "## memory/2026-11-21.md (yesterday)",
        "## Skills",
        "## Skill memory (skills/memory/SKILL.md)",
    ]
    positions = [headings.index(heading) for heading in order]
    assert positions == sorted(positions)
    assert "# Agent instructions" in prompt
    assert "- weather — " in prompt
    assert "skills/github/SKILL.md (unavailable: missing bin gh)" in prompt
    assert prompt.endswith("\n")
    assert not prompt.endswith("\n\n")


def test_missing_and_empty_files_are_left_out(tmp_path: Path) -> None:
    write(tmp_path, "SOUL.md", "   \n")
    write(tmp_path, "USER.md", "Name: Ada\n")
    prompt = builder(tmp_path).system_prompt(NOW)
    assert prompt.endswith("## USER.md\n\nName: Ada\n")
    assert "## AGENTS.md" not in prompt
    assert "## SOUL.md" not in prompt
    assert "## Skills" not in prompt


def test_prompt_follows_file_changes(workspace: Path) -> None:
    context = builder(workspace, timezone=UTC)
    before = context.system_prompt(NOW)
    soul = workspace / "SOUL.md"
    soul.write_text("# Soul\n\nTerse.\n", encoding="utf-8")
    bump(soul)
    after = context.system_prompt(NOW)
    assert "Terse." in after
    assert after != before
    bump(soul)  # saved again without changes
    assert context.system_prompt(NOW) is after


def test_prompt_follows_skill_changes(workspace: Path) -> None:
    context = builder(workspace, timezone=UTC)
    before = context.system_prompt(NOW)
    write(workspace, "skills/zzz/SKILL.md", "---\ndescription: Newest.\nalways: true\n---\nZ!\n")
    after = context.system_prompt(NOW)
    assert "- zzz — Newest. — skills/zzz/SKILL.md (always loaded, below)" in after
    assert after.endswith("## Skill zzz (skills/zzz/SKILL.md)\n\nZ!\n")
    assert after.startswith(before.split("## Skills")[0])


def test_daily_notes_roll_over_at_midnight_in_the_configured_zone(workspace: Path) -> None:
    write(workspace, "memory/2026-11-21.md", "- Note of the 21st.\n")
    write(workspace, "memory/2026-11-22.md", "- Note of the 22nd.\n")
    write(workspace, "memory/2026-11-23.md", "- Note of the 23rd.\n")
    context = builder(workspace, timezone=TOKYO)
    late = context.system_prompt(datetime(2026, 11, 22, 14, 59, tzinfo=UTC))  # 23:59 in Tokyo
    assert "## memory/2026-11-22.md (today)\n\n- Note of the 22nd." in late
    assert "## memory/2026-11-21.md (yesterday)\n\n- Note of the 21st." in late
    assert "23rd" not in late
    after = context.system_prompt(datetime(2026, 11, 22, 15, 0, tzinfo=UTC))  # 00:00 next day
    assert "## memory/2026-11-23.md (today)\n\n- Note of the 23rd." in after
    assert "## memory/2026-11-22.md (yesterday)\n\n- Note of the 22nd." in after
    assert "21st" not in after


def test_an_injected_memory_brings_its_own_zone(workspace: Path) -> None:
    write(workspace, "memory/2026-11-23.md", "- Tokyo's Monday.\n")
    context = builder(workspace, timezone=UTC, memory=Memory(workspace, TOKYO))
    assert context.memory.today(NOW.replace(hour=20)).isoformat() == "2026-11-23"
    assert "Tokyo's Monday" in context.system_prompt(NOW.replace(hour=20))


@pytest.mark.parametrize(
    ("now", "envelope"),
    [
        (NOW, "[2026-11-22 10:49 Sun UTC]"),
        (NOW.astimezone(TOKYO), "[2026-11-22 19:49 Sun JST]"),
        (
            datetime(2026, 1, 5, 8, 3, tzinfo=timezone(timedelta(hours=-5))),
            "[2026-01-05 08:03 Mon UTC-05:00]",
        ),
        (datetime(2026, 7, 4, 23, 59), "[2026-07-04 23:59 Sat]"),  # noqa: DTZ001
    ],
)
def test_user_message_envelope(now: datetime, envelope: str) -> None:
    assert user_message("hello", now) == {"role": "user", "content": f"{envelope}\nhello"}


def test_envelope_uses_zone_abbreviations() -> None:
    winter = datetime(2026, 1, 31, 9, 5, tzinfo=ZoneInfo("Europe/Berlin"))
    summer = datetime(2026, 7, 31, 9, 5, tzinfo=ZoneInfo("Europe/Berlin"))
    assert user_message("x", winter)["content"] == "[2026-01-31 09:05 Sat CET]\nx"
    assert user_message("x", summer)["content"] == "[2026-07-31 09:05 Fri CEST]\nx"


# --- prompt files the model linked to something outside the workspace --------------------

SECRET = "api_key: sk-live-do-not-leak"


@pytest.fixture
def linked(tmp_path: Path) -> Path:
    """tmp/ws, a fresh workspace, beside tmp/config.yaml and tmp/outside/ holding secrets."""
    ws = tmp_path / "ws"
    copy_template(ws)
    (tmp_path / "config.yaml").write_text(SECRET, encoding="utf-8")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "MEMORY.md").write_text(SECRET, encoding="utf-8")
    return ws


def test_a_prompt_file_linked_outside_is_refused_and_logged_once(
    linked: Path, warnings: list[str]
) -> None:
    (linked / "USER.md").unlink()
    (linked / "USER.md").symlink_to("../config.yaml")
    context = builder(linked, timezone=UTC)
    for _ in range(3):
        prompt = context.system_prompt(NOW)
        assert SECRET not in prompt
        assert "## USER.md" not in prompt
    assert "## AGENTS.md" in prompt
    refusals = [w for w in warnings if "USER.md" in w]
    assert len(refusals) == 1
    assert "outside the workspace" in refusals[0]


def test_a_prompt_file_swapped_for_a_link_between_turns_is_dropped(
    linked: Path, warnings: list[str]
) -> None:
    context = builder(linked, timezone=UTC)
    assert "## SOUL.md" in context.system_prompt(NOW)
    soul = linked / "SOUL.md"
    soul.unlink()
    soul.symlink_to(linked.parent / "config.yaml")
    prompt = context.system_prompt(NOW)
    assert SECRET not in prompt
    assert "## SOUL.md" not in prompt
    assert any("SOUL.md" in w for w in warnings)


def test_memory_folder_linked_outside_is_refused(linked: Path, warnings: list[str]) -> None:
    shutil.rmtree(linked / "memory")
    (linked / "memory").symlink_to(linked.parent / "outside")
    prompt = builder(linked, timezone=UTC).system_prompt(NOW)
    assert SECRET not in prompt
    assert "## memory/MEMORY.md" not in prompt
    assert any("MEMORY.md" in w and "outside the workspace" in w for w in warnings)


def test_a_prompt_file_hard_linked_to_a_file_outside_is_refused(
    linked: Path, warnings: list[str]
) -> None:
    (linked / "TOOLS.md").unlink()
    os.link(linked.parent / "config.yaml", linked / "TOOLS.md")
    prompt = builder(linked, timezone=UTC).system_prompt(NOW)
    assert SECRET not in prompt
    assert any("TOOLS.md" in w and "hard links" in w for w in warnings)


def test_a_prompt_file_linked_inside_is_shown_and_followed_as_it_changes(linked: Path) -> None:
    notes = write(linked, "notes/user.md", "Name: Ada\n")
    (linked / "USER.md").unlink()
    (linked / "USER.md").symlink_to("notes/user.md")
    context = builder(linked, timezone=UTC)
    assert "## USER.md\n\nName: Ada" in context.system_prompt(NOW)
    notes.write_text("Name: Grace\n", encoding="utf-8")
    bump(notes)  # only the target changed; the link itself did not
    assert "## USER.md\n\nName: Grace" in context.system_prompt(NOW)


# ---- how much of the files the prompt holds ---------------------------------------------


def lines(count: int, width: int = 60) -> str:
    return "".join(f"{n:06d} " + "x" * (width - 8) + "\n" for n in range(1, count + 1))


def test_a_huge_memory_file_is_cut_with_a_note_and_one_warning(
    tmp_path: Path, warnings: list[str]
) -> None:
    memory = write(tmp_path, "memory/MEMORY.md", lines(140_000))  # 8.4 MB, as exec wrote it
    write(tmp_path, "USER.md", "Name: Ada\n")
    context = builder(tmp_path, timezone=UTC, budget=PromptBudget(20_000, 60_000))
    prompt = context.system_prompt(NOW)
    assert len(prompt) < 24_000  # not 8.4 MB with every request
    section = prompt.split("## memory/MEMORY.md\n\n", 1)[1]
    shown, note = section.split("\n\n[", 1)
    assert len(shown) <= 20_000 and lines(140_000).startswith(shown)
    last = len(shown.splitlines())
    assert note.startswith(
        f"memory/MEMORY.md is cut here: it is {memory.stat().st_size:,} bytes, and the prompt "
        f"shows its first {len(shown):,} characters (lines 1-{last}; read on with start_line "
        f"{last + 1}). Read the rest with read_file"
    )
    assert "Name: Ada" in prompt
    # Turn after turn, and after an edit of another file: said once.
    assert context.system_prompt(NOW) is prompt
    write(tmp_path, "USER.md", "Name: Ada Lovelace\n")
    assert "Ada Lovelace" in context.system_prompt(NOW)
    [warning] = [w for w in warnings if "MEMORY.md" in w]
    assert f"memory/MEMORY.md ({memory.stat().st_size:,} bytes): the first" in warning
    assert "agent.prompt_file_chars" in warning
    # A new version of the file (it grew) is said again, once.
    with memory.open("a") as file:
        file.write(lines(10))
    context.system_prompt(NOW)
    context.system_prompt(NOW)
    assert len([w for w in warnings if "MEMORY.md" in w]) == 2


def test_only_the_start_of_a_huge_file_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, "AGENTS.md", "é" * 1_000_000)  # 2 MB
    budget = PromptBudget(5_000, 60_000)
    text = text_cache(tmp_path, max_bytes=budget.read_bytes()).get(path)
    assert text is not None and text.startswith("é" * 5_000)
    assert len(text.encode()) <= budget.read_bytes()  # not the whole file
    assert len(text) > budget.file_chars  # enough to see that it is longer


def test_the_total_budget_cuts_the_later_files_and_says_what_is_left_out(
    tmp_path: Path, warnings: list[str]
) -> None:
    write(tmp_path, "AGENTS.md", "a" * 4_000)
    write(tmp_path, "SOUL.md", "s" * 3_000)
    write(tmp_path, "USER.md", lines(100))  # 6,000 characters: 1,000 of them fit
    write(tmp_path, "TOOLS.md", "t" * 500)
    write(tmp_path, "memory/MEMORY.md", "- a fact\n" * 20)
    prompt = builder(tmp_path, timezone=UTC, budget=PromptBudget(5_000, 8_000)).system_prompt(NOW)
    assert "a" * 4_000 in prompt and "s" * 3_000 in prompt
    user = prompt.split("## USER.md\n\n", 1)[1].split("\n\n[", 1)[0]
    assert lines(100).startswith(user) and 500 <= len(user) <= 1_000
    assert "[TOOLS.md (500 bytes) is left out" in prompt and "t" * 500 not in prompt
    assert "[memory/MEMORY.md (180 bytes) is left out" in prompt and "a fact" not in prompt
    [warning] = warnings
    assert "TOOLS.md (500 bytes): left out" in warning and "USER.md (6,000 bytes)" in warning


def test_one_endless_line_is_cut_inside(tmp_path: Path) -> None:
    write(tmp_path, "SOUL.md", "y" * 50_000)
    prompt = builder(tmp_path, timezone=UTC, budget=PromptBudget(2_000, 60_000)).system_prompt(NOW)
    assert "y" * 2_000 in prompt and "y" * 2_001 not in prompt
    assert "(up to part of line 1; read it with start_line 1)" in prompt


def test_a_huge_always_skill_is_cut_like_a_prompt_file(tmp_path: Path, warnings: list[str]) -> None:
    # A skill the agent wrote with `always: true` is in every prompt, as memory is.
    body = lines(100_000)
    skill = write(tmp_path, "skills/notes/SKILL.md", f"---\nalways: true\n---\n{body}")
    context = builder(tmp_path, timezone=UTC, budget=PromptBudget(20_000, 60_000))
    prompt = context.system_prompt(NOW)
    assert len(prompt) < 26_000
    section = prompt.split("## Skill notes (skills/notes/SKILL.md)\n\n", 1)[1]
    shown, note = section.split("\n\n[", 1)
    assert len(shown) <= 20_000 and body.startswith(shown)
    assert note.startswith(
        f"skills/notes/SKILL.md is cut here: it is {skill.stat().st_size:,} bytes"
    )
    assert context.system_prompt(NOW) is prompt
    [warning] = [w for w in warnings if "SKILL.md" in w]
    assert f"skills/notes/SKILL.md ({skill.stat().st_size:,} bytes): the first" in warning
