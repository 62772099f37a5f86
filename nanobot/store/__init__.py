"""The embedded state database (SQLite, WAL): schema, migrations and the stores built on it."""

from nanobot.store.access import Access, AllowedUser, PairingRequest
from nanobot.store.cron import CronStore
from nanobot.store.database import Database, SqlValue
from nanobot.store.journal import Journal, PendingInbound, PendingOutbox
from nanobot.store.sessions import (
    Entry,
    EntryKind,
    NewEntry,
    SessionInfo,
    SessionStore,
    StoreStats,
)
from nanobot.store.usage import UsageLedger, UsageTotals

__all__ = [
    "Access",
    "AllowedUser",
    "CronStore",
    "Database",
    "Entry",
    "EntryKind",
    "Journal",
    "NewEntry",
    "PairingRequest",
    "PendingInbound",
    "PendingOutbox",
    "SessionInfo",
    "SessionStore",
    "SqlValue",
    "StoreStats",
    "UsageLedger",
    "UsageTotals",
]
