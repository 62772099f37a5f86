"""Taint that follows the data: which workspace files hold content from outside, and what a
turn has taken in so far.

A turn that has read something from outside (a fetched page, a search result, a file sent in
a chat, a subagent's result, a command that fetched) is *tainted*: its later calls ask first,
and whatever it writes may carry that content. So the file tools and exec record what such a
turn writes in a ledger (`TaintLedger`, kept in the store: it survives restarts and is shared
by a cluster's members), and reading a file the ledger names taints the reading turn in turn,
whoever's turn it is and however much later. The ledger is keyed by `key`: a path relative
to the workspace (absolute for a file outside it, where the file tools may go there).

This module is the tools' side: the vocabulary, the port, and what exec needs to tell which
files a command names and which it changed. The store keeps the rows; the agent layer adapts
them (`nanobot.agent.taint`).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Protocol

SOURCE_CHARS = 400  # of a mark's source as stored: a chain of files stays readable
SCAN_LIMIT = 20_000  # entries exec's change scan looks at, at most
_CTIME_SLACK_NS = 50_000_000  # the kernel stamps ctime from a coarse clock


class Marked(Protocol):
    """A ledger row: `path` (a `key`) holds content from outside; `source` says where it came
    from ("sent in telegram chat @42 by 42", "written by a turn that had read https://…")."""

    @property
    def path(self) -> str: ...

    @property
    def source(self) -> str: ...


class TaintLedger(Protocol):
    """The ledger as the tools use it. Every method may raise `StoreError`; the tools let it
    propagate (the call fails, saying so) rather than treat a file as clean."""

    async def marks(self, paths: Collection[str], *, under: Collection[str] = ()) -> list[Marked]:
        """The marks of `paths`, and of every path below one of the folders `under`; in one
        indexed lookup. Paths with no mark are left out."""
        ...

    async def mark(self, paths: Collection[str], source: str, *, replace: bool) -> None:
        """Record that `paths` hold content from `source`. `replace`: the files were written
        whole, so `source` is now their only origin; otherwise an existing mark keeps its
        source (an edit keeps what the file held)."""
        ...

    async def clear(self, paths: Collection[str]) -> None:
        """`paths` hold no content from outside any more (written whole by a clean turn, or
        deleted)."""
        ...


class TurnTaint:
    """What content from outside one turn has taken in so far, for its tools (the approver
    keeps its own view, from the same results). Grows, never shrinks; per turn."""

    __slots__ = ("_sources",)

    def __init__(self, sources: Sequence[str] = ()) -> None:
        self._sources: tuple[str, ...] = tuple(dict.fromkeys(sources))

    @property
    def sources(self) -> tuple[str, ...]:
        return self._sources

    def __bool__(self) -> bool:
        return bool(self._sources)

    def add(self, sources: Sequence[str]) -> None:
        new = [s for s in sources if s not in self._sources]
        if new:
            self._sources = (*self._sources, *new)

    def written(self) -> str:
        """The source of what this turn writes: "written by a turn that had read …"."""
        return cut(f"written by a turn that had read {', '.join(self._sources)}")


def cut(source: str) -> str:
    """`source` at most SOURCE_CHARS long."""
    return source if len(source) <= SOURCE_CHARS else source[: SOURCE_CHARS - 1] + "…"


def described(mark: Marked) -> str:
    """A mark as a turn's source and an untrusted wrapper's label: "notes.md, written by …"."""
    return cut(f"{mark.path}, {mark.source}")


def key(root: Path, path: Path) -> str:
    """The ledger key of `path` (absolute): relative to `root` (real, or as given) when
    inside it, else the path itself."""
    for top in (Path(os.path.realpath(root)), root.absolute()):
        if path.is_relative_to(top):
            return path.relative_to(top).as_posix()
    return str(path)


# -- what a command names ----------------------------------------------------------------------

_OPERATORS = re.compile(r"^[0-9]*[<>|&;()]+&?")
_GLOB = re.compile(r"[*?\[]")
_MAX_WORDS = 200
_MAX_GLOB_MATCHES = 200


def named_paths(command: str, root: Path) -> tuple[set[str], set[str]]:
    """The ledger keys of the files and folders `command` names that exist, inside `root`
    (where it runs, and HOME): `(files, folders)`. Words are split as the shell would,
    redirections and `--opt=value` included; globs are expanded (bounded); `~` is `root`.
    Folders exclude `root` itself (every command runs there). A heuristic: a command can read
    a file without naming it, which is why a tainted turn's calls ask anyway."""
    real_root = Path(os.path.realpath(root))
    files: set[str] = set()
    folders: set[str] = set()
    for word in _words(command):
        for candidate in _expanded(word, real_root):
            try:
                path = Path(os.path.realpath(candidate))
            except (OSError, ValueError):
                continue
            if path == real_root or not path.is_relative_to(real_root):
                continue
            relative = path.relative_to(real_root).as_posix()
            if path.is_dir():
                folders.add(relative)
            elif path.exists():
                files.add(relative)
    return files, folders


