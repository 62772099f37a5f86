"""Budgets through the real loop: the fake model (which reports usage, and cost when told),
the direct transport, SQLite (and PostgreSQL for the race), a clock the test moves."""

from __future__ import annotations

import asyncio
import zoneinfo
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nanobot.agent.budget import Budgets, BudgetSettings, Caps, periods
from nanobot.agent.context import ContextBuilder
from nanobot.agent.loop import AgentLoop, LoopSettings
from nanobot.agent.run import OverBudget
from nanobot.agent.runner import Runner
from nanobot.agent.turn import TurnRequest
from nanobot.app._budget import say_unpriced
from nanobot.providers.base import Usage
from nanobot.providers.catalog import Prices
from nanobot.providers.provider import Provider, RetryPolicy
from nanobot.store import Database, SessionStore, UsageLedger
from nanobot.store.budgets import BudgetStore
from nanobot.tools.registry import ToolRegistry
from nanobot.workspace import copy_template
from tests._clock import Clock
from tests.fakes.llm import Call, FakeLLM, Text, ToolCalls
from tests.fakes.tools import EchoTool
from tests.gateway_process import TEST_TRANSPORT
from tests.test_provider_servers import provider_on

MODEL = "openai/fake-model"
MAX_TOKENS = 200
PRICE = Prices(0.0, 1e-3)  # a call's expected cost: its 200 tokens at most, $0.20
CALL = 0.2
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


class Rig:
    def __init__(self, loop: AgentLoop, budgets: Budgets, usage: UsageLedger) -> None:
        self.loop, self.budgets, self.usage = loop, budgets, usage

    async def say(self, text: str, sender: str = "ada", **fields: Any) -> str:
        request = TurnRequest(f"t:{sender}", text, sender_id=sender, **fields)
        reply = await self.loop.handle(request)
        assert reply is not None
        self.last = reply
        return reply.text or ""


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    async with await Database.open(tmp_path / "state.db") as database:
        yield database


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 12, 4, 12, 0, tzinfo=UTC))


def build(
    tmp_path: Path,
    fake: FakeLLM,
    db: Database,
    clock: Clock,
    prices: dict[str, Prices] | None = None,
    **caps: Any,
) -> Rig:
    workspace = tmp_path / "workspace"
    copy_template(workspace)
    provider = provider_on(
        TEST_TRANSPORT,
        fake,
        retry=RetryPolicy(attempts=0),
        max_tokens=MAX_TOKENS,
        prices={MODEL: PRICE} if prices is None else prices,
    )
    caps = {"warn_at": 1.0, **caps}
    settings = BudgetSettings(approvers={"cli": {"boss"}}, **caps)
    budgets = budgets_on(BudgetStore(db, clock), settings, provider, clock)
    usage = UsageLedger(db)
    loop = AgentLoop(
        provider,
        Runner(provider, ToolRegistry([EchoTool()])),
        SessionStore(db),
        ContextBuilder(workspace),
        LoopSettings(max_tokens=MAX_TOKENS),
        usage=usage,
        budgets=budgets,
    )
    return Rig(loop, budgets, usage)


def budgets_on(
    store: BudgetStore, settings: BudgetSettings, provider: Provider, clock: Clock
) -> Budgets:
    return Budgets(
        store,
        settings,
        price=provider.price,
        count=provider.count_tokens,
        model=provider.model,
        max_tokens=MAX_TOKENS,
        clock=clock,
    )


@pytest.mark.parametrize(
    ("caps", "label"),
    [
        ({"install": Caps(daily=0.5)}, "the daily budget of this assistant"),
        ({"install": Caps(monthly=0.5)}, "the monthly budget of this assistant"),
        ({"person": Caps(daily=0.5)}, "the daily budget for you"),
        ({"person": Caps(daily=9), "people": {"ada": Caps(daily=0.5)}}, "the daily budget for you"),
    ],
)
async def test_a_period_cap_stops_the_turn_that_would_pass_it(
    tmp_path: Path,
    fake_llm: FakeLLM,
    db: Database,
    clock: Clock,
    *,
    caps: dict[str, Any],
    label: str,
) -> None:
    rig = build(tmp_path, fake_llm, db, clock, **caps)
    fake_llm.script(*[Text("fine", cost=CALL)] * 3)
    assert await rig.say("one") == "fine"
    assert await rig.say("two") == "fine"
    refused = await rig.say("three")
    assert len(fake_llm.requests) == 2  # the third call was never made
    assert refused.startswith(f"Over budget: {label} is $0.50, and $0.40 is spent.")
    assert "It resets 2026-12-05 00:00 UTC" in refused or "It resets 2027-01-01" in refused
    assert "An approver (boss) can raise it with /budget raise." in refused
    assert isinstance(rig.last.result.error, OverBudget)
    if "people" in caps or "person" in caps:
        assert await rig.say("someone else", sender="bob") == "fine"


