"""File tools: read_file, write_file, edit_file and list_dir.

All paths go through `workspace_path.resolve`, which says where a path points and, with
`restrict` (the default), refuses one that leads outside the workspace. The file is then
opened through `nanobot.workspace.Workspace`, component by component without following any
symlink out, so a path the model changes between that check and the open still cannot leave
the workspace; files with other hard links are refused. Without `restrict` the same walk
starts at `/` and allows hard links. File IO is blocking, so each call does its work in a
thread. Writes are atomic: a temporary file in the same directory is renamed over the target,
so a crash or a cancelled call leaves either the old file or the new one, never half of it.

With a taint ledger (`nanobot.tools.taint`): reading a file the ledger marks taints the turn
and wraps the text as untrusted data; a tainted turn's writes mark the file (before writing,
so a failing store never leaves such a file unmarked), and a whole new content written by a
clean turn clears its mark (an edit keeps it: the rest of the file is what it was).
"""

from __future__ import annotations

import asyncio
import difflib
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from pydantic import Field

from nanobot.people import PEOPLE_DIR, SHARED_FILES
from nanobot.tools._line_window import read_window
from nanobot.tools.base import Tool, ToolError, ToolParams, ToolResult, current_context, untrusted
from nanobot.tools.registry import MAX_RESULT_CHARS
from nanobot.tools.taint import TaintLedger, described, key
from nanobot.tools.workspace_path import resolve
from nanobot.workspace import ConfinementError, OutsideWorkspace, Workspace

BINARY_SNIFF_BYTES = 8192
MAX_EDIT_BYTES = 10_000_000
MAX_LIST_ENTRIES = 500

A = TypeVar("A")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class _View:
    """Where one path of a call is taken from: `root` (relative paths start there and may
    not leave it) through `files`; `shared`: the folder of the shared prompt files, which
    a person's turn reads but does not change."""

    root: Path
    files: Workspace
    shared: bool = False


class _FileTool:
    """What the file tools share: the workspace and how paths are resolved and shown.

    A turn that runs as a person (`ToolContext.root`, `people.isolation: person`) sees that
    person's folder as its workspace, with the shared prompt files (`SHARED_FILES`: AGENTS.md,
    skills/, …) of `ToolContext.shared` read-only on top; nothing else of the workspace."""

    name: ClassVar[str]

    def __init__(
        self, workspace: Path, *, restrict: bool = True, ledger: TaintLedger | None = None
    ) -> None:
        self.workspace = workspace
        self.restrict = restrict
        self.ledger = ledger
        self._files = (
            Workspace(workspace) if restrict else Workspace(Path("/"), allow_hard_links=True)
        )

    def _view(self, raw: str, *, write: bool = False) -> _View:
        """Where `raw` is taken from in the current turn (see the class)."""
        context = current_context.get()
        if context is None or context.root is None or not self.restrict:
            return _View(self.workspace, self._files)
        shared = context.shared
        if shared is not None and _is_shared(shared, context.root, raw):
            if write:
                raise ToolError(
                    f"{raw!r} is one of the shared files everyone's conversations use; it is "
                    "read-only here. Keep your own notes in your folder (e.g. memory/MEMORY.md)."
                )
            return _View(shared, Workspace(shared), shared=True)
        return _View(context.root, Workspace(context.root))

    async def _in_thread(self, work: Callable[[A], R], args: A) -> R:
        """Run blocking `work` off the event loop; OS errors become messages for the model."""
        try:
            return await asyncio.to_thread(work, args)
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise ToolError(f"{self.name} failed: {exc.strerror or exc}{where}") from None

    def _key(self, raw: str) -> str:
        """The ledger key of the file `raw` names (relative to the whole workspace, so two
        people's files never share one)."""
        root = self._view(raw).root
        return key(self.workspace, resolve(root, raw, restrict=self.restrict))

    async def _written(self, raw: str, write: Callable[[], Awaitable[str]]) -> str:
        """Run `write` (which replaces or edits the file `raw`) and keep the ledger right:
        a tainted turn marks the file first; a clean one clears a whole rewrite's mark."""
        context = current_context.get()
        self._view(raw, write=True)  # a shared file is refused before anything is marked
        if self.ledger is None or context is None:
            return await write()
        path = self._key(raw)
        whole = self.name == "write_file"
        if context.taint:
            await self.ledger.mark([path], context.taint.written(), replace=whole)
            done = await write()
            return f"{done} (marked as holding content from outside: read back, it is data)"
        done = await write()
        if whole:
            await self.ledger.clear([path])
        return done

    def _locate(self, raw: str, *, write: bool = False) -> tuple[str, str, Workspace]:
        """Where `raw` points, as the returned `Workspace` takes it, and as the model should
        see it."""
        view = self._view(raw, write=write)
        path = resolve(view.root, raw, restrict=self.restrict)
        root = Path(os.path.realpath(view.root))
        shown = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
        if view.shared and path.is_relative_to(root / PEOPLE_DIR):
            # A shared file that leads into people's folders (a link made before they were
            # kept apart) is no way into someone else's.
            raise ToolError(f"path {raw!r} leads into people's folders; it cannot be used")
        return (shown if self.restrict else str(path)), shown, view.files

    def _open(self, where: str, shown: str, files: Workspace) -> tuple[int, os.stat_result]:
        """A read-only descriptor of the regular file at `where`, and its stat."""
        with _refusals(shown):
            try:
                return files.open_file(where)
            except FileNotFoundError:
                raise ToolError(
                    f"file {shown!r} does not exist; use list_dir to see what is there"
                ) from None
            except IsADirectoryError:
                raise ToolError(
                    f"{shown!r} is a directory; use list_dir to see what is in it"
                ) from None

    def _replace(self, where: str, shown: str, data: bytes, files: Workspace) -> None:
        """Make `data` the content of `where` atomically, creating missing directories."""
        with _refusals(shown):
            try:
                files.replace(where, data)
            except IsADirectoryError:
                raise ToolError(
                    f"{shown!r} is a directory; give the path of a file inside it"
                ) from None
            except (FileExistsError, NotADirectoryError):
                raise ToolError(
                    f"cannot create {shown!r}: a part of its directory path is a file"
                ) from None


