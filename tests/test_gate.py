"""Access control and intake, with the real store and bus."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from loguru import logger

from nanobot.bus.events import ChatRef, InboundMessage, OutboundMessage
from nanobot.bus.intake import IntakePaused
from nanobot.bus.queue import MessageBus
from nanobot.channels.base import Intake
from nanobot.errors import StoreError
from nanobot.gate import CATCH_UP_WINDOW, ChannelRules, Gate, GroupPolicy
from nanobot.outage import Backoff
from nanobot.store import Access, Database, Journal
from nanobot.store.access import MAX_PENDING
from nanobot.store.failures import LateWatcher


@pytest.fixture
def failures() -> LateWatcher:
    return LateWatcher()


@pytest.fixture
async def db(tmp_path: Path, failures: LateWatcher) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db", watch=failures) as database:
        yield database


def make_gate(
    db: Database, bus: MessageBus, allow: set[str], policy: GroupPolicy = "mention"
) -> Gate:
    rules = {"telegram": ChannelRules(frozenset(allow), policy)}
    return Gate(rules, Access(db), Journal(db), bus)


def message(
    sender: str = "42", *, mid: str = "1", private: bool = True, addressed: bool = True
) -> InboundMessage:
    chat = ChatRef("telegram", sender if private else "-100")
    return InboundMessage.from_chat(
        chat, sender, "hello", mid, sender_name="Ada", is_private=private, addressed=addressed
    )


def drain_outbound(bus: MessageBus) -> list[OutboundMessage]:
    queue = bus._channel("telegram")._queue
    items = []
    while not queue.empty():
        entry = queue.get_nowait()
        assert isinstance(entry, tuple)
        assert isinstance(entry[0], OutboundMessage)
        items.append(entry[0])
    return items


async def test_allowed_sender_is_journaled_and_queued(db: Database) -> None:
    bus = MessageBus()
    gate = make_gate(db, bus, {"42"})
    assert await gate(message()) is Intake.ACCEPTED
    queued = await anext(bus.inbound())
    assert queued.journal_id is not None
    assert [p.id for p in await Journal(db).pending_inbound()] == [queued.journal_id]


async def test_a_redelivered_message_is_ignored(db: Database) -> None:
    bus = MessageBus()
    gate = make_gate(db, bus, {"42"})
    assert await gate(message(mid="7")) is Intake.ACCEPTED
    assert await gate(message(mid="7")) is Intake.DUPLICATE
    assert len(await Journal(db).pending_inbound()) == 1


async def test_empty_allow_list_means_nobody(db: Database) -> None:
    bus = MessageBus()
    gate = make_gate(db, bus, set())
    assert await gate(message(private=False)) is Intake.REFUSED
    assert "nobody yet" in gate.describe()[0]


async def test_everyone_with_a_star(db: Database) -> None:
    gate = make_gate(db, MessageBus(), {"*"})
    assert await gate(message("999")) is Intake.ACCEPTED


async def test_unknown_private_sender_gets_one_pairing_code(db: Database) -> None:
    bus = MessageBus()
    gate = make_gate(db, bus, set())
    assert await gate(message("7", mid="1")) is Intake.PAIRING
    (notice,) = drain_outbound(bus)
    (request,) = await Access(db).pending()
    assert request.code in notice.text
    assert len(request.code) == 8
    assert notice.kind == "notice"
    # Asking again mints no new code and sends nothing more.
    assert await gate(message("7", mid="2")) is Intake.REFUSED
    assert drain_outbound(bus) == []
    assert await Journal(db).pending_inbound() == []  # nothing reached the agent


async def test_a_flood_of_strangers_locks_nobody_out_and_the_owner_is_warned_once(
    db: Database,
) -> None:
    bus = MessageBus()
    gate = make_gate(db, bus, set())
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING", format="{message}")
    try:
        flood = [await gate(message(str(user), mid=str(user))) for user in range(MAX_PENDING + 5)]
        # Room again (the owner denied one), then a new flood: a new warning.
        assert await Access(db).deny((await Access(db).pending())[0].code)
        await gate(message("room", mid="r"))
        await gate(message("again", mid="a"))
    finally:
        logger.remove(sink)
    assert flood == [Intake.PAIRING] * (MAX_PENDING + 5)  # everyone got a code
    assert len(drain_outbound(bus)) == MAX_PENDING + 7
    assert len(await Access(db).pending()) == MAX_PENDING
    assert [r.user_id for r in await Access(db).pending()][-2:] == ["room", "again"]
    assert len(warnings) == 2 and all("replaces the oldest" in w for w in warnings)


async def test_the_owner_log_names_the_code_and_cannot_be_forged_by_a_name(
    db: Database,
) -> None:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO")
    try:
        gate = make_gate(db, MessageBus(), set())
        forged = "Eve\x1b[1A\nINFO pairing approved for everyone"
        chat = ChatRef("telegram", "7")
        await gate(
            InboundMessage.from_chat(
                chat, "7", "hi", "1", sender_name=forged, is_private=True, addressed=True
            )
        )
    finally:
        logger.remove(sink)
    (request,) = await Access(db).pending()
    [line] = [line for line in lines if "pairing requested" in line]
    assert request.code in line and "\n" not in line and "\x1b" not in line
    assert "Eve\\x1b[1A\\nINFO" in line


@pytest.mark.parametrize(
    ("sender", "chat", "policy", "admitted"),
    [
        ("42", "private", "mention", True),  # in allow_from
        ("7", "private", "mention", False),  # a stranger: no download, a pairing code
        ("paired", "private", "mention", True),  # an approved pairing
        ("42", "addressed", "mention", True),
        ("42", "group", "mention", False),  # not talking to us
        ("42", "group", "open", True),
        ("42", "addressed", "disabled", False),
        ("7", "addressed", "open", False),
    ],
)
async def test_admits_answers_before_anything_is_downloaded(
    db: Database, sender: str, chat: str, policy: GroupPolicy, admitted: bool
) -> None:
    await Access(db).allow("telegram", "paired")
    bus = MessageBus()
    gate = make_gate(db, bus, {"42"}, policy)
    private, addressed = chat == "private", chat != "group"
    answer = await gate.admits("telegram", sender, private=private, addressed=addressed)
    assert answer is admitted
    assert await Access(db).pending() == [] and drain_outbound(bus) == []  # it changes nothing
    assert await Journal(db).pending_inbound() == []


async def test_admits_everyone_with_a_star_and_nobody_on_an_unknown_channel(
    db: Database,
) -> None:
    gate = make_gate(db, MessageBus(), {"*"})
    assert await gate.admits("telegram", "999", private=True, addressed=True)
    assert not await gate.admits("discord", "999", private=True, addressed=True)


async def test_approval_takes_effect_at_once(db: Database) -> None:
    bus = MessageBus()
    gate = make_gate(db, bus, set())
    await gate(message("7", mid="1"))
    (request,) = await Access(db).pending()
    approved = await Access(db).approve(request.code.lower())
    assert approved is not None
    assert await gate(message("7", mid="2")) is Intake.ACCEPTED
    assert await Access(db).revoke("7") == 1
    assert await gate(message("7", mid="3")) is Intake.PAIRING  # back to asking


@pytest.mark.parametrize(
    ("policy", "addressed", "expected"),
    [
        ("mention", True, Intake.ACCEPTED),
        ("mention", False, Intake.REFUSED),
        ("open", False, Intake.ACCEPTED),
        ("disabled", True, Intake.REFUSED),
    ],
)
async def test_group_policy(
    db: Database, policy: GroupPolicy, addressed: bool, expected: Intake
) -> None:
    gate = make_gate(db, MessageBus(), {"42"}, policy)
    assert await gate(message(private=False, addressed=addressed)) is expected


async def test_strangers_in_groups_get_nothing(db: Database) -> None:
    bus = MessageBus()
    gate = make_gate(db, bus, {"42"}, "open")
    assert await gate(message("666", private=False)) is Intake.REFUSED
    assert drain_outbound(bus) == []
    assert await Access(db).pending() == []


async def test_a_closed_gate_keeps_allowed_messages_for_the_next_start(db: Database) -> None:
    bus = MessageBus()
    gate = make_gate(db, bus, {"42"})
    gate.close()
    # Journaled, not handed to the agent that is stopping: the next start's recovery answers
    # it (Discord would never deliver it again).
    assert await gate(message()) is Intake.ACCEPTED
    assert [p.message["message_id"] for p in await Journal(db).pending_inbound()] == ["1"]
    assert len(bus._inbound) == 0
    assert await gate(message()) is Intake.DUPLICATE


async def test_a_closed_gate_gives_strangers_no_pairing_code(db: Database) -> None:
    bus = MessageBus()
    gate = make_gate(db, bus, {"42"})
    gate.close()
    assert await gate(message("666")) is Intake.CLOSED  # Telegram delivers it again
    assert await gate(message("666", mid="2", private=False)) is Intake.REFUSED
    assert drain_outbound(bus) == []
    assert await Access(db).pending() == []
    assert await Journal(db).pending_inbound() == []


# --- a store that stops taking writes --------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def big(sender: str, mid: str) -> InboundMessage:
    """A message whose journal row needs new pages: it cannot be written into a full file."""
    return replace(message(sender, mid=mid), text="x" * 40_000)


async def fill(db: Database) -> None:
    """The database file may grow no more: SQLite's own SQLITE_FULL, as on a full disk."""
    pages = await db.fetchone("PRAGMA page_count")
    assert pages is not None
    await db.fetchall(f"PRAGMA max_page_count = {pages[0]}")