async def test_another_persons_spend_counts_against_the_install_not_theirs(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock
) -> None:
    rig = build(tmp_path, fake_llm, db, clock, person=Caps(daily=0.3))
    fake_llm.script(*[Text("fine", cost=CALL)] * 3)
    assert await rig.say("a", sender="ada") == "fine"
    assert await rig.say("b", sender="bob") == "fine"
    assert (await rig.say("c", sender="ada")).startswith("Over budget: the daily budget for you")


async def test_per_turn_cost_ends_a_running_turn_with_what_it_has(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock
) -> None:
    rig = build(tmp_path, fake_llm, db, clock, max_cost=0.5)
    echo = Call("echo", {"text": "x"})
    fake_llm.script(
        ToolCalls([echo], content="Looking.", cost=CALL),
        ToolCalls([echo], content="Still looking.", cost=CALL),
    )
    reply = await rig.say("dig")
    assert len(fake_llm.requests) == 2
    assert reply.startswith("Looking.\n\nStill looking.\n\nI stopped: this turn would pass its")
    assert "$0.50" in reply
    assert rig.last.result.status == "failed"
    # A fresh turn has its own allowance.
    fake_llm.script(Text("again", cost=CALL))
    assert await rig.say("go on") == "again"


async def test_per_turn_tokens_stop_before_the_call_that_would_pass_them(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock
) -> None:
    rig = build(tmp_path, fake_llm, db, clock, max_tokens=MAX_TOKENS + 100)
    reply = await rig.say("hello")  # system prompt + 200 > 300
    assert fake_llm.requests == []
    assert reply.startswith("I stopped: this turn would pass its limit of 300 tokens")


async def test_cron_turns_have_their_own_cap_and_count_no_person(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock
) -> None:
    rig = build(tmp_path, fake_llm, db, clock, cron_daily=0.3, person=Caps(daily=0.3))
    fake_llm.script(*[Text("done", cost=CALL)] * 3)
    assert await rig.say("job", source="cron") == "done"
    assert (await rig.say("job", source="cron")).startswith(
        "Over budget: the daily budget of cron jobs is $0.30"
    )
    assert isinstance(rig.last.result.error, OverBudget)
    assert await rig.say("chat") == "done"  # ada's own budget is untouched by cron
    assert await rig.say("beat", source="heartbeat") != ""  # no heartbeat cap: not checked


async def test_the_warning_comes_once_per_period(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock
) -> None:
    rig = build(tmp_path, fake_llm, db, clock, install=Caps(daily=1.0), warn_at=0.5)
    fake_llm.script(*[Text("ok", cost=CALL)] * 5)
    replies = [await rig.say(str(n)) for n in range(4)]
    assert replies[:2] == ["ok", "ok"]
    assert replies[2] == (
        "ok\n\nNote: the daily budget of this assistant is 60% spent ($0.60 of $1.00)."
    )
    assert replies[3] == "ok"
    clock.time += timedelta(days=1)
    fake_llm.script(*[Text("ok", cost=CALL)] * 3)
    replies = [await rig.say(str(n)) for n in range(3)]
    assert replies[2].startswith("ok\n\nNote:")  # a new day, a new warning


async def test_a_raise_takes_effect_at_once(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock
) -> None:
    rig = build(tmp_path, fake_llm, db, clock, install=Caps(daily=0.3))
    fake_llm.script(*[Text("ok", cost=CALL)] * 2)
    assert await rig.say("one") == "ok"
    assert (await rig.say("two")).startswith("Over budget")
    said = await rig.budgets.grant("all", 0.25, True, "cli:boss")
    assert said == "Raised everyone's budget by $0.25 for today (until 2026-12-05 00:00 UTC)."
    assert await rig.say("three") == "ok"
    refused = await rig.say("four")
    assert refused.startswith("Over budget: the daily budget of this assistant is $0.55")
    assert "and $0.40 is spent." in refused


async def test_the_day_rolls_over_at_local_midnight_across_a_dst_change(
    tmp_path: Path, fake_llm: FakeLLM, db: Database
) -> None:
    # 2026-10-25 is 25 hours long in Berlin: CEST (+2) until 03:00, CET (+1) after.
    clock = Clock(datetime(2026, 10, 24, 23, 30, tzinfo=BERLIN))
    rig = build(tmp_path, fake_llm, db, clock, install=Caps(daily=0.3))
    rig.budgets.settings = replace(rig.budgets.settings, timezone=BERLIN)
    fake_llm.script(*[Text("ok", cost=CALL)] * 4)
    assert await rig.say("sat") == "ok"
    refused = await rig.say("sat again")
    assert "It resets 2026-10-25 00:00 CEST" in refused
    clock.time = datetime(2026, 10, 25, 0, 0, 1, tzinfo=BERLIN)
    assert await rig.say("sun") == "ok"
    clock.time = datetime(2026, 10, 25, 23, 59, tzinfo=BERLIN)  # 24 h 59 min after midnight
    refused = await rig.say("sun again")
    assert "It resets 2026-10-26 00:00 CET" in refused
    clock.time = datetime(2026, 10, 25, 23, 0, tzinfo=UTC)  # Berlin's midnight, in UTC
    assert await rig.say("mon") == "ok"


