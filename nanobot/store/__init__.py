"""The embedded state database (SQLite, WAL): schema, migrations and the stores built on it."""

from nanobot.store.database import Database, SqlValue
from nanobot.store.sessions import (
    Entry,
    EntryKind,
    NewEntry,
    SessionInfo,
    SessionStore,
    StoreStats,
)

__all__ = [
    "Database",
    "Entry",
    "EntryKind",
    "NewEntry",
    "SessionInfo",
    "SessionStore",
    "SqlValue",
    "StoreStats",
]