def _is_shared(shared: Path, root: Path, raw: str) -> bool:
    """Whether `raw` names one of the shared prompt files (or something in `skills/`):
    relative, by its first part; absolute, under `shared` but not under `root`."""
    path = Path(os.path.normpath(raw))
    if path.is_absolute():
        if path.is_relative_to(root) or not path.is_relative_to(shared):
            return False
        path = path.relative_to(shared)
    return bool(path.parts) and path.parts[0] in SHARED_FILES


@contextmanager
def _refusals(shown: str) -> Iterator[None]:
    """Paths the workspace refuses to open, as messages for the model."""
    try:
        yield
    except OutsideWorkspace as exc:
        raise ToolError(f"path {shown!r} {exc.reason}; only files inside it can be used") from None
    except ConfinementError as exc:
        raise ToolError(f"{shown!r} {exc.reason}") from None


class ReadFileParams(ToolParams):
    path: str = Field(description="File to read, relative to the workspace.")
    start_line: int | None = Field(
        default=None, ge=1, description="First line to return (1-based). Default: 1."
    )
    end_line: int | None = Field(
        default=None, ge=1, description="Last line to return (1-based, inclusive). Default: end."
    )


class ReadFileTool(_FileTool, Tool[ReadFileParams]):
    """Reads a UTF-8 text file, or a range of its lines, within a size budget."""

    name = "read_file"
    description = (
        "Read a text file. Long files are returned in parts: the result then says which lines "
        "were shown and how to ask for the next ones with start_line/end_line."
    )
    params = ReadFileParams

    def __init__(
        self,
        workspace: Path,
        *,
        restrict: bool = True,
        max_lines: int = 2000,
        max_chars: int = MAX_RESULT_CHARS - 1000,
        ledger: TaintLedger | None = None,
    ) -> None:
        super().__init__(workspace, restrict=restrict, ledger=ledger)
        self.max_lines = max_lines
        # Below the registry's cut, so the note saying where to continue is never cut off.
        self.max_chars = max_chars

    async def run(self, args: ReadFileParams) -> str | ToolResult:
        text, note, path = await self._in_thread(self._read, args)
        marks = await self.ledger.marks([path]) if self.ledger is not None else []
        if not marks:
            return text + note
        source = described(marks[0])
        return ToolResult(untrusted(source, text) + note, taint=(source,))

    def _read(self, args: ReadFileParams) -> tuple[str, str, str]:
        """The text read, the note after it (which lines were shown), and the file's key."""
        start, end = args.start_line or 1, args.end_line
        if end is not None and end < start:
            raise ToolError(f"end_line ({end}) is before start_line ({start})")
        where, shown, files = self._locate(args.path)
        path = self._key(args.path)
        fd, info = self._open(where, shown, files)
        size = info.st_size
        with os.fdopen(fd, "rb") as f:
            if b"\0" in f.read(BINARY_SNIFF_BYTES):
                raise _binary(shown, size)
            f.seek(0)
            try:
                window = read_window(f, start, end, self.max_lines, self.max_chars)
            except UnicodeDecodeError:
                raise _binary(shown, size) from None
        if window.total == 0:
            return "(the file is empty)", "", path
        if window.last == 0:
            raise ToolError(
                f"start_line {start} is past the end of {shown!r}, which has {window.total} lines"
            )
        whole = window.first == 1 and window.last == window.total and not window.cut_line
        if whole:
            return window.text, "", path
        note = f"[showing lines {window.first}-{window.last} of {window.total} in {shown!r}"
        if window.cut_line:
            note += f"; line {window.last} is longer and was cut"
        asked_for_more = end is None or window.last < end
        if window.last < window.total and asked_for_more:
            note += f"; to read on, call read_file with start_line={window.last + 1}"
        text = window.text if window.text.endswith("\n") else window.text + "\n"
        return text, f"{note}]", path


