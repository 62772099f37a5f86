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
    """Told of every storage failure of a database it watches (`Watched.watch`)."""

    def store_failed(self, error: StoreError) -> None:
        """A statement met a storage failure; `error` is what its caller gets. Called in the
        event loop just before the caller sees it; must not raise or block."""


class Watched:
    """What a database backend inherits: its watchers, and the way to tell them."""

    _watchers: tuple[FailureWatcher, ...] = ()

    def watch(self, watcher: FailureWatcher) -> None:
        """Tell `watcher` of every storage failure from now on, whichever task's statement
        met it."""
        self._watchers = (*self._watchers, watcher)

    def _storage_failed(self, error: StoreError) -> StoreError:
        """Tell the watchers of `error`, a storage failure about to be raised; returns it."""
        error.storage = True
        for watcher in self._watchers:
            watcher.store_failed(error)
        return error
