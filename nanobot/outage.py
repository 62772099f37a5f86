"""A store that fails, as one part of nanobot meets it: said once, tried again on one
schedule, said when it is back.

A part that needs the state database and can wait for it (intake, the cron scheduler, the
cluster's wake-ups, a channel holding its messages, an event waiting for intake) keeps one
`Outage`. It tells the outage of each try that fails (`failed`) and of the first that gets
through (`recovered`), and waits for the next try with `wait`. The log says the first failure
once, at WARNING, with the error and what stops meanwhile; each later failed try at DEBUG;
and the end at WARNING, with how long the outage lasted. Between tries the part waits the
pauses of one `Backoff` (`store.retry_seconds`), or the pause another part names when that
part owns the tries (intake says when it tries the store; who waits for intake waits that
long).

The error is logged as the store worded it: store errors name no secret (a server's address
is shown redacted), and the log redacts any configured secret over the rendered line.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from loguru import logger

Sleep = Callable[[float | None, asyncio.Event], Awaitable[None]]
"""Return once the seconds have passed (never, for None) or the event is set, if sooner."""


async def sleep_or_wake(seconds: float | None, wake: asyncio.Event) -> None:
    """The `Sleep` on the event loop's (monotonic) timers. Cancellation is safe."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wake.wait()


@dataclass(frozen=True, slots=True)
class Backoff:
    """The pauses between the tries of a store that keeps failing: after the n-th failed try
    in a row the n-th pause, the last one repeating from then on.

    Raises:
        ValueError: no pause, a pause that is not a positive number of seconds, or one
            shorter than the pause before it.
    """

    pauses: tuple[float, ...] = (1.0, 2.0, 5.0, 15.0, 30.0, 60.0)

    def __post_init__(self) -> None:
        if not self.pauses:
            raise ValueError("needs at least one pause, in seconds")
        for pause in self.pauses:
            if not (math.isfinite(pause) and pause > 0):
                raise ValueError(f"a pause must be a positive number of seconds, not {pause!r}")
        for before, after in itertools.pairwise(self.pauses):
            if after < before:
                raise ValueError(f"the pauses may only grow, but {after:g} follows {before:g}")

    def pause(self, failures: int) -> float:
        """Seconds before the next try, after `failures` (1 or more) failed tries in a row."""
        return self.pauses[min(max(failures, 1), len(self.pauses)) - 1]


DEFAULT_BACKOFF: Final = Backoff()


class Outage:
    """One part's view of a failing store; see the module docstring. Runs on one event loop,
    and never raises.

    `failing` starts the lines said while the store fails ("intake stopped"), `effect` says
    what stops meanwhile, `back` starts the line said at the end ("intake resumed"). `now`
    and `sleep` are the clock the pauses run on (tests pass one they move).
    """

    def __init__(
        self,
        *,
        failing: str,
        effect: str,
        back: str,
        backoff: Backoff = DEFAULT_BACKOFF,
        now: Callable[[], float] = time.monotonic,
        sleep: Sleep = sleep_or_wake,
    ) -> None:
        self._failing = failing
        self._effect = effect
        self._back = back
        self._backoff = backoff
        self._now = now
        self._sleep = sleep
        self._since: float | None = None  # when the outage began; None while there is none
        self._error = ""
        self._tries = 0  # failed tries in this outage, the first failure included
        self._tried_at = 0.0  # when the latest counted try failed
        self._retry_at = 0.0  # when the next try is due
        self._changed = asyncio.Event()  # replaced once set: see `_signal`

    @property
    def active(self) -> bool:
        """Whether the store is failing: a try failed, and none got through since."""
        return self._since is not None

    @property
    def error(self) -> str:
        """What the latest failure said; empty while there is no outage."""
        return self._error

    @property
    def retry_in(self) -> float:
        """Seconds until the next try is due; 0 when it is, or when there is no outage."""
        return max(self._retry_at - self._now(), 0.0) if self._since is not None else 0.0

    def failed(self, error: BaseException | str, *, retry_in: float | None = None) -> float:
        """A try of the store failed with `error`; the seconds until the next try.

        The first failure begins the outage (said at WARNING). A failure once the next try
        was due counts as that try (said at DEBUG). Either sets the pause before the next:
        the backoff's next one, or `retry_in` where another part owns the tries and says
        when it makes the next. A failure before then (a write already under way when the
        outage began, another task's statement) only updates the error."""
        now = self._now()
        self._error = str(error)
        if self._since is None:
            self._since, self._tries = now, 0
        elif now < self._retry_at:
            return self._retry_at - now
        self._tries += 1
        pause = self._backoff.pause(self._tries) if retry_in is None else max(retry_in, 0.0)
        self._tried_at, self._retry_at = now, now + pause
        if self._tries == 1:
            logger.opt(depth=1).warning(
                "{}: {}; {} (next try in {:g} s)", self._failing, error, self._effect, pause
            )
        else:
            logger.opt(depth=1).debug(
                "{} (try {}): {}; next try in {:g} s", self._failing, self._tries, error, pause
            )
        self._signal()
        return pause

    def recovered(self) -> None:
        """A try got through: end the outage (said at WARNING, with how long it lasted) and
        wake every waiter. Nothing when there is none."""
        if self._since is None:
            return
        lasted = self._now() - self._since
        self._since, self._error, self._tries = None, "", 0
        logger.opt(depth=1).warning("{} after {:.0f} s", self._back, lasted)
        self._signal()

    def wake(self) -> None:
        """The caller saw the store answer elsewhere (another of its statements got through):
        bring the next try forward to now, yet no sooner than the backoff's first pause
        after the latest try, so that such hints never make a loop of tries. Nothing when
        there is no outage, or the next try is due sooner anyway."""
        if self._since is None:
            return
        soonest = max(self._now(), self._tried_at + self._backoff.pause(1))
        if soonest < self._retry_at:
            self._retry_at = soonest
            self._signal()

    async def wait(self, tried: float | None = None) -> float | None:
        """Return once the store may be tried: at once while there is no outage (None); else
        when it ends (None), or when the next try is due (the moment it was due, on the
        outage's clock). `tried`: such a moment returned before, whose try the caller made:
        only a later one counts, so a try that failed without `failed` being told (a failure
        that is not the store's) never makes a loop. Woken early by `recovered` and `wake`.
        Cancellation is safe: it only waits."""
        while self._since is not None:
            changed, due = self._changed, self._retry_at
            if due == tried:
                await self._sleep(None, changed)
                continue
            remaining = due - self._now()
            if remaining <= 0:
                return due
            await self._sleep(remaining, changed)
            if not changed.is_set():
                return due  # the pause passed, as `sleep` measures it
        return None

    async def ended(self) -> None:
        """Return once there is no outage: at once, or when `recovered` is called.
        Cancellation is safe."""
        while self._since is not None:
            await self._sleep(None, self._changed)

    def _signal(self) -> None:
        """Wake the waiters: the outage began or ended, or its next try moved."""
        self._changed.set()
        self._changed = asyncio.Event()
