"""The state database (embedded SQLite, or PostgreSQL): schema, migrations and the stores
built on it."""

from nanobot.store.access import Access, AllowedUser, PairingRequest
from nanobot.store.approvals import ApprovalRequest, ApprovalStore, Decision, Grant, SavedRule
from nanobot.store.cron import CronStore
from nanobot.store.database import Database, Row, SqlValue
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
    "ApprovalRequest",
    "ApprovalStore",
    "CronStore",
    "Database",
    "Decision",
    "Entry",
    "EntryKind",
    "Grant",
    "Journal",
    "NewEntry",
    "PairingRequest",
    "PendingInbound",
    "PendingOutbox",
    "Row",
    "SavedRule",
    "SessionInfo",
    "SessionStore",
    "SqlValue",
    "StoreStats",
    "UsageLedger",
    "UsageTotals",
]
