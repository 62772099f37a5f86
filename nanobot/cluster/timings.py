"""Every timing of a cluster, derived from one setting, `cluster.lease_seconds`, and the one
rule of liveness they serve.

- A lease (a role's, a session's: `store.leases`) lasts `lease`; its holder renews it, and a
  member waiting for it tries again, every `renewal(lease)`: a third of it, so that one slow
  or failed renewal never lets a live member's lease lapse.
- A member that cannot renew for so long that its leases would lapse before the next try
  stops its work first (`distribution`, `roles`): a session never runs on two members.
- A member is alive until its row in the members table expires (`Member.stale`), unless its
  process is provably gone (`Member.gone`). Each beat extends the row by `lifetime`: three
  beats, so one slow or failed write never makes a live member look dead. In a cluster a
  member beats as often as it renews (`beat`), so it is alive exactly as long as its leases
  hold: a member whose leases lapsed is dead for the replies it left too, and no query needs
  to combine the two. Alone, a gateway beats every `BEAT_INTERVAL` (what `status --check`
  reads). Readers judge by the expiry the member wrote, never by a timing of their own.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

BEAT_INTERVAL: Final = timedelta(seconds=15)
"""How often a gateway alone on its database refreshes its row (at most: see `beat`)."""

BEATS_ALIVE: Final = 3
"""A member's lifetime, in beats."""


def renewal(lease: timedelta) -> float:
    """Seconds between renewals of a lease of length `lease`, and between tries to take it."""
    return lease.total_seconds() / 3


def beat(lease: timedelta, *, shared: bool) -> float:
    """Seconds between a member's beats: as often as it renews in a cluster (`shared`)."""
    every = BEAT_INTERVAL.total_seconds()
    return min(every, renewal(lease)) if shared else every


def lifetime(interval: float) -> timedelta:
    """How long a member beating every `interval` seconds stays alive after a beat."""
    return BEATS_ALIVE * timedelta(seconds=interval)


ALONE: Final = lifetime(BEAT_INTERVAL.total_seconds())
"""The lifetime of a gateway alone on its database (45 s)."""
