"""Memory files: where they live, which day is today, and what the prompt shows of them."""

from __future__ import annotations

import os
from datetime import UTC, date, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from nanobot.agent.memory import Memory, Note
from nanobot.agent.prompt_budget import Cut, PromptBudget

DAY = date(2026, 3, 1)


def write(workspace: Path, name: str, text: str) -> Path:
    path = workspace / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_paths(tmp_path: Path) -> None:
    memory = Memory(tmp_path, None)
    assert memory.daily_path(DAY) == tmp_path / "memory" / "2026-03-01.md"


@pytest.mark.parametrize(
    ("zone", "expected"),
    [
        (ZoneInfo("Europe/Berlin"), date(2026, 3, 2)),
        (ZoneInfo("America/New_York"), date(2026, 3, 1)),
        (UTC, date(2026, 3, 1)),
    ],
)
def test_today_is_the_day_in_the_configured_zone(zone: ZoneInfo, expected: date) -> None:
    now = datetime(2026, 3, 1, 23, 30, tzinfo=UTC)
    assert Memory(Path("/ws"), zone).today(now) == expected


def test_naive_now_is_taken_as_local_to_the_zone() -> None:
    now = datetime(2026, 3, 1, 23, 30)  # noqa: DTZ001
    assert Memory(Path("/ws"), ZoneInfo("Asia/Tokyo")).today(now) == date(2026, 3, 1)


def test_today_defaults_to_now() -> None:
    zone = ZoneInfo("Pacific/Kiritimati")
    before = datetime.now(zone).date()
    today = Memory(Path("/ws"), zone).today()
    assert today in {before, datetime.now(zone).date()}


def test_notes_are_long_term_today_and_yesterday(tmp_path: Path) -> None:
    write(tmp_path, "memory/MEMORY.md", "# Memory\n\nLikes tea.\n")
    write(tmp_path, "memory/2026-03-01.md", "- 09:00 Wrote the report.\n")
    write(tmp_path, "memory/2026-02-28.md", "- Called the bank.\n")
    write(tmp_path, "memory/2026-02-27.md", "- Too old to show.\n")
    write(tmp_path, "memory/2026-03-02.md", "- Tomorrow: not shown either.\n")
    assert Memory(tmp_path, UTC).notes(DAY) == (
        Note("memory/MEMORY.md", "# Memory\n\nLikes tea."),
        Note("memory/2026-03-01.md (today)", "- 09:00 Wrote the report."),
        Note("memory/2026-02-28.md (yesterday)", "- Called the bank."),
    )


def test_missing_and_blank_files_are_left_out(tmp_path: Path) -> None:
    memory = Memory(tmp_path, UTC)
    assert memory.notes(DAY) == ()
    assert memory.prompt(DAY) == ""
    write(tmp_path, "memory/MEMORY.md", "  \n\n")
    write(tmp_path, "memory/2026-02-28.md", "- Yesterday only.\n")
    assert memory.prompt(DAY) == "## memory/2026-02-28.md (yesterday)\n\n- Yesterday only."


def test_prompt_is_cached_and_follows_edits(tmp_path: Path) -> None:
    path = write(tmp_path, "memory/MEMORY.md", "Likes tea.\n")
    memory = Memory(tmp_path, UTC)
    first = memory.prompt(DAY)
    assert first == "## memory/MEMORY.md\n\nLikes tea."
    assert memory.prompt(DAY) is first
    path.write_text("Likes tee.\n", encoding="utf-8")
    info = path.stat()
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    assert memory.prompt(DAY) == "## memory/MEMORY.md\n\nLikes tee."


def test_each_file_and_all_of_them_fit_the_budget(tmp_path: Path) -> None:
    long_term = write(tmp_path, "memory/MEMORY.md", "- fact\n" * 500)  # 3,500 characters
    write(tmp_path, "memory/2026-03-01.md", "- today\n" * 100)  # 800
    memory = Memory(tmp_path, UTC, budget=PromptBudget(file_chars=2_000, total_chars=4_000))
    prompt, [cut] = memory.prompt_within(DAY, 4_000)
    assert cut == Cut("memory/MEMORY.md", len("- fact\n" * 285) - 1, long_term.stat().st_size)
    assert "[memory/MEMORY.md is cut here" in prompt and "start_line 286" in prompt
    assert "- today\n" * 99 + "- today" in prompt  # the rest of the room
    assert memory.prompt_within(DAY, 4_000) == (prompt, (cut,))
    assert memory.prompt_within(DAY, 4_000)[0] is prompt
    squeezed, cuts = memory.prompt_within(DAY, 2_100)  # 106 left after MEMORY.md
    assert [c.title for c in cuts] == ["memory/MEMORY.md", "memory/2026-03-01.md"]
    assert "[memory/2026-03-01.md (800 bytes) is left out" in squeezed
    assert memory.prompt(DAY) == prompt  # all of the budget's room


def test_prompt_follows_the_day(tmp_path: Path) -> None:
    write(tmp_path, "memory/2026-03-01.md", "- First of March.\n")
    memory = Memory(tmp_path, UTC)
    assert memory.prompt(DAY) == "## memory/2026-03-01.md (today)\n\n- First of March."
    assert memory.prompt(date(2026, 3, 2)) == (
        "## memory/2026-03-01.md (yesterday)\n\n- First of March."
    )
    assert memory.prompt(date(2026, 3, 3)) == ""


SECRET = "password=hunter2"


@pytest.mark.parametrize("name", ["memory/MEMORY.md", "memory/2026-03-01.md"])
def test_a_note_linked_outside_the_workspace_is_refused_once(
    tmp_path: Path, warnings: list[str], name: str
) -> None:
    ws = tmp_path / "ws"
    (tmp_path / "secret.txt").write_text(SECRET, encoding="utf-8")
    write(ws, "memory/2026-02-28.md", "- Called the bank.\n")
    (ws / name).symlink_to(tmp_path / "secret.txt")
    memory = Memory(ws, UTC)
    for _ in range(3):
        assert SECRET not in memory.prompt(DAY)
        assert all(SECRET not in note.text for note in memory.notes(DAY))
    assert "Called the bank." in memory.prompt(DAY)
    refusals = [w for w in warnings if name in w]
    assert len(refusals) == 1
    assert "outside the workspace" in refusals[0]


def test_a_note_hard_linked_to_a_file_outside_is_refused(
    tmp_path: Path, warnings: list[str]
) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (tmp_path / "secret.txt").write_text(SECRET, encoding="utf-8")
    os.link(tmp_path / "secret.txt", ws / "memory" / "MEMORY.md")
    assert Memory(ws, UTC).prompt(DAY) == ""
    assert any("hard links" in w for w in warnings)
