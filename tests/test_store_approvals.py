"""The approval store on a real SQLite file: first answer wins, refusals change nothing,
expiry, restart, saved rules and chat grants, the log, and the upgrade from schema 6."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nanobot.store import ApprovalStore, Database, Grant, SessionStore, migrations
from nanobot.store.approvals import (
    ID_ALPHABET,
    ID_LENGTH,
    RESTARTED,
    TIMED_OUT,
    NewRequest,
    Place,
    Turn,
    Verdict,
)
from nanobot.store.claims import Claims

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TIMEOUT = timedelta(minutes=10)
HERE = Place("telegram", "100")


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(db: Database, clock: Clock) -> ApprovalStore:
    return ApprovalStore(db, clock)


def new(command: str = "ls -la", **changes: object) -> NewRequest:
    request = NewRequest(
        session_key="telegram:100",
        run_id="run1",
        tool_call_id="call1",
        tool="exec",
        arguments=f'{{"command":"{command}"}}',
        args_hash=f"hash-{command}",
        rule_key=command,
        scopes=("once", "chat", "always"),
        reason="exec asks before it runs",
        deciders=("100",),
        places=(HERE,),
    )
    return replace(request, **changes)  # type: ignore[arg-type]


async def answer(
    store: ApprovalStore,
    request_id: str,
    verdict: Verdict = "once",
    *,
    by: str = "100",
    place: Place = HERE,
    args_hash: str | None = None,
) -> str:
    decision = await store.decide(
        request_id,
        verdict,
        by=by,
        channel=place.channel,
        chat_id=place.chat_id,
        args_hash=args_hash,
    )
    return decision.outcome


async def test_a_request_is_stored_with_an_unguessable_short_id(store: ApprovalStore) -> None:
    request = await store.create(new(), expires_in=TIMEOUT)
    assert len(request.id) == ID_LENGTH and set(request.id) <= set(ID_ALPHABET)
    # Fits Telegram's callback_data (64 bytes) with room for a verb and the arguments' hash.
    assert len(f"ap:{request.id}:always:{request.asked.args_hash}".encode()) <= 64
    assert (request.state, request.scope, request.decided_by) == ("pending", None, None)
    assert request.expires_at - request.created_at == TIMEOUT
    assert request.asked == new()  # what was asked, as it was asked
    assert await store.get(request.id) == request
    other = await store.create(new(), expires_in=TIMEOUT)
    assert other.id != request.id


async def test_the_first_answer_wins_and_the_second_is_told_the_decision(
    store: ApprovalStore,
) -> None:
    request = await store.create(new(), expires_in=TIMEOUT)
    first = await store.decide(request.id, "once", by="100", channel="telegram", chat_id="100")
    assert first.won and first.request is not None
    assert (first.request.state, first.request.scope, first.request.decided_by) == (
        "approved",
        "once",
        "100",
    )
    second = await store.decide(request.id, "deny", by="100", channel="telegram", chat_id="100")
    assert not second.won
    assert second.outcome == "already_decided"
    assert second.request is not None and second.request.state == "approved"
    assert (await store.get(request.id)) == first.request


async def test_the_deciders_name_is_kept_for_every_member_to_show(
    db: Database, clock: Clock
) -> None:
    store = ApprovalStore(db, clock)
    request = await store.create(new(), expires_in=TIMEOUT)
    decision = await store.decide(
        request.id, "once", by="100", channel="telegram", chat_id="100", by_name="Alice"
    )
    assert decision.won
    other_member = ApprovalStore(db, clock)  # as another gateway of the cluster reads it
    stored = await other_member.get(request.id)
    assert stored is not None and (stored.decided_by, stored.decided_name) == ("100", "Alice")


async def test_concurrent_answers_from_two_connections_produce_exactly_one_decision(
    store_target: Path | str, clock: Clock
) -> None:
    path = store_target
    async with await Database.open(path) as one, await Database.open(path) as two:
        deciders = tuple(str(n) for n in range(20))
        request = await ApprovalStore(one, clock).create(new(deciders=deciders), expires_in=TIMEOUT)
        stores = [ApprovalStore(one, clock), ApprovalStore(two, clock)]
        verdicts: list[Verdict] = ["once", "deny", "chat", "always"]
        decisions = await asyncio.gather(
            *(
                stores[n % 2].decide(
                    request.id, verdicts[n % 4], by=str(n), channel="telegram", chat_id="100"
                )
                for n in range(20)
            )
        )
        winners = [d for d in decisions if d.won]
        assert len(winners) == 1
        assert {d.outcome for d in decisions if not d.won} == {"already_decided"}
        [winner] = winners
        assert winner.request is not None
        stored = await stores[1].get(request.id)
        assert stored is not None
        assert (stored.state, stored.scope, stored.decided_by) == (
            winner.request.state,
            winner.request.scope,
            winner.request.decided_by,
        )
        # Every loser was told that same decision.
        for decision in decisions:
            assert decision.request is not None
            assert decision.request.decided_by == stored.decided_by
        log = await stores[0].log()
        assert len(log) == 1


async def test_refused_answers_change_nothing_and_say_why(store: ApprovalStore) -> None:
    request = await store.create(new(scopes=("once",)), expires_in=TIMEOUT)
    unknown = await store.decide(
        "ZZZZZZZZZZZZ", "once", by="100", channel="telegram", chat_id="100"
    )
    assert (unknown.outcome, unknown.request) == ("unknown", None)
    foreign = await store.decide(request.id, "once", by="100", channel="telegram", chat_id="999")
    assert (foreign.outcome, foreign.request) == ("other_chat", None)
    other_platform = await answer(store, request.id, place=Place("discord", "100"))
    assert other_platform == "other_chat"
    stranger = await store.decide(request.id, "once", by="555", channel="telegram", chat_id="100")
    assert (stranger.outcome, stranger.request) == ("not_approver", None)
    assert await answer(store, request.id, args_hash="hash-rm -rf /") == "changed"
    assert await answer(store, request.id, "always") == "not_offered"
    assert await answer(store, request.id, "chat") == "not_offered"
    still = await store.get(request.id)
    assert still is not None and still.state == "pending"
    assert await store.rules() == []
    assert await store.log() == []
    # After all that, the real answer still wins.
    assert await answer(store, request.id, "once", args_hash=request.asked.args_hash) == "decided"


async def test_ids_are_matched_as_people_type_them(store: ApprovalStore) -> None:
    request = await store.create(new(), expires_in=TIMEOUT)
    assert await answer(store, f"  {request.id.lower()} ") == "decided"


async def test_an_answer_after_the_expiry_is_refused_and_marks_the_request_expired(
    store: ApprovalStore, clock: Clock
) -> None:
    request = await store.create(new(), expires_in=TIMEOUT)
    clock.now = START + TIMEOUT - timedelta(seconds=1)
    assert [r.id for r in await store.pending()] == [request.id]
    clock.now = START + TIMEOUT
    assert await store.pending() == []
    late = await store.decide(request.id, "once", by="100", channel="telegram", chat_id="100")
    assert late.outcome == "expired"
    assert late.request is not None and late.request.state == "expired"
    assert late.request.note == TIMED_OUT
    assert await answer(store, request.id) == "already_decided"
    [entry] = await store.log()
    assert (entry.outcome, entry.request_id, entry.reason) == ("expired", request.id, TIMED_OUT)


async def test_expire_and_cancel_close_only_pending_requests(store: ApprovalStore) -> None:
    timed_out = await store.create(new(), expires_in=TIMEOUT)
    decided = await store.create(new(), expires_in=TIMEOUT)
    assert await answer(store, decided.id, "deny") == "decided"
    expired = await store.expire(timed_out.id)
    assert expired.won and expired.request is not None and expired.request.state == "expired"
    again = await store.expire(decided.id)
    assert again.outcome == "already_decided"
    assert again.request is not None and again.request.state == "denied"
    assert (await store.expire("NOSUCHREQUES")).outcome == "unknown"
    stopped = await store.create(new(run_id="run2"), expires_in=TIMEOUT)
    other_run = await store.create(new(run_id="run3"), expires_in=TIMEOUT)
    [cancelled] = await store.cancel_run("run2", "the run was stopped")
    assert (cancelled.id, cancelled.state, cancelled.note) == (
        stopped.id,
        "cancelled",
        "the run was stopped",
    )
    assert [r.id for r in await store.pending()] == [other_run.id]
    assert (await store.cancel(other_run.id, "stopped")).won
    assert await store.pending() == []


async def test_a_restart_expires_every_pending_request_and_returns_its_cards(
    store_target: Path | str, clock: Clock
) -> None:
    path = store_target
    async with await Database.open(path) as db:
        store = ApprovalStore(db, clock)
        group = (Place("telegram", "100"), Place("telegram", "200"))
        first = await store.create(new(places=group), expires_in=TIMEOUT)
        assert await store.card_sent(first.id, group[1], "77")
        assert not await store.card_sent(first.id, Place("telegram", "300"), "78")
        second = await store.create(new("pwd"), expires_in=TIMEOUT)
        done = await store.create(new("date"), expires_in=TIMEOUT)
        assert await answer(store, done.id) == "decided"
    async with await Database.open(path) as db:
        store = ApprovalStore(db, clock)
        expired = await store.expire_pending()
        assert {r.id for r in expired} == {first.id, second.id}
        [with_cards] = [r for r in expired if r.id == first.id]
        assert with_cards.asked.places == (Place("telegram", "100"), Place("telegram", "200", "77"))
        assert {(r.state, r.note) for r in expired} == {("expired", RESTARTED)}
        assert await store.expire_pending() == []
        assert await answer(store, first.id) == "already_decided"
        kept = await store.get(done.id)
        assert kept is not None and (kept.state, kept.scope) == ("approved", "once")


async def test_a_cluster_member_starting_spares_the_requests_live_members_wait_for(
    db: Database, store: ApprovalStore, clock: Clock
) -> None:
    waiting = await store.create(new(session_key="telegram:100"), expires_in=TIMEOUT)
    orphan = await store.create(new(session_key="telegram:200"), expires_in=TIMEOUT)
    # A live member holds the session whose run waits; the other session's holder is dead.
    assert await Claims(db, "live").hold("telegram:100", clock(), timedelta(seconds=10))
    lapsed = clock() - timedelta(minutes=1)
    assert await Claims(db, "dead").hold("telegram:200", lapsed, timedelta(seconds=10))
    expired = await store.expire_pending(spare_held=True)
    assert [r.id for r in expired] == [orphan.id]
    assert await answer(store, waiting.id) == "decided"


MINE = Turn("telegram:100", "telegram", "100")


async def test_always_saves_one_rule_for_its_person_until_revoked(store: ApprovalStore) -> None:
    assert await store.match("exec", "ls -la", MINE) == []
    request = await store.create(new(owner="100", fingerprint="{}"), expires_in=TIMEOUT)
    assert await answer(store, request.id, "always") == "decided"
    [rule] = await store.rules()
    assert (rule.tool, rule.rule_key, rule.created_by, rule.request_id) == (
        "exec",
        "ls -la",
        "100",
        request.id,
    )
    assert (rule.channel, rule.user_id, rule.session_key) == ("telegram", "100", None)
    grant = Grant("always", rule.id, "{}")
    # Their own turns on that channel: their chat, their cron job's session.
    assert await store.match("exec", "ls -la", MINE) == [grant]
    assert await store.match("exec", "ls -la", Turn("cron:j1", "telegram", "100")) == [grant]
    # Nobody else's turn, no group, no other platform, no other command or tool.
    assert await store.match("exec", "ls -la", Turn("telegram:200", "telegram", "200")) == []
    assert await store.match("exec", "ls -la", Turn("telegram:-5", "telegram", None)) == []
    assert await store.match("exec", "ls -la", Turn("discord:5", "discord", "100")) == []
    assert await store.match("exec", "ls -l", MINE) == []
    assert await store.match("write_file", "ls -la", MINE) == []
    # The same command approved "always" again keeps one rule, pinned to the code as it is.
    again = await store.create(new(owner="100", fingerprint='{"a":"1"}'), expires_in=TIMEOUT)
    assert await answer(store, again.id, "always") == "decided"
    [kept] = await store.rules()
    assert (kept.id, kept.fingerprint, kept.request_id) == (rule.id, '{"a":"1"}', again.id)
    revoked = await store.revoke(f" {rule.id.upper()} ", by="cli")
    assert revoked == kept
    assert await store.revoke(rule.id) is None
    assert await store.match("exec", "ls -la", MINE) == []
    assert [e.outcome for e in await store.log()] == ["approved", "approved", "revoked"]


async def test_a_groups_rule_is_for_that_group_not_for_the_approver(store: ApprovalStore) -> None:
    group = Place("telegram", "-5")
    asked = new(session_key="telegram:-5", deciders=("9",), places=(Place("telegram", "@9"), group))
    request = await store.create(asked, expires_in=TIMEOUT)
    assert await answer(store, request.id, "always", by="9", place=Place("telegram", "@9"))
    [rule] = await store.rules()
    assert (rule.channel, rule.user_id, rule.session_key) == ("telegram", None, "telegram:-5")
    assert await store.match("exec", "ls -la", Turn("telegram:-5", "telegram", None)) == [
        Grant("always", rule.id)
    ]
    assert await store.match("exec", "ls -la", Turn("telegram:-6", "telegram", None)) == []
    assert await store.match("exec", "ls -la", Turn("telegram:9", "telegram", "9")) == []
    # The same command for a person's turns is a rule of its own.
    mine = await store.create(new(owner="100"), expires_in=TIMEOUT)
    assert await answer(store, mine.id, "always") == "decided"
    assert len(await store.rules()) == 2
    assert [r.id for r in await store.rules(channel="discord")] == []


async def test_always_is_refused_where_the_request_does_not_offer_it(store: ApprovalStore) -> None:
    inline = await store.create(new("sh -c 'ls'", scopes=("once",)), expires_in=TIMEOUT)
    assert await answer(store, inline.id, "always") == "not_offered"
    assert await store.rules() == []
    assert await answer(store, inline.id, "once") == "decided"
    assert await store.match("exec", "sh -c 'ls'", MINE) == []


async def test_chat_scope_holds_for_its_session_until_cleared(store: ApprovalStore) -> None:
    request = await store.create(new(fingerprint='{"a":"1"}'), expires_in=TIMEOUT)
    assert await answer(store, request.id, "chat") == "decided"
    assert await store.match("exec", "ls -la", MINE) == [Grant("chat", None, '{"a":"1"}')]
    assert await store.match("exec", "ls -la", Turn("telegram:101", "telegram", "100")) == []
    assert await store.rules() == []
    # Granted again, it pins the code as it is now.
    again = await store.create(new(fingerprint='{"a":"2"}'), expires_in=TIMEOUT)
    assert await answer(store, again.id, "chat") == "decided"
    assert await store.match("exec", "ls -la", MINE) == [Grant("chat", None, '{"a":"2"}')]
    assert await store.clear_chat_scope("telegram:100") == 1
    assert await store.match("exec", "ls -la", MINE) == []
    assert await store.clear_chat_scope("telegram:100") == 0


async def test_with_both_a_chat_grant_and_a_rule_the_chat_grant_comes_first(
    store: ApprovalStore,
) -> None:
    for verdict in ("always", "chat"):
        request = await store.create(new(owner="100"), expires_in=TIMEOUT)
        assert await answer(store, request.id, verdict) == "decided"
    [rule] = await store.rules()
    assert await store.match("exec", "ls -la", MINE) == [Grant("chat"), Grant("always", rule.id)]
    await store.clear_chat_scope("telegram:100")
    assert await store.match("exec", "ls -la", MINE) == [Grant("always", rule.id)]


async def test_the_log_keeps_every_decision_in_order(store: ApprovalStore, clock: Clock) -> None:
    approved = await store.create(new(), expires_in=TIMEOUT)
    await answer(store, approved.id, "chat")
    clock.now += timedelta(seconds=1)
    denied = await store.create(new("rm x"), expires_in=TIMEOUT)
    await answer(store, denied.id, "deny")
    clock.now += timedelta(seconds=1)
    await store.record(
        tool="exec",
        arguments='{"command":"ls"}',
        outcome="refused",
        reason="no approver in this group",
        session_key="telegram:-5",
    )
    entries = await store.log()
    assert [(e.outcome, e.scope, e.decided_by) for e in entries] == [
        ("approved", "chat", "100"),
        ("denied", None, "100"),
        ("refused", None, None),
    ]
    assert entries[2].reason == "no approver in this group"
    assert entries[2].at == START + timedelta(seconds=2)
    assert [e.outcome for e in await store.log(limit=2)] == ["denied", "refused"]


async def test_a_request_needs_a_place_and_a_decider(store: ApprovalStore) -> None:
    with pytest.raises(ValueError, match="asked in"):
        await store.create(new(places=()), expires_in=TIMEOUT)
    with pytest.raises(ValueError, match="asked in"):
        await store.create(new(deciders=()), expires_in=TIMEOUT)
    with pytest.raises(ValueError, match="scopes"):
        await store.create(new(scopes=("forever",)), expires_in=TIMEOUT)
    assert await store.pending() == []


async def test_a_database_from_schema_6_is_upgraded_with_its_data(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with closing(sqlite3.connect(path)) as conn:
        for version, script in enumerate(migrations.MIGRATIONS[:6], start=1):
            conn.executescript(script)
            conn.execute(f"PRAGMA user_version = {version}")
        conn.execute(
            "INSERT INTO sessions (key, created_at) VALUES ('telegram:1', '2026-01-01T00:00Z')"
        )
        conn.execute(
            "INSERT INTO entries (session_id, kind, data, created_at)"
            ' VALUES (1, \'message\', \'{"role": "user", "content": "kept"}\', \'2026-01-01\')'
        )
        conn.execute(
            "INSERT INTO allowed_users (channel, user_id, approved_at) VALUES ('telegram', '7', '')"
        )
        conn.commit()
    async with await Database.open(path) as db:
        schema = await db.fetchone("PRAGMA user_version")
        assert schema is not None and schema[0] == len(migrations.MIGRATIONS) >= 7
        session_id = await SessionStore(db).live("telegram:1")
        assert session_id == 1
        [entry] = await SessionStore(db).tail(session_id, 10)
        assert entry.data["content"] == "kept"
        user = await db.fetchone("SELECT user_id FROM allowed_users")
        assert user is not None and user[0] == "7"
        store = ApprovalStore(db)
        request = await store.create(new(), expires_in=TIMEOUT)
        assert await answer(store, request.id, "always") == "decided"
        assert len(await store.rules()) == 1


async def test_rules_saved_before_they_were_bound_keep_to_the_chat_they_were_saved_for(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    with closing(sqlite3.connect(path)) as conn:
        for version, script in enumerate(migrations.MIGRATIONS[:17], start=1):
            conn.executescript(script)
            conn.execute(f"PRAGMA user_version = {version}")
        conn.execute(
            "INSERT INTO approval_requests (id, session_key, run_id, tool_call_id, tool,"
            " arguments, args_hash, rule_key, scopes, reason, deciders, state, scope,"
            " created_at, expires_at, decided_by, decided_at) VALUES ('R1', 'telegram:100',"
            " 'run', 'call', 'exec', '{}', 'h', 'ls', 'once chat always', 'why', '[\"100\"]',"
            " 'approved', 'always', '2026-01-01', '2026-01-01', '100', '2026-01-01')"
        )
        conn.execute(
            "INSERT INTO approval_places (request_id, channel, chat_id) VALUES"
            " ('R1', 'telegram', '@100')"
        )
        conn.execute(
            "INSERT INTO approval_rules (id, tool, rule_key, arguments, created_at, created_by,"
            " request_id) VALUES ('aaaa0001', 'exec', 'ls', '{}', '2026-01-01', '100', 'R1'),"
            " ('aaaa0002', 'exec', 'pwd', '{}', '2026-01-02', '100', NULL)"
        )
        conn.commit()
    async with await Database.open(path) as db:
        store = ApprovalStore(db)
        bound, lost = await store.rules()
        assert (bound.channel, bound.user_id, bound.session_key) == (
            "telegram",
            None,
            "telegram:100",
        )
        assert (lost.channel, lost.user_id, lost.session_key) == ("", None, None)
        assert bound.fingerprint == lost.fingerprint == ""
        # In its own chat only (with no fingerprint: an exec rule asks once more there).
        assert await store.match("exec", "ls", MINE) == [Grant("always", "aaaa0001")]
        assert await store.match("exec", "ls", Turn("telegram:200", "telegram", "200")) == []
        assert await store.match("exec", "ls", Turn("telegram:-5", "telegram", None)) == []