PAUSES = Backoff((5.0, 15.0, 30.0, 60.0))
"""The pauses the gates of these tests are given (`store.retry_seconds`)."""


async def test_a_failed_write_stops_intake_until_a_later_write_succeeds(db: Database) -> None:
    bus, clock, lines = MessageBus(), Clock(), []
    rules = {"telegram": ChannelRules(frozenset({"42"}))}
    gate = Gate(rules, Access(db), Journal(db), bus, clock=clock, retry=PAUSES)
    await Access(db).approve((await Access(db).request("telegram", "7", "7", "Eve")).code)
    sink = logger.add(
        lambda m: lines.append(f"{m.record['level'].name} {m.record['message']}"),
        level="DEBUG",
        filter="nanobot.gate",
    )
    try:
        await fill(db)
        with pytest.raises(StoreError, match="disk full"):
            await gate(big("42", "1"))
        assert gate.stopped
        [stopped] = lines
        assert stopped.startswith(f"WARNING intake stopped: disk full while writing {db.name}")
        assert "no message is taken or acknowledged" in stopped
        assert stopped.endswith("(next try in 5 s)")

        # Refused at once, without asking the store (a small message would fit), and the
        # pairing-approved user is not admitted: nothing of theirs is downloaded meanwhile.
        for mid in ("2", "3"):
            with pytest.raises(StoreError, match=r"intake is stopped \(disk full"):
                await gate(message("42", mid=mid))
        with pytest.raises(StoreError, match="intake is stopped"):
            await gate.submit(message("42", mid="cron"))
        assert await gate.admits("telegram", "42", private=True, addressed=True)
        assert not await gate.admits("telegram", "7", private=True, addressed=True)
        assert await Journal(db).pending_inbound() == []

        clock.now += 5  # the pause is over: the next message tries, and the disk is still full
        with pytest.raises(StoreError, match="disk full"):
            await gate(big("42", "4"))
        still = f"disk full while writing {db.name}; the write was not saved; next try in 15 s"
        assert lines[1:] == [f"DEBUG intake stopped (try 2): {still}"]  # said once above

        await db.fetchall("PRAGMA max_page_count = 1073741823")  # space was freed
        clock.now += 14
        with pytest.raises(StoreError, match="intake is stopped"):
            await gate(message("42", mid="5"))
        clock.now += 1
        assert await gate(big("42", "6")) is Intake.ACCEPTED
        assert not gate.stopped
        assert lines[2:] == [
            "WARNING intake resumed: the state database takes writes again after 20 s"
        ]
        assert (await anext(bus.inbound())).message_id == "6"
        assert await gate(message("42", mid="2")) is Intake.ACCEPTED
        assert await gate.admits("telegram", "7", private=True, addressed=True)
        assert [p.message["message_id"] for p in await Journal(db).pending_inbound()] == [
            "6",
            "2",
        ]
    finally:
        logger.remove(sink)