def _words(command: str) -> Iterator[str]:
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=False)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:  # an unclosed quote: the shell would refuse it, but look anyway
        words = command.split()
    for raw in words[:_MAX_WORDS]:
        for part in re.split(r"[=:;|&<>()`$\"']", _OPERATORS.sub("", raw)):
            if part and part not in {".", "-"} and not part.startswith("-"):
                yield part


def _expanded(word: str, root: Path) -> list[str]:
    if word.startswith("~/") or word == "~":
        word = str(root) + word[1:]
    target = str(root / word)  # an absolute `word` stays itself
    if not _GLOB.search(word):
        return [target]
    matches: list[str] = []
    for match in glob.iglob(target):  # noqa: PTH207 - a pattern that may be absolute
        matches.append(match)
        if len(matches) >= _MAX_GLOB_MATCHES:
            break
    return matches


# -- whether a command fetched ----------------------------------------------------------------

_NETWORK_TOOLS = frozenset(
    {
        "curl",
        "wget",
        "pip",
        "pip3",
        "pipx",
        "uv",
        "git",
        "npm",
        "npx",
        "pnpm",
        "yarn",
        "apt",
        "apt-get",
        "gem",
        "cargo",
        "go",
        "ssh",
        "scp",
        "rsync",
        "nc",
        "ncat",
        "socat",
        "telnet",
        "ftp",
        "lynx",
        "aria2c",
        "http",
        "httpie",
    }
)
_URL = re.compile(r"\b(?:https?|ftps?|wss?|git|ssh)://[^\s'\"<>|;&()`]+", re.IGNORECASE)
_NETWORK_CODE = re.compile(
    r"\b(?:urllib|requests|httpx|aiohttp|http\.client|socket|fetch\(|urlopen|/dev/tcp/)",
    re.IGNORECASE,
)


def may_fetch(command: str) -> str | None:
    """Why `command` may bring in content from the network, when nothing watched it (no
    egress proxy: `network: host`): a URL, a program known to fetch, or code that opens
    connections; None when it shows none of these. A fallback, not a boundary."""
    url = _URL.search(command)
    if url is not None:
        return f"a command that fetched {cut(url.group())}"
    for word in re.split(r"[\s;&|()`$<>]+", command):
        name = word.rsplit("/", 1)[-1]
        if name in _NETWORK_TOOLS:
            return f"the output of a command that may have fetched ({name})"
    if _NETWORK_CODE.search(command):
        return "the output of a command that may have fetched (network code)"
    return None


# -- what a command changed --------------------------------------------------------------------


def scan_start() -> int:
    """The moment to compare change times with, taken just before a command starts."""
    return time.time_ns() - _CTIME_SLACK_NS


def changed_since(root: Path, since_ns: int, *, limit: int = SCAN_LIMIT) -> tuple[list[str], bool]:
    """Keys of the files under `root` whose inode changed at or after `since_ns` (ctime:
    content, rename, links, mode, times set back; a command cannot set it back as it can the
    mtime), and whether all of `root` was looked at (False past `limit` entries). Blocking:
    run it in a thread. Symlinks are not followed; what one points to is its own entry."""
    top = os.path.realpath(root)
    cut_at = len(top) + 1
    found: list[str] = []
    seen = 0
    stack = [top]
    while stack:
        try:
            scan = os.scandir(stack.pop())
        except OSError:
            continue
        with scan:
            for entry in scan:
                seen += 1
                if seen > limit:
                    return found, False
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.stat(follow_symlinks=False).st_ctime_ns >= since_ns:
                        found.append(entry.path[cut_at:])
                except OSError:
                    continue
    return found, True
