"""Received files: saved under workspace/inbox as new files, never through a symlink; what
stands in the inbox folder's place is moved aside, and a file that cannot be kept is said why."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanobot.channels.base import InboxError, InboxPolicy, save_file


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    (tmp_path / "elsewhere").mkdir()
    return tmp_path / "ws"


def policy(ws: Path) -> InboxPolicy:
    return InboxPolicy(ws / "inbox", max_bytes=1000, workspace=ws)


async def test_files_are_saved_as_new_files_in_the_inbox(ws: Path) -> None:
    first = await save_file(policy(ws), "photo.jpg", b"one")
    second = await save_file(policy(ws), "photo.jpg", b"two")
    assert first == ws / "inbox" / "photo.jpg"
    assert second == ws / "inbox" / "photo-1.jpg"
    assert first.read_bytes() == b"one"
    assert second.read_bytes() == b"two"
    assert sorted(p.name for p in (ws / "inbox").iterdir()) == ["photo-1.jpg", "photo.jpg"]
    assert first.stat().st_nlink == 1  # the temporary name is gone


async def test_the_workspace_defaults_to_the_inbox_parent(ws: Path) -> None:
    saved = await save_file(InboxPolicy(ws / "inbox"), "a.txt", b"x")
    assert saved.read_bytes() == b"x"


@pytest.mark.parametrize("target", ["../elsewhere", "{elsewhere}", "docs", "gone"])
async def test_an_inbox_replaced_by_a_symlink_is_moved_aside_not_written_through(
    ws: Path, target: str, warnings: list[str]
) -> None:
    elsewhere = ws.parent / "elsewhere"
    (ws / "docs").mkdir()
    (ws / "inbox").symlink_to(target.format(elsewhere=elsewhere))
    saved = await save_file(policy(ws), "photo.jpg", b"data")
    assert saved == ws / "inbox" / "photo.jpg" and saved.read_bytes() == b"data"
    assert (ws / "inbox").is_dir() and not (ws / "inbox").is_symlink()
    aside = ws / "inbox.not-a-folder"
    assert aside.is_symlink() and str(aside.readlink()) == target.format(elsewhere=elsewhere)
    assert list(elsewhere.iterdir()) == []
    assert list((ws / "docs").iterdir()) == []
    [warning] = warnings
    assert "was a symbolic link, not a folder: moved it aside to" in warning
    assert str(aside) in warning


async def test_an_inbox_that_is_a_file_is_moved_aside_kept_whole(
    ws: Path, warnings: list[str]
) -> None:
    (ws / "inbox").write_bytes(b"the agent's notes")
    (ws / "inbox.not-a-folder").write_bytes(b"moved before")
    first = await save_file(policy(ws), "a.txt", b"one")
    second = await save_file(policy(ws), "b.txt", b"two")
    assert [first.read_bytes(), second.read_bytes()] == [b"one", b"two"]
    assert (ws / "inbox.not-a-folder").read_bytes() == b"moved before"  # never replaced
    assert (ws / "inbox.not-a-folder-1").read_bytes() == b"the agent's notes"
    assert (ws / "inbox.not-a-folder-1").stat().st_nlink == 1
    assert len(warnings) == 1  # once, when it was moved
    assert "was a file, not a folder" in warnings[0]


async def test_a_symlink_on_the_way_to_the_inbox_refuses_the_file_with_a_reason(
    tmp_path: Path, ws: Path
) -> None:
    elsewhere = ws.parent / "elsewhere"
    (ws / "people").symlink_to(elsewhere)
    person = InboxPolicy(ws / "people" / "alice" / "inbox", workspace=ws)
    with pytest.raises(InboxError) as raised:
        await save_file(person, "photo.jpg", b"data")
    assert isinstance(raised.value, OSError)
    assert raised.value.line() == (
        "I could not keep photo.jpg: the inbox folder has a symbolic link on its way "
        "('people'); none is followed. Please send it again later."
    )
    assert list(elsewhere.iterdir()) == [] and (ws / "people").is_symlink()


async def test_a_dangling_symlink_named_like_the_file_is_left_alone(ws: Path) -> None:
    planted = ws.parent / "elsewhere" / "planted.sh"
    (ws / "inbox").mkdir()
    (ws / "inbox" / "photo.jpg").symlink_to(planted)
    saved = await save_file(policy(ws), "photo.jpg", b"data")
    assert saved == ws / "inbox" / "photo-1.jpg"
    assert saved.read_bytes() == b"data"
    assert not planted.exists()
    assert (ws / "inbox" / "photo.jpg").is_symlink()


async def test_an_existing_file_is_never_replaced(ws: Path) -> None:
    (ws / "inbox").mkdir()
    (ws / "inbox" / "notes.txt").write_bytes(b"mine")
    saved = await save_file(policy(ws), "notes.txt", b"theirs")
    assert saved.name == "notes-1.txt"
    assert (ws / "inbox" / "notes.txt").read_bytes() == b"mine"


async def test_with_no_name_left_to_move_it_aside_to_the_file_is_refused_and_nothing_lost(
    ws: Path,
) -> None:
    (ws / "inbox").write_text("in the way")
    for counter in range(100):
        (ws / ("inbox.not-a-folder" + (f"-{counter}" if counter else ""))).write_text("")
    with pytest.raises(InboxError) as raised:
        await save_file(policy(ws), "a.txt", b"data")
    assert raised.value.line() == (
        "I could not keep a.txt: saving it failed (no free name to move it aside to). "
        "Please send it again later."
    )
    assert (ws / "inbox").read_text() == "in the way"
