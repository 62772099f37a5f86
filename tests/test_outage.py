"""The one policy for a failing store (nanobot/outage.py): said once, tried again on one
backoff, said when it is back; and the wait for the next try. Time is a clock the tests
move."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import pytest
from loguru import logger

from nanobot.errors import StoreError
from nanobot.outage import DEFAULT_BACKOFF, Backoff, Outage


class Clock:
    """Seconds that pass only when `advance` says; `sleep` is the `Sleep` on them."""

    def __init__(self) -> None:
        self.now = 100.0
        self.asked: list[float | None] = []  # what each sleep was asked for
        self._due: list[tuple[float, asyncio.Event]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float | None, wake: asyncio.Event) -> None:
        self.asked.append(seconds)
        passed = asyncio.Event()
        entry = (math.inf if seconds is None else self.now + seconds, passed)
        self._due.append(entry)
        waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(passed.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            self._due.remove(entry)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for deadline, passed in self._due:
            if deadline <= self.now:
                passed.set()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def lines() -> Iterator[list[str]]:
    """What the outages of this module said, from DEBUG up. The lines name the module that
    told the outage (this one), not nanobot.outage."""
    said: list[str] = []
    sink = logger.add(
        lambda m: said.append(f"{m.record['level'].name} {m.record['message']}"),
        level="DEBUG",
        filter=__name__,
    )
    yield said
    logger.remove(sink)


def outage(clock: Clock, backoff: Backoff = DEFAULT_BACKOFF) -> Outage:
    return Outage(
        failing="intake stopped",
        effect="no message is taken",
        back="intake resumed",
        backoff=backoff,
        now=clock,
        sleep=clock.sleep,
    )


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


# ---- the backoff -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failures", "pause"),
    [(1, 1.0), (2, 2.0), (3, 5.0), (4, 15.0), (5, 30.0), (6, 60.0), (7, 60.0), (1000, 60.0)],
)
def test_the_default_backoff_grows_to_a_minute_and_stays_there(failures: int, pause: float) -> None:
    assert DEFAULT_BACKOFF.pause(failures) == pause


def test_a_backoff_of_one_pause_repeats_it() -> None:
    assert [Backoff((0.2,)).pause(n) for n in (1, 2, 3)] == [0.2, 0.2, 0.2]


@pytest.mark.parametrize(
    ("pauses", "why"),
    [
        ((), "at least one pause"),
        ((1.0, 0.0), "positive number of seconds, not 0.0"),
        ((-1.0,), "positive number of seconds, not -1.0"),
        ((math.inf,), "positive number of seconds, not inf"),
        ((math.nan,), "positive number of seconds, not nan"),
        ((5.0, 1.0), "may only grow, but 1 follows 5"),
    ],
)
def test_a_backoff_that_makes_no_sense_is_refused(pauses: tuple[float, ...], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Backoff(pauses)


# ---- what is said ------------------------------------------------------------------------


def test_the_first_failure_is_said_once_repeats_at_debug_and_the_end_with_its_length(
    clock: Clock, lines: list[str]
) -> None:
    down = outage(clock)
    assert not down.active and down.retry_in == 0
    assert down.failed(StoreError("disk full")) == 1.0
    assert down.active and down.error == "disk full" and down.retry_in == 1.0
    for pause in (2.0, 5.0, 15.0):
        clock.advance(down.retry_in)
        assert down.failed(StoreError("disk full")) == pause
    clock.advance(4)
    down.recovered()
    assert not down.active and down.error == "" and down.retry_in == 0
    assert lines == [
        "WARNING intake stopped: disk full; no message is taken (next try in 1 s)",
        "DEBUG intake stopped (try 2): disk full; next try in 2 s",
        "DEBUG intake stopped (try 3): disk full; next try in 5 s",
        "DEBUG intake stopped (try 4): disk full; next try in 15 s",
        "WARNING intake resumed after 12 s",  # 1 + 2 + 5 + 4
    ]


def test_a_failure_before_the_next_try_is_due_only_updates_the_error(
    clock: Clock, lines: list[str]
) -> None:
    down = outage(clock)
    down.failed("disk full")
    clock.advance(0.25)
    # A write already under way when the outage began: not a try, nothing said.
    assert down.failed("read-only file") == 0.75
    assert down.error == "read-only file" and down.retry_in == 0.75
    clock.advance(0.75)
    assert down.failed("read-only file") == 2.0  # the try that was due: the second pause
    assert len(lines) == 2


def test_recovering_without_an_outage_says_nothing(clock: Clock, lines: list[str]) -> None:
    down = outage(clock)
    down.recovered()
    assert lines == [] and not down.active


def test_a_new_outage_starts_the_backoff_again(clock: Clock, lines: list[str]) -> None:
    down = outage(clock)
    for _ in range(3):
        down.failed("disk full")
        clock.advance(down.retry_in)
    down.recovered()
    assert down.failed("disk full") == 1.0
    assert [line.split(":")[0] for line in lines] == [
        "WARNING intake stopped",
        "DEBUG intake stopped (try 2)",
        "DEBUG intake stopped (try 3)",
        "WARNING intake resumed after 8 s",
        "WARNING intake stopped",  # said again: another outage
    ]


def test_the_part_that_owns_the_tries_may_set_the_pause(clock: Clock, lines: list[str]) -> None:
    down = outage(clock)
    assert down.failed("intake is paused", retry_in=7.5) == 7.5
    clock.advance(7.5)
    assert down.failed("intake is paused", retry_in=-1) == 0  # a late answer: try at once
    assert lines[0].endswith("(next try in 7.5 s)")


# ---- waiting -----------------------------------------------------------------------------


async def test_without_an_outage_the_store_may_be_tried_at_once(clock: Clock) -> None:
    down = outage(clock)
    assert await down.wait() is None
    await down.ended()
    assert clock.asked == []


async def test_the_wait_ends_when_the_next_try_is_due(clock: Clock) -> None:
    down = outage(clock)
    down.failed("disk full")
    waiting = asyncio.create_task(down.wait())
    await settle()
    assert clock.asked == [1.0] and not waiting.done()
    clock.advance(0.5)
    await settle()
    assert not waiting.done()
    clock.advance(0.5)
    assert await waiting == 101.0  # the moment it was due
    assert await down.wait() == 101.0  # due still: at once, until a try is counted
    down.failed("disk full")
    again = asyncio.create_task(down.wait())
    await settle()
    assert clock.asked[-1] == 2.0 and not again.done()
    again.cancel()
    await asyncio.gather(again, return_exceptions=True)


async def test_a_try_that_moves_the_next_one_moves_the_wait(clock: Clock) -> None:
    down = outage(clock)
    down.failed("disk full")
    waiting = asyncio.create_task(down.wait())
    await settle()
    clock.advance(1)
    down.failed("disk full")  # another task's try was counted first: the next is in 2 s
    await settle()
    assert not waiting.done()
    clock.advance(2)
    assert await waiting == 103.0


async def test_the_end_of_the_outage_ends_every_wait(clock: Clock) -> None:
    down = outage(clock)
    down.failed("disk full")
    waits = [asyncio.create_task(down.wait()), asyncio.create_task(down.ended())]
    await settle()
    assert not any(w.done() for w in waits)
    down.recovered()  # another part's try got through: no need to wait out the pause
    assert await asyncio.gather(*waits) == [None, None]


async def test_a_moment_tried_already_is_not_returned_again(clock: Clock) -> None:
    """A try that failed without the outage being told (not the store's failure) must not
    make the caller try again at once, in a loop."""
    down = outage(clock)
    down.failed("disk full")
    clock.advance(1)
    tried = await down.wait()
    assert tried == 101.0
    waiting = asyncio.create_task(down.wait(tried))
    clock.advance(30)
    await settle()
    assert not waiting.done()  # still the same moment: it waits for a change
    down.failed("disk full")  # a counted try sets the next moment
    await settle()
    assert not waiting.done()
    clock.advance(2)
    assert await waiting == 133.0


async def test_a_cancelled_wait_leaves_the_outage_as_it_was(clock: Clock) -> None:
    down = outage(clock)
    down.failed("disk full")
    waiting = asyncio.create_task(down.wait())
    await settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert down.active and down.retry_in == 1.0
    other = asyncio.create_task(down.wait())
    clock.advance(1)
    assert await other == 101.0


async def test_a_hint_that_the_store_answers_brings_the_next_try_forward(clock: Clock) -> None:
    down = outage(clock)
    for _ in range(4):  # the pause after the fourth failed try is 15 s
        down.failed("connection refused")
        clock.advance(down.retry_in)
    down.failed("connection refused")
    assert down.retry_in == 30.0
    waiting = asyncio.create_task(down.wait())
    await settle()
    clock.advance(0.25)
    down.wake()  # a statement got through elsewhere: due, but not before the first pause
    assert down.retry_in == 0.75
    clock.advance(0.75)
    assert await waiting == clock.now
    down.failed("connection refused")  # it was not back after all: the backoff goes on
    assert down.retry_in == 60.0
    clock.advance(5)
    down.wake()  # long enough after the last try: due now
    assert down.retry_in == 0
    assert await down.wait() == clock.now


def test_a_hint_changes_nothing_without_an_outage_or_when_the_try_is_sooner(
    clock: Clock,
) -> None:
    down = outage(clock)
    down.wake()
    assert not down.active
    down.failed("disk full")
    clock.advance(0.5)
    down.wake()
    assert down.retry_in == 0.5  # the first pause is the soonest a hint may make it
