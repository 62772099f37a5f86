"""Every timing of a cluster, derived from one setting, `cluster.lease_seconds`.

- A lease (a role's, a session's) lasts `lease`; its holder renews it, and a member waiting
  for it tries again, every `renewal(lease)`: a third of it, so that one slow or failed
  renewal never lets a live member's lease lapse.
- A member that cannot renew for so long that its leases would lapse before the next try
  stops its work first (`distribution`, `roles`): a session never runs on two members.
- In a cluster a member beats (`membership`) as often as it renews: a member with a lapsed
  lease and no beat since counts as dead for the replies it left, so a live one must beat
  soon after any lapse. Alone, it beats every `BEAT_INTERVAL` (what `status --check` reads).
"""

from __future__ import annotations

from datetime import timedelta

from nanobot.store.members import BEAT_INTERVAL


def renewal(lease: timedelta) -> float:
    """Seconds between renewals of a lease of length `lease`, and between tries to take it."""
    return lease.total_seconds() / 3


def beat(lease: timedelta, *, shared: bool) -> float:
    """Seconds between a member's beats: as often as it renews in a cluster (`shared`)."""
    every = BEAT_INTERVAL.total_seconds()
    return min(every, renewal(lease)) if shared else every
