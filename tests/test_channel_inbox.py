"""Received files: saved under workspace/inbox as new files, never through a symlink."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanobot.channels.base import InboxPolicy, save_file
from nanobot.workspace import ConfinementError


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


@pytest.mark.parametrize("target", ["../elsewhere", "{elsewhere}", "docs"])
async def test_an_inbox_replaced_by_a_symlink_is_not_written_through(ws: Path, target: str) -> None:
    elsewhere = ws.parent / "elsewhere"
    (ws / "docs").mkdir()
    (ws / "inbox").symlink_to(target.format(elsewhere=elsewhere))
    with pytest.raises(ConfinementError, match="symbolic link"):
        await save_file(policy(ws), "photo.jpg", b"data")
    assert list(elsewhere.iterdir()) == []
    assert list((ws / "docs").iterdir()) == []


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
