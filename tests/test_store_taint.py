"""The taint ledger's table, on both backends: marks by path and below folders, upserts that
keep or replace the source, clearing."""

from __future__ import annotations

from nanobot.store import Database
from nanobot.store.taint import TaintStore


async def test_a_marked_file_is_found_with_its_source(db: Database) -> None:
    store = TaintStore(db)
    await store.mark(["notes.md"], "written by a turn that had read https://x/", replace=True)
    [mark] = await store.marks(["notes.md", "other.md"])
    assert (mark.path, mark.source) == ("notes.md", "written by a turn that had read https://x/")
    assert await store.marks(["other.md"]) == []
    assert await store.marks([]) == []


async def test_folders_find_what_lies_below_them_only(db: Database) -> None:
    store = TaintStore(db)
    await store.mark(["docs/a.md", "docs/deep/b.md", "docs2/c.md", "docs"], "x", replace=True)
    found = await store.marks([], under=["docs"])
    assert [m.path for m in found] == ["docs/a.md", "docs/deep/b.md"]
    # `%` and `_` are no wildcards here.
    await store.mark(["a_b/file"], "x", replace=True)
    assert await store.marks([], under=["a%b"]) == []
    assert [m.path for m in await store.marks(["docs2/c.md"], under=["a_b"])] == [
        "a_b/file",
        "docs2/c.md",
    ]


async def test_an_edit_keeps_the_first_source_and_a_rewrite_replaces_it(db: Database) -> None:
    store = TaintStore(db)
    await store.mark(["f"], "first", replace=False)
    await store.mark(["f"], "second", replace=False)
    assert [m.source for m in await store.marks(["f"])] == ["first"]
    await store.mark(["f"], "third", replace=True, session_key="telegram:1")
    [mark] = await store.marks(["f"])
    assert (mark.source, mark.session_key) == ("third", "telegram:1")


async def test_clear_forgets_the_marks(db: Database) -> None:
    store = TaintStore(db)
    await store.mark(["a", "b", "c"], "x", replace=True)
    await store.clear(["a", "c", "never-marked"])
    assert [m.path for m in await store.all()] == ["b"]


async def test_many_paths_at_once(db: Database) -> None:
    store = TaintStore(db)
    paths = [f"f{i:04d}" for i in range(1000)]
    await store.mark(paths, "x", replace=True)
    assert len(await store.marks(paths)) == 1000
    await store.clear(paths[:999])
    assert [m.path for m in await store.marks(paths)] == ["f0999"]
