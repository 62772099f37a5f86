"""The owner-only masks the sandbox applies at each call: found at start, kept current by
inotify, and walked again only where something changed."""

from __future__ import annotations

from pathlib import Path

from nanobot.tools._masks import OwnerOnlyMasks


def hidden(masks: OwnerOnlyMasks) -> set[str]:
    """The paths the current arguments hide."""
    args = masks.args()
    files = {args[i + 2] for i, arg in enumerate(args) if arg == "--ro-bind"}
    return files | {args[i + 1] for i, arg in enumerate(args) if arg == "--tmpfs"}


def private(path: Path, text: str = "secret") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_what_only_its_owner_may_read_is_hidden_at_any_depth(tmp_path: Path) -> None:
    key = private(tmp_path / "a" / "b" / "key")
    (tmp_path / "a" / "open").write_text("fine")
    (tmp_path / "vault").mkdir(mode=0o700)
    (tmp_path / "vault").chmod(0o700)
    masks = OwnerOnlyMasks([(tmp_path, True)])
    assert hidden(masks) == {str(key), str(tmp_path / "vault")}
    assert "--remount-ro" in masks.args()  # a private folder becomes an empty read-only one


def test_changes_after_start_are_seen_at_the_next_call(tmp_path: Path) -> None:
    (tmp_path / "deep" / "er").mkdir(parents=True)
    masks = OwnerOnlyMasks([(tmp_path, True)])
    assert hidden(masks) == set()
    unchanged = masks.args()
    assert masks.args() is unchanged  # nothing changed: no walk, the same list
    made = private(tmp_path / "deep" / "er" / "new-key")
    assert hidden(masks) == {str(made)}
    opened = tmp_path / "deep" / "readable"
    opened.write_text("x")
    opened.chmod(0o644)
    assert str(opened) not in hidden(masks)
    opened.chmod(0o600)  # made private after the walk saw it: IN_ATTRIB on its folder
    assert str(opened) in hidden(masks)
    fresh = tmp_path / "new-tree" / "a" / "b"
    fresh.mkdir(parents=True)
    late = private(fresh / "token")
    assert str(late) in hidden(masks)
    (tmp_path / "new-tree").rename(tmp_path / "moved-tree")
    assert hidden(masks) == {str(made), str(opened), str(tmp_path / "moved-tree/a/b/token")}
    (tmp_path / "moved-tree").chmod(0o700)  # the whole tree made private: one mask for it
    assert hidden(masks) == {str(made), str(opened), str(tmp_path / "moved-tree")}
    masks.close()


def test_skipped_folders_are_not_looked_into(tmp_path: Path) -> None:
    private(tmp_path / "workspace" / "mine")
    theirs = private(tmp_path / "etc" / "theirs")
    masks = OwnerOnlyMasks([(tmp_path, True)], skip=[tmp_path / "workspace"])
    assert hidden(masks) == {str(theirs)}


def test_without_inotify_every_call_walks_again(tmp_path: Path) -> None:
    masks = OwnerOnlyMasks([(tmp_path, True)])
    masks.close()  # as when the watch limit is reached
    made = private(tmp_path / "after" / "key")
    assert hidden(masks) == {str(made)}


def test_a_first_walk_in_the_background_is_waited_for(tmp_path: Path) -> None:
    keys = [private(tmp_path / f"d{n}" / "e" / "key") for n in range(50)]
    masks = OwnerOnlyMasks([(tmp_path, True)], background=True)
    masks.wait()
    assert masks.ready
    assert hidden(masks) == {str(k) for k in keys}
    late = OwnerOnlyMasks([(tmp_path, True)], background=True)
    assert hidden(late) == {str(k) for k in keys}  # args waits by itself