class WriteFileParams(ToolParams):
    path: str = Field(description="File to write, relative to the workspace.")
    content: str = Field(description="The complete new content of the file.")


class WriteFileTool(_FileTool, Tool[WriteFileParams]):
    """Creates or replaces a file atomically, creating missing parent directories."""

    name = "write_file"
    description = (
        "Create a file or replace its whole content. Missing parent directories are created. "
        "To change part of an existing file, use edit_file instead."
    )
    params = WriteFileParams

    async def run(self, args: WriteFileParams) -> str:
        return await self._written(args.path, lambda: self._in_thread(self._write, args))

    def _write(self, args: WriteFileParams) -> str:
        where, shown, files = self._locate(args.path, write=True)
        data = args.content.encode("utf-8")
        self._replace(where, shown, data, files)
        return f"wrote {len(data)} bytes to {shown}"


class EditFileParams(ToolParams):
    path: str = Field(description="File to edit, relative to the workspace.")
    old_text: str = Field(
        description="Exact text to replace, including whitespace; it must occur exactly once."
    )
    new_text: str = Field(description="Text to put in its place.")


class EditFileTool(_FileTool, Tool[EditFileParams]):
    """Replaces one exact, unique occurrence of a text in a file, atomically."""

    name = "edit_file"
    description = (
        "Replace one exact occurrence of old_text with new_text in a file. old_text must match "
        "the file exactly (whitespace included) and occur once; include surrounding lines to "
        "make it unique."
    )
    params = EditFileParams

    async def run(self, args: EditFileParams) -> str:
        return await self._written(args.path, lambda: self._in_thread(self._edit, args))

    def _edit(self, args: EditFileParams) -> str:
        if not args.old_text:
            raise ToolError("old_text is empty; to create or overwrite a file use write_file")
        where, shown, files = self._locate(args.path, write=True)
        fd, info = self._open(where, shown, files)
        size = info.st_size
        with os.fdopen(fd, "rb") as f:
            if size > MAX_EDIT_BYTES:
                raise ToolError(f"{shown!r} is {_human_size(size)}, too large to edit in place")
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise _binary(shown, size) from None
        old, new = args.old_text, args.new_text
        if old not in text and "\r\n" in text and "\r\n" not in old:
            # The model writes "\n"; a Windows-style file has "\r\n".
            old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
        count = text.count(old)
        if count == 0:
            raise ToolError(f"old_text was not found in {shown!r}. {_closest(text, old)}")
        if count > 1:
            lines = _lines_of(text, old)
            raise ToolError(
                f"old_text occurs {count} times in {shown!r} (at lines {lines}); include more "
                "surrounding text so that it matches exactly once"
            )
        at = text.index(old)
        self._replace(where, shown, text.replace(old, new, 1).encode("utf-8"), files)
        first = text.count("\n", 0, at) + 1
        last = first + old.count("\n")
        return f"edited {shown}: replaced lines {first}-{last}"