async def test_retries_back_off_while_the_store_keeps_failing(db: Database) -> None:
    clock = Clock()
    gate = Gate(
        {"telegram": ChannelRules(frozenset({"42"}))},
        Access(db),
        Journal(db),
        MessageBus(),
        clock=clock,
        retry=PAUSES,
    )
    await fill(db)
    tried = []
    for mid in range(80):  # one every 2.5 s, for 200 s
        try:
            await gate.submit(big("42", str(mid)))
        except StoreError as exc:
            if "intake is stopped" not in str(exc):
                tried.append(clock.now)
        clock.now += 2.5
    assert [b - a for a, b in itertools.pairwise(tried)] == [5, 15, 30, 60, 60]
    assert gate.stopped


async def test_a_pairing_request_that_cannot_be_stored_stops_intake(db: Database) -> None:
    # A stranger's message writes a pairing request: that write failing stops intake too,
    # and no pairing code goes out.
    bus = MessageBus()
    gate = make_gate(db, bus, {"42"})
    await fill(db)
    stranger = replace(message("9"), sender_name="E" * 40_000)
    with pytest.raises(StoreError, match="disk full"):
        await gate(stranger)
    assert gate.stopped
    assert drain_outbound(bus) == []


async def test_last_seen_is_the_newest_message_taken_per_chat_of_the_channel(
    db: Database,
) -> None:
    gate = make_gate(db, MessageBus(), {"42", "43"})
    assert await gate.last_seen("telegram") == {}
    for sender, mid in [("42", "9"), ("42", "10"), ("42", "8"), ("43", "5")]:
        assert await gate(message(sender, mid=mid)) is Intake.ACCEPTED
    await gate(replace(message("42", mid="press:99"), press="99"))  # not a platform message
    await gate(message("42", mid="11", private=False))  # another chat ("-100")
    assert await gate.last_seen("telegram") == {"42": "10", "43": "5", "-100": "11"}
    assert await gate.last_seen("discord") == {}
    # Only the last days count (rows older than the window are as good as pruned).
    await db.execute("UPDATE inbound SET received_at = '2000-01-01T00:00:00.000000+00:00'")
    assert await gate.last_seen("telegram") == {}


