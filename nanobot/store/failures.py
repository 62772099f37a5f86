"""Storage failures, told to whoever watches the database: the gate stops intake on them.

A storage failure is a statement failing because of where the data lives, not because of
what the statement said: the disk is full, an I/O error, the file (or server) became
read-only or cannot be reached, the file is damaged. A constraint, a bad query or a lock
held too long by another process is none. Each backend says which of its errors are.
"""

from __future__ import annotations

from typing import Protocol

from nanobot.errors import StoreError


class FailureWatcher(Protocol):
    """Told of every storage failure of the database opened with it (`Database.open`'s
    `watch`)."""

    def store_failed(self, error: StoreError) -> None:
        """A statement met a storage failure; `error` is what its caller gets. Called in the
        event loop just before the caller sees it; must not raise or block."""


class LateWatcher:
    """A `FailureWatcher` that exists before what it tells: the database is opened with it,
    and the part that stops on storage failures (the gate) is built later on that database
    (it reads and writes through it), then bound here once. A failure before then is told to
    no one: nothing is taken in yet."""

    def __init__(self) -> None:
        self._target: FailureWatcher | None = None

    def bind(self, target: FailureWatcher) -> None:
        """Tell `target` of every storage failure from now on. Raises `RuntimeError` when
        bound already: one part reacts, built once."""
        if self._target is not None:
            raise RuntimeError("the storage-failure watcher is bound already")
        self._target = target

    def store_failed(self, error: StoreError) -> None:
        if self._target is not None:
            self._target.store_failed(error)


class Watched:
    """What a database backend inherits: its watcher (set as `Database.open` opens it), and
    the way to tell it."""

    _watcher: FailureWatcher | None = None

    def _storage_failed(self, error: StoreError) -> StoreError:
        """Tell the watcher of `error`, a storage failure about to be raised; returns it."""
        error.storage = True
        if self._watcher is not None:
            self._watcher.store_failed(error)
        return error