def _closest(text: str, old: str) -> str:
    """A hint for old_text that does not match: the file's line most like its first line."""
    if " ".join(old.split()) in " ".join(text.split()):
        return (
            "It does match if whitespace is ignored: copy the indentation and line breaks exactly."
        )
    wanted = next((line for line in old.splitlines() if line.strip()), old)
    lines = text.splitlines()
    matches = difflib.get_close_matches(wanted.strip(), [s.strip() for s in lines], n=1, cutoff=0.5)
    if not matches:
        return "Read the file again to see its current content."
    lineno = next(i for i, line in enumerate(lines, 1) if line.strip() == matches[0])
    return f"The closest line is line {lineno}: {lines[lineno - 1]!r}."


def _lines_of(text: str, old: str) -> str:
    found: list[str] = []
    at = text.find(old)
    while at != -1 and len(found) < 10:
        found.append(str(text.count("\n", 0, at) + 1))
        at = text.find(old, at + len(old))
    return ", ".join(found)


class ListDirParams(ToolParams):
    path: str = Field(default=".", description="Directory to list, relative to the workspace.")


class ListDirTool(_FileTool, Tool[ListDirParams]):
    """Lists a directory: sorted names, directories marked with '/', sizes of files."""

    name = "list_dir"
    description = (
        "List the entries of a directory: directories end with '/', files show their size, "
        "symlinks show their target."
    )
    params = ListDirParams

    def __init__(
        self, workspace: Path, *, restrict: bool = True, max_entries: int = MAX_LIST_ENTRIES
    ) -> None:
        super().__init__(workspace, restrict=restrict)
        self.max_entries = max_entries

    async def run(self, args: ListDirParams) -> str:
        return await self._in_thread(self._list, args)

    def _list(self, args: ListDirParams) -> str:
        where, shown, files = self._locate(args.path)
        with _refusals(shown):
            try:
                fd = files.open_dir(where)
            except FileNotFoundError:
                raise ToolError(f"directory {shown!r} does not exist") from None
            except NotADirectoryError:
                raise ToolError(
                    f"{shown!r} is a file, not a directory; use read_file to read it"
                ) from None
        try:
            with os.scandir(fd) as scan:
                entries = sorted(scan, key=lambda e: e.name)
            if not entries:
                return f"{shown}/ is empty"
            lines = [_describe_entry(fd, e) for e in entries[: self.max_entries]]
        finally:
            os.close(fd)
        if len(entries) > self.max_entries:
            lines.append(f"[... {len(entries) - self.max_entries} more entries not shown]")
        return f"{shown}/ ({len(entries)} entries):\n" + "\n".join(lines)


def _describe_entry(dir_fd: int, entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return f"{entry.name} -> {os.readlink(entry.name, dir_fd=dir_fd)}"
    if entry.is_dir():
        return f"{entry.name}/"
    try:
        return f"{entry.name}  ({_human_size(entry.stat().st_size)})"
    except OSError:
        return entry.name


def _binary(shown: str, size: int) -> ToolError:
    return ToolError(
        f"{shown!r} is a binary file ({_human_size(size)}), not UTF-8 text; read_file only reads "
        "text (the exec tool can inspect it, e.g. with 'file' or 'xxd')"
    )


def _human_size(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    value = float(size)
    for unit in ("KB", "MB", "GB"):
        value /= 1024
        if value < 1024 or unit == "GB":
            break
    return f"{value:.1f} {unit}"