async def test_caught_up_until_is_the_latest_moment_recorded_but_within_the_window(
    store_target: Path | str,
) -> None:
    async with await Database.open(store_target) as db:  # on each backend
        gate = make_gate(db, MessageBus(), {"42"})
        assert await gate.caught_up_until("discord") is None  # the first start
        now = datetime.now(UTC)
        await gate.caught_up("discord", now - timedelta(hours=1))
        await gate.caught_up("discord", now - timedelta(hours=2))  # never moves back
        assert await gate.caught_up_until("discord") == now - timedelta(hours=1)
        assert await gate.caught_up_until("telegram") is None
        await gate.caught_up("discord", now)
        assert await gate.caught_up_until("discord") == now
        # Long ago: only as far back as `last_seen` looks.
        await db.execute(
            "UPDATE channel_state SET caught_up_until = '2000-01-01T00:00:00.000000+00:00'"
        )
        until = await gate.caught_up_until("discord")
        assert (
            until is not None
            and now - CATCH_UP_WINDOW <= until <= datetime.now(UTC) - CATCH_UP_WINDOW
        )


def watching_gate(db: Database, clock: Clock, failures: LateWatcher) -> Gate:
    """A gate told of every storage failure of `db`, as the gateway wires it."""
    gate = Gate(
        {"telegram": ChannelRules(frozenset({"42"}))},
        Access(db),
        Journal(db),
        MessageBus(),
        clock=clock,
        retry=PAUSES,
    )
    failures.bind(gate)
    return gate