def test_periods_follow_the_wall_clock_of_the_zone() -> None:
    day, month = periods(datetime(2026, 10, 25, 22, 59, tzinfo=UTC), BERLIN)
    assert (day.key, month.key) == ("day:2026-10-25", "month:2026-10")
    assert day.ends == datetime(2026, 10, 26, tzinfo=BERLIN)
    start = datetime(2026, 10, 25, tzinfo=BERLIN).astimezone(UTC)
    assert day.ends.astimezone(UTC) - start == timedelta(hours=25)
    _, december = periods(datetime(2026, 12, 31, 23, 0, tzinfo=UTC), BERLIN)
    assert december.key == "month:2027-01"  # already January in Berlin


async def test_provider_reported_cost_is_preferred_to_the_price(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock
) -> None:
    rig = build(tmp_path, fake_llm, db, clock, install=Caps(daily=10))
    fake_llm.script(Text("reported", cost=0.0123), Text("priced"))
    await rig.say("one")
    assert rig.last.result.usage.cost == pytest.approx(0.0123)
    await rig.say("two")
    usage = rig.last.result.usage
    assert usage.cost == pytest.approx(usage.completion_tokens * PRICE.output)
    assert not usage.reported and usage.priced


async def test_an_unknown_price_is_said_once_and_never_shown_as_zero(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock, warnings: list[str]
) -> None:
    rig = build(tmp_path, fake_llm, db, clock, prices={}, install=Caps(daily=1))
    assert say_unpriced(rig.loop._provider) == [MODEL]  # type: ignore[arg-type]
    assert any("no price known for openai/fake-model" in w for w in warnings)
    fake_llm.script(Text("hi"))
    assert await rig.say("hello") == "hi"  # nothing to hold; nothing refused
    assert not rig.last.result.usage.priced
    totals = await rig.usage.totals()
    assert (totals.runs, totals.unpriced, totals.cost) == (1, 1, 0.0)


async def test_reservations_are_released_when_the_call_fails(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock
) -> None:
    from tests.fakes.llm import ServerError

    rig = build(tmp_path, fake_llm, db, clock, install=Caps(daily=0.3))
    fake_llm.script(ServerError(503), Text("ok", cost=CALL))
    await rig.say("fails")
    assert rig.last.result.status == "failed"
    [standing] = await rig.budgets.store.standing([("install", "day:2026-12-04")])
    assert (standing.spent, standing.held) == (0.0, 0.0)
    assert await rig.say("works") == "ok"


async def test_holds_of_a_crashed_process_expire(db: Database, clock: Clock) -> None:
    from nanobot.store.budgets import Claim

    store = BudgetStore(db, clock)
    claim = [Claim("install", "day:x", 1.0)]
    assert await store.reserve("dead", claim, 0.8, timedelta(minutes=15))
    assert await store.reserve("live", claim, 0.1, timedelta(minutes=30))
    assert not await store.reserve("next", claim, 0.8, timedelta(minutes=15))
    clock.time += timedelta(minutes=14)
    assert await store.expire() == 0  # not yet
    clock.time += timedelta(minutes=2)
    assert await store.expire() == 1
    [standing] = await store.standing([("install", "day:x")])
    assert standing.held == pytest.approx(0.1)  # the live hold still counts
    assert await store.reserve("next", claim, 0.8, timedelta(minutes=15))
    assert not await store.reserve("more", claim, 0.2, timedelta(minutes=15))


async def test_a_turn_reconciles_expired_holds_itself(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock
) -> None:
    from nanobot.store.budgets import Claim

    rig = build(tmp_path, fake_llm, db, clock, install=Caps(daily=0.3))
    claim = [Claim("install", "day:2026-12-04", 0.3)]
    assert await rig.budgets.store.reserve("crashed", claim, 0.3, timedelta(minutes=15))
    assert (await rig.say("one")).startswith("Over budget")
    assert "$0.30 more held by replies under way" in rig.last.text  # type: ignore[operator]
    clock.time += timedelta(minutes=16)
    fake_llm.script(Text("ok", cost=CALL))
    assert await rig.say("two") == "ok"


