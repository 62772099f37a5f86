"""What asyncpg's failures mean to the PostgreSQL store: which ended the connection (a
statement outside a block may be sent again), which are storage failures (see
`nanobot.store.failures`), and the one line each becomes, the URL's password never in it."""

from __future__ import annotations

from typing import Final

import asyncpg

from nanobot.store import url as store_url

# What the driver raises when a statement fails (the server's errors, a lost connection,
# asyncpg's own state errors).
FAILURES: Final = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
)
_ENDED_BY_SERVER: Final = frozenset({"57P01", "57P02", "57P03"})  # admin/crash shutdown, …
# Where the data lives failing, not the statement: the disk full or out of resources, the
# server read-only (a standby) or shutting down.
_STORAGE_SQLSTATES: Final = frozenset({"53100", "53000", "53200", "58030", "25006"})


def ended_by_server(exc: BaseException) -> bool:
    """Whether the connection was found closed before the statement went out, or the server
    ended it (aborting whatever it ran)."""
    if isinstance(exc, asyncpg.exceptions.ConnectionDoesNotExistError):
        cause = exc.__cause__
        return getattr(cause, "sqlstate", None) in _ENDED_BY_SERVER
    if isinstance(exc, asyncpg.PostgresError):
        return getattr(exc, "sqlstate", None) in _ENDED_BY_SERVER
    if isinstance(exc, asyncpg.exceptions.InternalClientError):
        return True  # the protocol refused to start the statement: it never went out
    return _closed_before(exc)


def is_storage_failure(exc: BaseException) -> bool:
    """Whether `exc` is a storage failure: the server or the connection to it lost, or the
    server unable to store anything."""
    lost = (
        OSError,
        asyncpg.exceptions.ConnectionDoesNotExistError,
        asyncpg.exceptions.InternalClientError,  # the protocol's state after a lost connection
    )
    if isinstance(exc, lost):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", None)
        return state in _STORAGE_SQLSTATES or state in _ENDED_BY_SERVER
    return _closed_before(exc)


def _closed_before(exc: BaseException) -> bool:
    """Whether asyncpg refused to send the statement: its connection had closed (and gone
    back to the pool)."""
    text = str(exc)
    return isinstance(exc, asyncpg.InterfaceError) and (
        "connection is closed" in text or "released back to the pool" in text
    )


def reason_of(exc: BaseException) -> str:
    """Why a statement failed, in one line: a lost connection says whether it may have run."""
    if isinstance(exc, asyncpg.exceptions.ConnectionDoesNotExistError | OSError):
        return f"lost the connection ({exc}); a statement under way may or may not have run"
    if _closed_before(exc) or ended_by_server(exc):
        return f"lost the connection ({getattr(exc, 'message', None) or exc})"
    # The server's message alone: its DETAIL quotes the row, which may be a conversation.
    return str(getattr(exc, "message", None) or exc) or type(exc).__name__


def unusable(url: str, exc: BaseException, *, timeout: float, secret: str | None = None) -> str:
    """Why the database at `url` cannot be used, in one line, its password hidden; `timeout`
    is how long connecting may take."""
    where = store_url.redact(url)
    secret = secret if secret is not None else store_url.password(url)
    if isinstance(exc, asyncpg.exceptions.InvalidAuthorizationSpecificationError):
        why = f"PostgreSQL refused the login ({exc})"
    elif isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError):
        why = f"{exc}; create it first (createdb, or CREATE DATABASE)"
    elif isinstance(exc, TimeoutError):
        why = f"no answer within {timeout:.0f} s"
    elif isinstance(exc, OSError):
        why = f"cannot reach the server ({exc.strerror or exc})"
    elif isinstance(exc, ValueError | OverflowError):
        why = f"not a usable PostgreSQL URL ({exc})"
    else:
        why = str(exc) or type(exc).__name__
    return scrub(f"cannot use the store at {where}: {why}", secret)


def scrub(text: str, secret: str | None) -> str:
    """`text` without `secret` (a driver may quote the URL it was given)."""
    return text.replace(secret, store_url.HIDDEN) if secret else text