async def test_any_write_failing_for_want_of_storage_stops_intake_until_a_journal_write_succeeds(
    db: Database, failures: LateWatcher
) -> None:
    clock = Clock()
    gate = watching_gate(db, clock, failures)
    reopened = asyncio.create_task(gate.reopened())
    await asyncio.sleep(0)
    assert reopened.done()  # open: at once

    await db.fetchall("PRAGMA query_only = ON")  # every write fails, as on a read-only file
    with pytest.raises(StoreError, match="readonly"):
        await Journal(db).enqueue("telegram", {"text": "a reply"})  # the outbox, not intake
    assert gate.stopped
    reopened = asyncio.create_task(gate.reopened())
    with pytest.raises(IntakePaused) as paused:
        await gate(message(mid="1"))
    assert paused.value.retry_in == 5 and "readonly" in paused.value.reason
    clock.now += 2
    with pytest.raises(IntakePaused) as paused:
        await gate(message(mid="1"))
    assert paused.value.retry_in == 3  # the next try, whichever message makes it

    await db.fetchall("PRAGMA query_only = OFF")
    await asyncio.sleep(0)
    assert not reopened.done()  # nobody tried yet
    clock.now += 3
    assert await gate(message(mid="1")) is Intake.ACCEPTED
    await asyncio.wait_for(reopened, 1)
    assert not gate.stopped

    # What a statement got wrong is no storage failure: intake stays open.
    with pytest.raises(StoreError, match="no such table"):
        await db.fetchall("SELECT * FROM nothing_here")
    assert not gate.stopped


async def test_a_journal_write_that_fails_says_when_to_try_again(
    db: Database, failures: LateWatcher
) -> None:
    clock = Clock()
    gate = watching_gate(db, clock, failures)
    await fill(db)
    with pytest.raises(IntakePaused, match="disk full") as paused:
        await gate(big("42", "1"))
    assert paused.value.retry_in == PAUSES.pause(1)
    clock.now += PAUSES.pause(1)
    with pytest.raises(IntakePaused, match="disk full") as paused:
        await gate.submit(big("42", "2"))
    assert paused.value.retry_in == PAUSES.pause(2)


async def test_a_try_of_the_store_comes_due_once_per_pause_and_delays_no_message(
    db: Database, failures: LateWatcher
) -> None:
    clock = Clock()
    gate = watching_gate(db, clock, failures)
    assert await asyncio.wait_for(gate.retry_due(), 1) is None  # open: due at once
    await db.fetchall("PRAGMA query_only = ON")
    with pytest.raises(StoreError):
        await Journal(db).enqueue("telegram", {"text": "a reply"})
    due = asyncio.create_task(gate.retry_due())
    await asyncio.sleep(0.05)
    assert not due.done()  # within the first pause
    clock.now += 5
    tried = await asyncio.wait_for(due, 10)  # the pause is over: a try is due
    assert tried == clock.now
    again = asyncio.create_task(gate.retry_due(tried))
    await asyncio.sleep(0.05)
    assert not again.done()  # that pause was tried at already
    # The caller's try did not push the next message's back: it tries the store at once.
    with pytest.raises(IntakePaused, match="readonly") as paused:
        await gate(message(mid="1"))
    assert paused.value.retry_in == 15  # its failed try set the next pause
    await asyncio.sleep(0.05)
    assert not again.done()  # the next pause has begun: due at its end
    await db.fetchall("PRAGMA query_only = OFF")
    clock.now += 15
    assert await gate(message(mid="1")) is Intake.ACCEPTED
    assert await asyncio.wait_for(again, 1) is None  # intake open: due at once