async def race(budgets: list[Budgets], turns: int = 200) -> int:
    """`turns` concurrent turns of one call each, spread over `budgets` (one per member);
    how many made their call."""
    made = 0

    async def turn(n: int) -> None:
        nonlocal made
        spend = budgets[n % len(budgets)].for_turn(f"p{n % 7}", "chat", "cli")
        if await spend.reserve([{"role": "user", "content": "hi"}]) is not None:
            return
        made += 1
        await asyncio.sleep(0.001)  # the call
        await spend.spent(Usage(10, MAX_TOKENS, CALL, reported=True))

    await asyncio.gather(*(turn(n) for n in range(turns)))
    return made


def _race_budgets(stores: list[Database], clock: Clock) -> list[Budgets]:
    provider = Provider(MODEL, None, prices={MODEL: PRICE})  # type: ignore[arg-type]
    settings = BudgetSettings(install=Caps(daily=20 * CALL))
    return [budgets_on(BudgetStore(db, clock), settings, provider, clock) for db in stores]


async def test_a_race_of_200_turns_on_sqlite_lets_20_through(tmp_path: Path, clock: Clock) -> None:
    async with (
        await Database.open(tmp_path / "s.db") as one,
        await Database.open(tmp_path / "s.db") as two,
    ):
        made = await race(_race_budgets([one, two], clock))
    assert 19 <= made <= 21


async def test_a_race_of_200_turns_on_two_postgresql_members_lets_20_through(
    postgres_url: str, clock: Clock
) -> None:
    async with (
        await Database.open(postgres_url) as one,
        await Database.open(postgres_url) as two,
    ):
        made = await race(_race_budgets([one, two], clock))
        [standing] = await BudgetStore(one, clock).standing([("install", "day:2026-12-04")])
    assert 19 <= made <= 21
    assert standing.spent == pytest.approx(made * CALL)
    assert standing.held == 0  # rounding aside


async def test_past_warn_at_turns_use_the_cheaper_model_and_say_so_once(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock
) -> None:
    cheap = "openai/cheap-model"
    prices = {MODEL: PRICE, cheap: Prices(0.0, 1e-4)}
    rig = build(
        tmp_path,
        fake_llm,
        db,
        clock,
        prices,
        install=Caps(daily=1.0),
        warn_at=0.5,
        degrade_to=cheap,
    )
    fake_llm.script(*[Text("ok", cost=CALL)] * 3, Text("cheap", cost=0.02))
    replies = [await rig.say(str(n)) for n in range(4)]
    assert [r.model for r in fake_llm.requests] == [*["fake-model"] * 3, "cheap-model"]
    assert replies[2].endswith("Replies use openai/cheap-model from now on.")
    assert replies[3] == "cheap"
    rows = await rig.usage.report("model")
    assert [(line.key, line.totals.runs) for line in rows] == [(cheap, 1), (MODEL, 3)]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("budget: {daily: -1}\n", "budget.daily: Input should be greater than or equal to 0"),
        ("budget: {warn_at: 1.5}\n", "budget.warn_at: Input should be less than or equal to 1"),
        ("budget: {degrade_to: gpt-4o-mini}\n", "names no provider"),
        ("budget: {people: {123: {weekly: 1}}}\n", "budget.people.123.weekly"),
        ("agent: {prices: {openai/x: {input: 1}}}\n", "agent.prices.openai/x.output"),
    ],
)
def test_a_bad_budget_or_price_is_refused_naming_the_key(
    tmp_path: Path, text: str, reason: str
) -> None:
    from nanobot.config import load
    from nanobot.errors import ConfigError

    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as info:
        load(path)
    assert reason in str(info.value)


def test_people_ids_written_bare_are_text(tmp_path: Path) -> None:
    from nanobot.app._budget import budget_settings
    from nanobot.config import load

    path = tmp_path / "config.yaml"
    path.write_text("budget: {person: {daily: 2}, people: {123: {monthly: 9}}}\n")
    settings = budget_settings(load(path))
    assert settings.people == {"123": Caps(None, 9)}
    assert settings.people["123"].over(settings.person) == Caps(2, 9)


async def test_an_unpriced_model_is_stopped_by_what_its_provider_reported(
    tmp_path: Path, fake_llm: FakeLLM, db: Database, clock: Clock
) -> None:
    rig = build(tmp_path, fake_llm, db, clock, prices={}, install=Caps(daily=0.3))
    fake_llm.script(*[Text("ok", cost=CALL)] * 3)
    assert await rig.say("one") == "ok"
    two = await rig.say("two")  # nothing held: the cap plus one call's worth
    assert two.startswith("ok\n\nNote: the daily budget of this assistant is 133% spent")
    refused = await rig.say("three")
    assert refused.startswith("Over budget: the daily budget of this assistant is $0.30, and $0.40")
    assert len(fake_llm.requests) == 2
