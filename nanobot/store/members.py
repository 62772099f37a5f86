"""The members: the gateway processes using this database, one row each while it runs.

A gateway registers when it starts (a random id, new at each start, with its host, pid and
version), beats while it runs, and leaves when it stops cleanly. Each beat extends its row's
`expires_at` by the member's lifetime (three beats, `nanobot.cluster.timings`), and that is
the one rule of liveness everyone reads: a member is alive until its row expires, unless its
process is provably gone (`Member.gone`). A row that expired belongs to a process that died
(kill -9, a power cut) or hangs (its event loop or its database is stuck): `nanobot status
--check` says no gateway is alive, and a cluster (several gateways on one database) knows
whom to take over from. Every reader judges by the expiry the member wrote, so none needs
to know the timings the member runs with.

A row also says what its member runs with that the members of a cluster must share: the path
of its workspace, and its *agreement*, a digest per part of the config that must be the same
on every member (`nanobot.cluster.agreement` makes them; none holds a secret). `Member.disagrees`
names the parts two members differ in.

Moments come from the clock given to `Members` (the wall clock by default), so tests can move
time; they are compared as the database keeps them, in UTC. In a cluster the hosts' clocks
must agree to well within a member's lifetime.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

from nanobot import __version__
from nanobot.store._times import from_text, to_text, wall_clock
from nanobot.store.database import Database, Row

_COLUMNS = "id, host, pid, version, started_at, beat_at, expires_at, workspace, agreement"
_VALUES = "?, ?, ?, ?, ?, ?, ?, ?, ?"


@dataclass(frozen=True, slots=True)
class Member:
    """One gateway process, as its row says."""

    id: str
    host: str
    pid: int
    version: str
    started_at: datetime
    beat_at: datetime
    expires_at: datetime  # alive until then unless it beats again (see `lifetime`)
    workspace: str = ""  # the workspace's path on its host ("" from a version before)
    # Config part -> its digest (`nanobot.cluster.agreement`); empty from a version before.
    agreement: Mapping[str, str] = field(default_factory=dict)

    @property
    def lifetime(self) -> timedelta:
        """How long it stays alive after each beat (each beat extends it by as much)."""
        return self.expires_at - self.beat_at

    def stale(self, now: datetime) -> bool:
        """Whether its row expired at `now`: it has not beaten for its lifetime."""
        return now >= self.expires_at

    def gone(self, now: datetime) -> bool:
        """Whether it is not running: its row expired, or it ran on this host and its pid
        is no nanobot process any more (killed a moment ago: its row has not expired)."""
        return self.stale(now) or self.ended_here()

    def ended_here(self) -> bool:
        """Whether it provably ended: it ran on this host (by host name) and its pid is now
        this process, nobody's, or a program other than nanobot. False where that cannot be
        told (another host; no /proc)."""
        if self.host != socket.gethostname() or not Path("/proc/self").exists():
            return False
        if self.pid == os.getpid():
            return True  # an earlier process that had this pid (a restarted container)
        try:
            command = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except FileNotFoundError:
            return True
        except OSError:  # not ours to read: something runs there
            return False
        return b"nanobot" not in command

    @classmethod
    def new(
        cls,
        now: datetime,
        *,
        lifetime: timedelta,
        host: str | None = None,
        pid: int | None = None,
        version: str = __version__,
        workspace: str = "",
        agreement: Mapping[str, str] | None = None,
    ) -> Member:
        """This process (or the given host and pid) as a new member: a fresh random id,
        started and beating at `now`, alive for `lifetime` after each beat."""
        return cls(
            id=secrets.token_hex(8),
            host=host if host is not None else socket.gethostname(),
            pid=pid if pid is not None else os.getpid(),
            version=version,
            started_at=now,
            beat_at=now,
            expires_at=now + lifetime,
            workspace=workspace,
            agreement=dict(agreement or {}),
        )

    def describe(self) -> str:
        """Where it runs, for a person: "pid 42 on host box"."""
        return f"pid {self.pid} on host {self.host}"

    def disagrees(self, other: Member) -> list[str]:
        """The config parts, sorted, whose digests differ between the two members (a part
        only one of them has counts); none when either recorded no agreement (a version
        from before it was recorded), as nothing can be told then."""
        return disagreement(self.agreement, other.agreement)


def disagreement(one: Mapping[str, str], other: Mapping[str, str]) -> list[str]:
    """The parts, sorted, whose digests differ between two agreements (see
    `Member.disagrees`)."""
    if not one or not other:
        return []
    return sorted(p for p in one.keys() | other.keys() if one.get(p) != other.get(p))


class Members:
    """The members table. Every method raises `StoreError` when the database fails."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = wall_clock) -> None:
        """`clock` gives the aware moment stamped on rows and judged against."""
        self._db = db
        self._clock = clock

    def now(self) -> datetime:
        """The moment by this store's clock (for `Member.stale`)."""
        return self._clock()

    async def register(self, member: Member) -> None:
        """Add `member` (see `Member.new`) to the table."""
        await self._db.execute(
            f"INSERT INTO members ({_COLUMNS}) VALUES ({_VALUES})", _values(member)
        )

    async def beat(self, member: Member) -> Member:
        """Stamp `member`'s row with the time now, alive for its lifetime from now; returns
        it as written.

        A row that is gone (taken for dead while this process was stuck, or a failed
        `register`) is written again, so a member that is alive is always listed.
        """
        now = self._clock()
        beating = replace(member, beat_at=now, expires_at=now + member.lifetime)
        await self._db.execute(
            f"INSERT INTO members ({_COLUMNS}) VALUES ({_VALUES})"
            " ON CONFLICT (id) DO UPDATE SET beat_at = excluded.beat_at,"
            " expires_at = excluded.expires_at",
            _values(beating),
        )
        return beating

    async def leave(self, member_id: str) -> bool:
        """Remove the member's row; False if it had none."""
        return await self._db.execute("DELETE FROM members WHERE id = ?", (member_id,)) > 0

    async def all(self) -> list[Member]:
        """Every row, alive or stale, the latest beat first."""
        rows = await self._db.fetchall(f"SELECT {_COLUMNS} FROM members ORDER BY beat_at DESC, id")
        return [_member(row) for row in rows]

    async def forget_stale(self) -> int:
        """Remove the rows that expired (processes that died without leaving); returns how
        many."""
        now = to_text(self._clock())
        return await self._db.execute("DELETE FROM members WHERE expires_at <= ?", (now,))


def _values(member: Member) -> tuple[str, str, int, str, str, str, str, str, str]:
    return (
        member.id,
        member.host,
        member.pid,
        member.version,
        to_text(member.started_at),
        to_text(member.beat_at),
        to_text(member.expires_at),
        member.workspace,
        json.dumps(dict(sorted(member.agreement.items())), separators=(",", ":"))
        if member.agreement
        else "",
    )


def _member(row: Row) -> Member:
    return Member(
        id=str(row["id"]),
        host=str(row["host"]),
        pid=int(row["pid"]),
        version=str(row["version"]),
        started_at=from_text(row["started_at"]),
        beat_at=from_text(row["beat_at"]),
        expires_at=from_text(row["expires_at"]),
        workspace=str(row["workspace"]),
        agreement=_agreement(str(row["agreement"])),
    )


def _agreement(text: str) -> dict[str, str]:
    """A row's agreement: a JSON object of part -> digest, or '' for none recorded."""
    if not text:
        return {}
    parts = json.loads(text)
    return {str(part): str(digest) for part, digest in parts.items()}
