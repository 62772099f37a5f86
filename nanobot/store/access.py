"""Who may talk to nanobot beyond the config's allow lists: approved users and pairing codes.

An unknown user writing in a private chat gets a pairing code; the owner approves it with
`nanobot pairing approve CODE`, which adds the user here. A running gateway reads this table
on each check, so approvals take effect without a restart.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from nanobot.store._times import from_text, to_text
from nanobot.store.database import Database, Row

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O or 1/I to misread
CODE_LENGTH = 8
CODE_TTL = timedelta(hours=1)
# Unexpired requests kept per channel. When the channel is full, a new request replaces the
# oldest instead of being refused. Refusing would let anyone lock everyone else out with this
# many throwaway accounts and one message each per hour; replacing makes them keep writing,
# from ever new accounts, which the owner sees (a warning, `nanobot status`), while a real
# person who loses their code gets a fresh one by writing again. Codes are typed only by the
# owner, so more of them does not make guessing one any easier.
MAX_PENDING = 10


@dataclass(frozen=True, slots=True)
class PairingRequest:
    code: str
    channel: str
    user_id: str
    chat_id: str
    name: str | None
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Issued:
    """A user's pairing code: `new` when made just now (else their unexpired one again), and
    how many older requests of the channel it replaced (see MAX_PENDING)."""

    code: str
    new: bool
    evicted: int = 0


@dataclass(frozen=True, slots=True)
class AllowedUser:
    channel: str
    user_id: str
    name: str | None
    approved_at: datetime


class Access:
    """Approved users and pending pairing requests."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def is_allowed(self, channel: str, user_id: str) -> bool:
        row = await self._db.fetchone(
            "SELECT 1 FROM allowed_users WHERE channel = ? AND user_id = ?", (channel, user_id)
        )
        return row is not None

    async def request(self, channel: str, user_id: str, chat_id: str, name: str | None) -> Issued:
        """A pairing code for this user.

        The user's unexpired code is reused (so repeated messages do not mint new ones); one
        user has at most one. A new one on a channel that has MAX_PENDING unexpired requests
        replaces the oldest of them.
        """
        now = datetime.now(UTC)
        # Reads what it then writes on (the user's code, the channel's count): one at a time
        # per channel, in every process.
        async with self._db.transaction(lock=f"pairing:{channel}"):
            await self._db.execute(
                "DELETE FROM pairing_requests WHERE expires_at <= ?", (to_text(now),)
            )
            row = await self._db.fetchone(
                "SELECT code FROM pairing_requests WHERE channel = ? AND user_id = ?",
                (channel, user_id),
            )
            if row is not None:
                return Issued(str(row["code"]), new=False)
            count = await self._db.fetchone(
                "SELECT count(*) FROM pairing_requests WHERE channel = ?", (channel,)
            )
            excess = (int(count[0]) if count is not None else 0) - MAX_PENDING + 1
            evicted = 0
            if excess > 0:
                evicted = await self._db.execute(
                    "DELETE FROM pairing_requests WHERE code IN (SELECT code FROM"
                    " pairing_requests WHERE channel = ? ORDER BY created_at, code LIMIT ?)",
                    (channel, excess),
                )
            code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
            await self._db.execute(
                "INSERT INTO pairing_requests"
                " (code, channel, user_id, chat_id, name, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (code, channel, user_id, chat_id, name, to_text(now), to_text(now + CODE_TTL)),
            )
        return Issued(code, new=True, evicted=evicted)

    async def pending(self) -> list[PairingRequest]:
        """Unexpired pairing requests, oldest first."""
        rows = await self._db.fetchall(
            "SELECT * FROM pairing_requests WHERE expires_at > ? ORDER BY created_at",
            (to_text(datetime.now(UTC)),),
        )
        return [_request(row) for row in rows]

    async def waiting(self) -> dict[str, int]:
        """How many unexpired pairing requests each channel has (channels with none left out)."""
        rows = await self._db.fetchall(
            "SELECT channel, count(*) FROM pairing_requests WHERE expires_at > ?"
            " GROUP BY channel ORDER BY channel",
            (to_text(datetime.now(UTC)),),
        )
        return {str(row[0]): int(row[1]) for row in rows}

    async def approve(self, code: str) -> PairingRequest | None:
        """Allow the user behind `code`; None when no unexpired request has that code."""
        code = code.strip().upper()
        async with self._db.transaction():
            row = await self._db.fetchone(
                "DELETE FROM pairing_requests WHERE code = ? AND expires_at > ? RETURNING *",
                (code, to_text(datetime.now(UTC))),
            )
            if row is None:
                return None
            request = _request(row)
            await self.allow(request.channel, request.user_id, request.name)
        return request

    async def deny(self, code: str) -> bool:
        """Drop a pending request; False when there was none."""
        row = await self._db.fetchone(
            "DELETE FROM pairing_requests WHERE code = ? RETURNING code", (code.strip().upper(),)
        )
        return row is not None

    async def allow(self, channel: str, user_id: str, name: str | None = None) -> None:
        await self._db.execute(
            "INSERT INTO allowed_users (channel, user_id, name, approved_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (channel, user_id) DO UPDATE SET name = excluded.name",
            (channel, user_id, name, to_text(datetime.now(UTC))),
        )

    async def revoke(self, user_id: str, channel: str | None = None) -> int:
        """Remove an approved user (on one channel, or every channel); returns how many rows."""
        if channel is None:
            return await self._db.execute("DELETE FROM allowed_users WHERE user_id = ?", (user_id,))
        return await self._db.execute(
            "DELETE FROM allowed_users WHERE channel = ? AND user_id = ?", (channel, user_id)
        )

    async def allowed(self) -> list[AllowedUser]:
        rows = await self._db.fetchall("SELECT * FROM allowed_users ORDER BY approved_at")
        return [
            AllowedUser(r["channel"], r["user_id"], r["name"], from_text(r["approved_at"]))
            for r in rows
        ]


def _request(row: Row) -> PairingRequest:
    return PairingRequest(
        code=row["code"],
        channel=row["channel"],
        user_id=row["user_id"],
        chat_id=row["chat_id"],
        name=row["name"],
        created_at=from_text(row["created_at"]),
        expires_at=from_text(row["expires_at"]),
    )
