"""The SQLite file behind `SqliteDatabase`: finding and creating it privately, checking it
for damage, and saying in one line what went wrong with it."""

from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import suppress
from pathlib import Path
from typing import Final, Literal

from nanobot.errors import StoreError

BUSY_TIMEOUT_MS: Final = 5000
PRIVATE_FILE_MODE: Final = 0o600
"""The mode of the database and its -wal and -shm files: they hold every conversation."""
# The most problems a check reports, and how many of them an error message shows.
FINDINGS: Final = 100
_SHOWN: Final = 5


def find_damage(conn: sqlite3.Connection, pragma: str) -> list[str]:
    try:
        return _findings(conn.execute(f"PRAGMA {pragma}({FINDINGS})").fetchall())
    except sqlite3.DatabaseError as exc:
        if not _is_damage(exc):
            raise
        stopped = str(exc)
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    findings = []
    for (table,) in tables:
        quoted = '"' + str(table).replace('"', '""') + '"'
        try:
            found = _findings(conn.execute(f"PRAGMA {pragma}({quoted})").fetchall())
        except sqlite3.DatabaseError as exc:
            if not _is_damage(exc):
                raise
            found = [str(exc)]
        findings += [f"table {table}: {line}" for line in found]
    return findings or [stopped]


def _findings(rows: list[sqlite3.Row]) -> list[str]:
    """A check's rows as problems, one a line; none for its single "ok"."""
    lines = [
        line.strip()
        for row in rows
        for line in str(row[0]).splitlines()
        if line.strip() and not line.startswith("*** in database")
    ]
    return [] if lines == ["ok"] else lines


def _is_damage(exc: sqlite3.Error) -> bool:
    return _primary(exc) in {"SQLITE_NOTADB", "SQLITE_CORRUPT"}


def storage_failure(exc: sqlite3.Error) -> bool:
    """Whether `exc` is a failure of the storage (`nanobot.store.failures`): disk full, an
    I/O error, a file that turned read-only or cannot be opened, a damaged file."""
    return _is_damage(exc) or _primary(exc) in {
        "SQLITE_FULL",
        "SQLITE_IOERR",
        "SQLITE_READONLY",
        "SQLITE_CANTOPEN",
    }


def is_full(exc: sqlite3.Error) -> bool:
    """Whether `exc` is SQLite meeting a full disk."""
    return _primary(exc) == "SQLITE_FULL"


def _primary(exc: sqlite3.Error) -> str:
    """The primary error code's name: extended codes (SQLITE_IOERR_WRITE, …) share its meaning."""
    return "_".join(getattr(exc, "sqlite_errorname", "").split("_")[:2])


def locate(path: Path) -> tuple[Path, str]:
    """Return the absolute path and the URI to open it with, creating only the directory.

    Raises `StoreError` for problems SQLite would report less clearly.
    """
    path = path.absolute()
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a database file")
    exists = path.exists()
    # SQLite would silently open an unwritable file read-only and fail at the first write.
    if exists and not os.access(path, os.R_OK | os.W_OK):
        raise StoreError(
            f"cannot open {path}: permission denied (it must be readable and writable)"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not exists:
            _create_private(path)
    except OSError as exc:
        raise StoreError(f"cannot create {exc.filename or path}: {exc.strerror}") from exc
    for file in (path, *_companions(path)):
        _make_private(file)
    # mode=rw refuses to create: if the file vanishes between this check and the connect,
    # opening fails loudly instead of starting over with an empty database.
    return path, f"{path.as_uri()}?mode=rw"


def _companions(path: Path) -> tuple[Path, Path]:
    """The -wal and -shm files SQLite keeps beside the database in WAL mode."""
    return path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")


def _create_private(path: Path) -> None:
    """Create `path` empty (SQLite takes an empty file for an empty database), readable and
    writable by its owner only whatever the umask. SQLite gives the -wal and -shm files it
    creates the mode of the database file, so they are private too."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    except FileExistsError:  # another process made it meanwhile: it is opened like any other
        return
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    finally:
        os.close(fd)


def _make_private(file: Path) -> None:
    """Take group and others' access to `file` away, if it exists and has any (a database
    made by an older nanobot, or copied in)."""
    # PermissionError: not its owner, yet allowed to read and write it; it is left as it is.
    with suppress(FileNotFoundError, PermissionError):
        mode = stat.S_IMODE(file.stat().st_mode)
        if mode & 0o077:
            file.chmod(mode & 0o700)


def describe(path: Path, exc: sqlite3.Error) -> str:
    """One line for a human: which file, what went wrong, and what to do if it is obvious."""
    name = _primary(exc)
    if name in {"SQLITE_FULL", "SQLITE_READONLY"}:  # the latter: a disk remounted read-only
        what = (
            f"disk full while writing {path}"
            if name == "SQLITE_FULL"
            else f"{path} is read-only ({exc})"
        )
        return f"{what}; the write was not saved"
    if name == "SQLITE_IOERR":
        return f"disk I/O error on {path} ({exc})"
    if _is_damage(exc):
        return f"{path} is not a usable nanobot database ({exc}). {_restoring(path)}"
    if name == "SQLITE_BUSY":
        return (
            f"{path} stayed locked by another process for over {BUSY_TIMEOUT_MS // 1000} s ({exc})"
        )
    if name in {"SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH"}:
        return f"cannot open {path} for reading and writing ({exc})"
    return f"{path}: {exc}"


def damaged(path: Path, check: Literal["quick", "full"], findings: list[str]) -> str:
    """The refusal of a damaged file: which, what the check found, how to restore it."""
    shown = [f"  {line}" for line in findings[:_SHOWN]]
    if len(findings) > _SHOWN:
        more = len(findings) - _SHOWN
        shown.append(f"  (and {more}{'+' if len(findings) >= FINDINGS else ''} more)")
    return "\n".join(
        [
            f"{path} is damaged; SQLite's {check} check found:",
            *shown,
            f"It was left as it is, unused. {_restoring(path)}",
        ]
    )


def _restoring(path: Path) -> str:
    """How to get going again with a damaged database, and what each way loses."""
    return (
        f"To restore: stop nanobot, keep a copy of {path.name} (with {path.name}-wal and "
        f"{path.name}-shm if present), then put back a backup of {path.name}, or move it "
        "aside to start with an empty one, which loses the sessions (conversations), the "
        "messages still waiting for an answer or a delivery, cron jobs, pairings, approval "
        "rules and the usage history."
    )


def file_sizes(path: Path) -> int:
    total = 0
    for file in (path, path.with_name(path.name + "-wal")):
        with suppress(FileNotFoundError):
            total += file.stat().st_size
    return total
