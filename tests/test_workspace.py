"""The confinement primitive: nothing outside the workspace is ever opened, read or written,
whatever links and races the model sets up inside it. Real files, real links, no mocks."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from nanobot.workspace import (
    MAX_SYMLINK_HOPS,
    OutsideWorkspace,
    UnsafeFile,
    Workspace,
    copy_template,
)

SECRET = b"api_key: sk-outside-the-workspace\n"


@dataclass(frozen=True)
class Tree:
    """tmp/ws (the workspace, holding inside.txt and sub/nested.txt), tmp/outside (holding
    secret.txt and dir/secret.txt), tmp/ws-other (a look-alike sibling)."""

    root: Path
    ws: Path
    outside: Path

    def link(self, name: str, target: str | Path) -> Path:
        path = self.ws / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
        return path


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "sub").mkdir(parents=True)
    (outside / "dir").mkdir(parents=True)
    (tmp_path / "ws-other").mkdir()
    for secret in (outside / "secret.txt", outside / "dir" / "secret.txt"):
        secret.write_bytes(SECRET)
    (tmp_path / "ws-other" / "secret.txt").write_bytes(SECRET)
    (ws / "inside.txt").write_bytes(b"inside\n")
    (ws / "sub" / "nested.txt").write_bytes(b"nested\n")
    return Tree(tmp_path, ws, outside)


def untouched(tree: Tree) -> None:
    """Nothing outside was changed or added."""
    assert (tree.outside / "secret.txt").read_bytes() == SECRET
    assert sorted(p.name for p in tree.outside.iterdir()) == ["dir", "secret.txt"]
    assert sorted(p.name for p in (tree.outside / "dir").iterdir()) == ["secret.txt"]


# --- reading ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "..",
        "../outside/secret.txt",
        "../ws-other/secret.txt",
        "sub/../../outside/secret.txt",
        "/etc/passwd",
        "{root}/outside/secret.txt",
        "{root}/ws/../outside/secret.txt",
        "{root}/ws-other/secret.txt",
    ],
)
def test_dot_dot_and_absolute_paths_outside_are_refused(tree: Tree, path: str) -> None:
    with pytest.raises(OutsideWorkspace, match="outside the workspace"):
        Workspace(tree.ws).read_bytes(path.format(root=tree.root))


def test_absolute_paths_inside_are_taken_from_the_root(tree: Tree) -> None:
    workspace = Workspace(tree.ws)
    assert workspace.read_bytes(tree.ws / "sub" / "nested.txt") == b"nested\n"
    assert workspace.read_bytes(f"{tree.ws}/sub/../inside.txt") == b"inside\n"
    # The workspace named through a symlink: paths under either name are inside.
    alias = tree.root / "alias"
    alias.symlink_to(tree.ws)
    aliased = Workspace(alias)
    assert aliased.read_bytes(alias / "inside.txt") == b"inside\n"
    assert aliased.read_bytes(tree.ws / "inside.txt") == b"inside\n"
    with pytest.raises(OutsideWorkspace):
        aliased.read_bytes(alias / ".." / "outside" / "secret.txt")


@pytest.mark.parametrize(
    ("name", "target", "path"),
    [
        ("abs_file", "{outside}/secret.txt", "abs_file"),
        ("rel_file", "../outside/secret.txt", "rel_file"),
        ("deep/rel_file", "../../outside/secret.txt", "deep/rel_file"),
        ("abs_dir", "{outside}/dir", "abs_dir/secret.txt"),
        ("rel_dir", "../outside", "rel_dir/dir/secret.txt"),
        ("root_link", "/", "root_link/etc/passwd"),
        ("sub/up", "../..", "sub/up/outside/secret.txt"),
        ("dotted", "sub/../../outside/secret.txt", "dotted"),
    ],
)
def test_a_symlink_leading_outside_is_refused(
    tree: Tree, name: str, target: str, path: str
) -> None:
    tree.link(name, target.format(outside=tree.outside))
    with pytest.raises(OutsideWorkspace, match="outside the workspace"):
        Workspace(tree.ws).read_bytes(path)
    with pytest.raises(OutsideWorkspace):
        Workspace(tree.ws).read_bytes(tree.ws / path)


def test_a_chain_of_symlinks_that_ends_outside_is_refused(tree: Tree) -> None:
    tree.link("c3", tree.outside / "secret.txt")
    tree.link("sub/c2", "../c3")
    tree.link("c1", "sub/c2")
    with pytest.raises(OutsideWorkspace):
        Workspace(tree.ws).read_bytes("c1")


def test_symlinks_inside_the_workspace_are_followed(tree: Tree) -> None:
    tree.link("rel", "inside.txt")
    tree.link("abs", tree.ws / "sub" / "nested.txt")
    tree.link("dir", "sub")
    tree.link("sub/back", "../inside.txt")
    tree.link("chain", "dir/back")
    tree.link("dir_up", "sub/..")  # a directory link whose target climbs, but stays inside
    workspace = Workspace(tree.ws)
    assert workspace.read_bytes("rel") == b"inside\n"
    assert workspace.read_bytes("abs") == b"nested\n"
    assert workspace.read_bytes("dir/nested.txt") == b"nested\n"
    assert workspace.read_bytes("chain") == b"inside\n"
    assert workspace.read_bytes("dir_up/inside.txt") == b"inside\n"
    # `..` after a followed directory link is the link target's parent, as in the kernel.
    assert workspace.read_bytes("dir/../inside.txt") == b"inside\n"


def test_a_symlink_loop_ends_with_an_error(tree: Tree) -> None:
    tree.link("a", "b")
    tree.link("b", "a")
    tree.link("self", "self/x")
    for path in ("a", "self", "a/x"):
        with pytest.raises(UnsafeFile, match="too many levels") as info:
            Workspace(tree.ws).read_bytes(path)
        assert info.value.errno == errno.ELOOP


def test_the_hop_limit_allows_long_chains_inside(tree: Tree) -> None:
    previous = "inside.txt"
    for i in range(MAX_SYMLINK_HOPS):
        tree.link(f"l{i}", previous)
        previous = f"l{i}"
    assert Workspace(tree.ws).read_bytes(previous) == b"inside\n"
    tree.link("one_more", previous)
    with pytest.raises(UnsafeFile, match="too many levels"):
        Workspace(tree.ws).read_bytes("one_more")


def test_a_dangling_symlink_reads_as_missing_inside_and_refused_outside(tree: Tree) -> None:
    tree.link("gone", "nothing.txt")
    tree.link("gone_outside", tree.outside / "nothing.txt")
    with pytest.raises(FileNotFoundError):
        Workspace(tree.ws).read_bytes("gone")
    with pytest.raises(OutsideWorkspace):
        Workspace(tree.ws).read_bytes("gone_outside")


def test_a_file_with_other_hard_links_is_refused(tree: Tree) -> None:
    # A hard link to a file outside reads like any file: only the link count gives it away.
    os.link(tree.outside / "secret.txt", tree.ws / "hard.txt")
    with pytest.raises(UnsafeFile, match="2 hard links"):
        Workspace(tree.ws).read_bytes("hard.txt")
    with pytest.raises(UnsafeFile, match="hard links"):
        Workspace(tree.ws).replace("hard.txt", b"overwritten")
    untouched(tree)
    # Where hard links are allowed (no boundary), the same file reads.
    anywhere = Workspace(Path("/"), allow_hard_links=True)
    assert anywhere.read_bytes(tree.ws / "hard.txt") == SECRET


def test_a_fifo_is_refused_without_blocking(tree: Tree) -> None:
    os.mkfifo(tree.ws / "pipe")
    with pytest.raises(UnsafeFile, match="not a regular file"):
        Workspace(tree.ws).read_bytes("pipe")


def test_a_directory_is_not_a_file(tree: Tree) -> None:
    for path in ("sub", ".", "sub/..", ""):
        with pytest.raises(IsADirectoryError):
            Workspace(tree.ws).read_bytes(path)


def test_a_file_on_the_way_is_not_a_directory(tree: Tree) -> None:
    with pytest.raises(NotADirectoryError):
        Workspace(tree.ws).read_bytes("inside.txt/x")


def test_a_directory_swapped_for_a_symlink_between_two_calls(tree: Tree) -> None:
    workspace = Workspace(tree.ws)
    (tree.ws / "notes").mkdir()
    (tree.ws / "notes" / "secret.txt").write_bytes(b"mine\n")
    assert workspace.read_bytes("notes/secret.txt") == b"mine\n"
    (tree.ws / "notes" / "secret.txt").unlink()
    (tree.ws / "notes").rmdir()
    tree.link("notes", tree.outside)
    with pytest.raises(OutsideWorkspace):
        workspace.read_bytes("notes/secret.txt")
    with pytest.raises(OutsideWorkspace):
        workspace.replace("notes/secret.txt", b"pwned")
    with pytest.raises(OutsideWorkspace):
        os.close(workspace.open_dir("notes"))
    untouched(tree)


@contextmanager
def swapping(tree: Tree, name: str) -> Iterator[None]:
    """While the block runs, the symlink `ws/name` keeps pointing alternately to a directory
    inside (holding secret.txt, which reads "mine") and to one outside (holding the secret).
    Each change is one atomic rename of a new symlink over it: the classic check-then-use
    attack, with `name` always present."""
    inside = tree.ws / f".{name}.real"
    inside.mkdir()
    (inside / "secret.txt").write_bytes(b"mine\n")
    (tree.ws / name).symlink_to(inside.name)
    stop = threading.Event()

    def swap() -> None:
        targets = [str(tree.outside / "dir"), inside.name]
        while not stop.is_set():
            target = targets[0]
            temp = tree.ws / f".{name}.next"
            temp.symlink_to(target)
            temp.rename(tree.ws / name)
            targets.reverse()

    thread = threading.Thread(target=swap)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_a_directory_swapped_during_reads_never_lets_the_secret_through(tree: Tree) -> None:
    workspace = Workspace(tree.ws)
    outcomes: set[str] = set()
    with swapping(tree, "box"):
        # Until the race was really run (both sides seen): on a loaded machine the swapping
        # thread may get no turn for many reads.
        for tries in range(200_000):
            try:
                data = workspace.read_bytes("box/secret.txt")
            except (OutsideWorkspace, NotADirectoryError) as exc:
                outcomes.add(type(exc).__name__)
                continue
            assert data == b"mine\n"
            outcomes.add("read")
            if tries >= 2000 and {"OutsideWorkspace", "read"} <= outcomes:
                break
    assert {"OutsideWorkspace", "read"} <= outcomes


def test_a_directory_swapped_during_writes_never_writes_outside(tree: Tree) -> None:
    workspace = Workspace(tree.ws)
    written = 0
    with swapping(tree, "box"):
        for i in range(1000):
            try:
                workspace.replace("box/secret.txt", b"pwned %d" % i)
                written += 1
            except (OutsideWorkspace, NotADirectoryError):
                continue
    untouched(tree)
    assert written  # some writes went inside, through the symlink while it pointed there
    with swapping(tree, "drop"):
        for _ in range(200):
            with suppress(UnsafeFile, NotADirectoryError):
                workspace.create("drop", "upload.txt", b"pwned")
    untouched(tree)


# --- writing ---------------------------------------------------------------------------


def test_replace_creates_parents_and_leaves_no_temporary_file(tree: Tree) -> None:
    Workspace(tree.ws).replace("a/b/c.txt", b"new")
    assert (tree.ws / "a" / "b" / "c.txt").read_bytes() == b"new"
    assert [p.name for p in (tree.ws / "a" / "b").iterdir()] == ["c.txt"]


def test_replace_writes_through_a_symlink_inside(tree: Tree) -> None:
    tree.link("alias", "sub/nested.txt")
    tree.link("later", "sub/not-yet.txt")
    Workspace(tree.ws).replace("alias", b"changed")
    Workspace(tree.ws).replace("later", b"made")
    assert (tree.ws / "alias").is_symlink()
    assert (tree.ws / "sub" / "nested.txt").read_bytes() == b"changed"
    assert (tree.ws / "sub" / "not-yet.txt").read_bytes() == b"made"


@pytest.mark.parametrize("target", ["{outside}/secret.txt", "{outside}/new.txt", "../outside"])
def test_replace_never_writes_through_a_symlink_outside(tree: Tree, target: str) -> None:
    tree.link("out", target.format(outside=tree.outside))
    with pytest.raises(OutsideWorkspace):
        Workspace(tree.ws).replace("out", b"pwned")
    with pytest.raises(OutsideWorkspace):
        Workspace(tree.ws).replace("out/new.txt", b"pwned")
    untouched(tree)


def test_replace_keeps_the_mode_of_the_file(tree: Tree) -> None:
    (tree.ws / "run.sh").write_bytes(b"old")
    (tree.ws / "run.sh").chmod(0o751)
    Workspace(tree.ws).replace("run.sh", b"new")
    assert stat.S_IMODE((tree.ws / "run.sh").stat().st_mode) == 0o751


# --- creating new files (downloads) ----------------------------------------------------


def test_create_adds_a_counter_instead_of_replacing(tree: Tree) -> None:
    workspace = Workspace(tree.ws)
    names = [workspace.create("inbox", "photo.jpg", b"%d" % i) for i in range(3)]
    assert names == ["photo.jpg", "photo-1.jpg", "photo-2.jpg"]
    assert sorted(p.name for p in (tree.ws / "inbox").iterdir()) == sorted(names)
    assert (tree.ws / "inbox" / "photo-2.jpg").read_bytes() == b"2"
    assert (tree.ws / "inbox" / "photo.jpg").stat().st_nlink == 1


def test_create_never_writes_through_a_dangling_symlink(tree: Tree) -> None:
    (tree.ws / "inbox").mkdir()
    tree.link("inbox/photo.jpg", tree.outside / "planted.jpg")
    assert Workspace(tree.ws).create("inbox", "photo.jpg", b"data") == "photo-1.jpg"
    assert (tree.ws / "inbox" / "photo.jpg").is_symlink()
    assert not (tree.outside / "planted.jpg").exists()


@pytest.mark.parametrize("target", ["{outside}/dir", "sub"])
def test_create_follows_no_symlink_to_the_folder(tree: Tree, target: str) -> None:
    tree.link("inbox", target.format(outside=tree.outside))
    with pytest.raises(UnsafeFile, match="symbolic link"):
        Workspace(tree.ws).create("inbox", "photo.jpg", b"data")
    untouched(tree)
    assert sorted(p.name for p in (tree.ws / "sub").iterdir()) == ["nested.txt"]


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b"])
def test_create_takes_plain_names_only(tree: Tree, name: str) -> None:
    with pytest.raises(UnsafeFile):
        Workspace(tree.ws).create("inbox", name, b"data")


def test_put_new_leaves_any_existing_name_alone(tree: Tree) -> None:
    tree.link("planted", tree.outside / "new.txt")
    workspace = Workspace(tree.ws)
    assert not workspace.put_new(".", "planted", b"template")
    assert not workspace.put_new(".", "inside.txt", b"template")
    assert workspace.put_new("made", "new.txt", b"template")
    assert (tree.ws / "inside.txt").read_bytes() == b"inside\n"
    assert (tree.ws / "made" / "new.txt").read_bytes() == b"template"
    untouched(tree)


def test_copy_template_does_not_write_through_planted_symlinks(tree: Tree) -> None:
    tree.link("SOUL.md", tree.outside / "soul.md")  # dangling, outside
    tree.link("memory", tree.outside / "dir")  # a template folder, outside
    created = copy_template(tree.ws)
    assert tree.ws / "AGENTS.md" in created
    assert tree.ws / "SOUL.md" not in created
    untouched(tree)
    assert not (tree.outside / "soul.md").exists()


# --- the rest ---------------------------------------------------------------------------


def test_open_dir_creates_and_refuses_like_the_rest(tree: Tree) -> None:
    workspace = Workspace(tree.ws)
    fd = workspace.open_dir("x/y", create=True)
    os.close(fd)
    assert (tree.ws / "x" / "y").is_dir()
    tree.link("out", tree.outside)
    for path in ("out", "out/dir", ".."):
        with pytest.raises(OutsideWorkspace):
            workspace.open_dir(path, create=True)
    untouched(tree)


def test_no_descriptor_is_left_open(tree: Tree) -> None:
    tree.link("out", tree.outside)
    workspace = Workspace(tree.ws)
    calls: list[Callable[[], object]] = [
        lambda: workspace.read_bytes("inside.txt"),
        lambda: workspace.read_bytes("out/secret.txt"),
        lambda: workspace.read_bytes("sub/nope"),
        lambda: workspace.replace("sub/new.txt", b"x"),
        lambda: workspace.create("inbox", "f.txt", b"x"),
    ]
    descriptors = Path("/proc/self/fd")
    before = len(list(descriptors.iterdir()))
    for call in calls * 20:
        with suppress(OSError):
            call()
    assert len(list(descriptors.iterdir())) == before
