"""Budgets: which caps apply to a turn, holding each model call's expected cost against
them before it is made (`TurnSpend`, the runner's `Spend`), the warning at `warn_at`, and
what `/budget` shows and raises.

Period budgets (the install's daily and monthly, each person's, cron's and the heartbeat's
daily) live in the store (`store.budgets`), so concurrent turns and several cluster members
never spend more than a cap plus one call's worth. The per-turn caps (`max_cost`,
`max_tokens`) are the turn's own and kept here. A call's expected cost is its prompt
tokens (the provider's count) plus the turn's `max_tokens` at the model's price; a model
with no known price holds nothing (it is said at start), and only what the provider
reports for it counts.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Final

from loguru import logger

from nanobot.bus.events import Source
from nanobot.providers.base import Message, Usage
from nanobot.providers.catalog import Prices
from nanobot.store.budgets import BudgetStore, Claim, Standing

INSTALL: Final = "install"
PERSON: Final = "person:"
UNATTENDED: Final[tuple[Source, ...]] = ("cron", "heartbeat")
RECONCILE: Final = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Caps:
    """A daily and a monthly cap in USD; None: none."""

    daily: float | None = None
    monthly: float | None = None

    def over(self, other: Caps) -> Caps:
        """These caps where set, else `other`'s (a person's override over the default)."""
        return Caps(
            self.daily if self.daily is not None else other.daily,
            self.monthly if self.monthly is not None else other.monthly,
        )


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    """The `budget` config section, as the agent takes it; `hold`: how long a call's hold
    counts at most (longer than any call takes: a turn's time limit)."""

    install: Caps = Caps()
    person: Caps = Caps()
    people: Mapping[str, Caps] = field(default_factory=dict)
    max_cost: float | None = None
    max_tokens: int | None = None
    cron_daily: float | None = None
    heartbeat_daily: float | None = None
    warn_at: float = 0.8
    degrade_to: str | None = None
    timezone: tzinfo = UTC
    hold: timedelta = timedelta(minutes=15)
    approvers: Mapping[str, Collection[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Period:
    """A day or a month in the install's time zone: its key in the store and its end."""

    key: str
    ends: datetime
    daily: bool


def periods(now: datetime, zone: tzinfo) -> tuple[Period, Period]:
    """Today and this month at `now` in `zone`; each ends at local midnight (the wall
    clock's, whatever a DST change did to the day's length)."""
    local = now.astimezone(zone)
    today = local.date()
    tomorrow = datetime.combine(today + timedelta(days=1), time(0), zone)
    first = date(today.year + today.month // 12, today.month % 12 + 1, 1)
    return (
        Period(f"day:{today.isoformat()}", tomorrow, True),
        Period(f"month:{today:%Y-%m}", datetime.combine(first, time(0), zone), False),
    )


class Budgets:
    """The budgets of one process. `price(model)`: what a model costs (None: unknown);
    `count(messages)`: a call's prompt tokens; `model`/`max_tokens`: the calls'."""

    def __init__(
        self,
        store: BudgetStore,
        settings: BudgetSettings,
        *,
        price: Callable[[str], Prices | None],
        count: Callable[[Sequence[Message]], int],
        model: str,
        max_tokens: int,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store, self.settings = store, settings
        self._price, self._count, self.model, self._max_tokens = price, count, model, max_tokens
        self.clock = clock
        # The budgets this process saw at warn_at or past it (each warned about once).
        self._warned: set[tuple[str, str]] = set()
        self._reconciled: datetime | None = None

    async def reconcile(self) -> None:
        """Drop expired holds (of calls whose process died) at the first call and every
        `RECONCILE` after."""
        now = self.clock()
        if self._reconciled is not None and now - self._reconciled < RECONCILE:
            return
        self._reconciled = now
        dropped = await self.store.expire()
        if dropped:
            logger.info(
                "dropped {} expired budget holds (of calls a stopped process made)", dropped
            )

    def for_turn(self, person: str | None, source: Source, channel: str | None) -> TurnSpend:
        """The spend of one turn, started by `person` (a platform user id) from `source`."""
        return TurnSpend(self, person if source not in UNATTENDED else None, source, channel)

    def claims(self, person: str | None, source: Source) -> list[tuple[Claim, Period, str]]:
        """The period budgets a call of such a turn is held against now, each with its
        period and the words that name it."""
        s = self.settings
        day, month = periods(self.clock(), s.timezone)
        out: list[tuple[Claim, Period, str]] = []

        def add(scope: str, caps: Caps, whose: str) -> None:
            if caps.daily is not None:
                out.append((Claim(scope, day.key, caps.daily), day, f"the daily budget {whose}"))
            if caps.monthly is not None:
                label = f"the monthly budget {whose}"
                out.append((Claim(scope, month.key, caps.monthly), month, label))

        add(INSTALL, s.install, "of this assistant")
        if person is not None:
            add(PERSON + person, s.people.get(person, Caps()).over(s.person), "for you")
        if source == "cron":
            add("cron", Caps(s.cron_daily), "of cron jobs")
        elif source == "heartbeat":
            add("heartbeat", Caps(s.heartbeat_daily), "of the heartbeat")
        return out

    def degraded(self, claims: Sequence[tuple[Claim, Period, str]]) -> str | None:
        """`degrade_to`, where one of `claims` is past `warn_at` (as this process last saw
        it); else None."""
        model = self.settings.degrade_to
        if model is None or not any((c.scope, c.period) in self._warned for c, _, _ in claims):
            return None
        return model

    def expected(self, messages: Sequence[Message], model: str | None = None) -> tuple[int, float]:
        """A call's expected tokens (prompt and the most it may write) and cost (0.0 for a
        model with no known price) with `model` (None: the primary)."""
        prompt = self._count(messages)
        prices = self._price(model or self.model)
        cost = prices.cost(prompt, self._max_tokens) if prices is not None else 0.0
        return prompt + self._max_tokens, cost

    def who_raises(self, channel: str | None) -> str:
        approvers = sorted(self.settings.approvers.get(channel or "", ()))
        if approvers:
            return f"An approver ({', '.join(approvers)}) can raise it with /budget raise."
        return "The owner can raise it in the config (the `budget` section)."

    async def refusal(
        self, claims: Sequence[tuple[Claim, Period, str]], cost: float, channel: str | None
    ) -> str:
        """Why a call of `cost` does not fit `claims`: the first budget it does not fit."""
        standings = await self.store.standing([(c.scope, c.period) for c, _, _ in claims])
        chosen = claims[0], standings[0]
        for each, standing in zip(claims, standings, strict=True):
            used, cap = standing.spent + standing.held, each[0].cap + standing.raised
            if used + cost > cap or used >= cap:
                chosen = each, standing
                break
        (claim, period, label), standing = chosen
        who = self.who_raises(channel)
        return over_text(label, claim.cap + standing.raised, standing, period, who)

    async def note_spend(
        self,
        claims: Sequence[tuple[Claim, Period, str]],
        spent: Sequence[tuple[str, str, float]],
    ) -> list[str]:
        """The warnings due now that the budgets of `claims` stand at `spent`: each budget's
        once per period (across the cluster), when it reaches `warn_at` of its cap."""
        notes = []
        by_key = {(c.scope, c.period): (c, label) for c, _, label in claims}
        for scope, period, total in spent:
            claim, label = by_key[(scope, period)]
            if (scope, period) in self._warned or total < self.settings.warn_at * claim.cap:
                continue
            [standing] = await self.store.standing([(scope, period)])
            cap = claim.cap + standing.raised
            if total < self.settings.warn_at * cap:
                continue
            self._warned.add((scope, period))
            if await self.store.warn_once(scope, period):
                share = 100 * total / cap if cap else 100.0
                note = f"Note: {label} is {share:.0f}% spent (${total:.2f} of ${cap:.2f})."
                if self.settings.degrade_to is not None:
                    note += f" Replies use {self.settings.degrade_to} from now on."
                notes.append(note)
                logger.warning("budget {} {}: {:.0f}% spent", scope, period, share)
        return notes

    async def standings(self, person: str | None) -> list[str]:
        """Lines for `/usage` and `/budget`: each period budget that applies to `person`
        (the install's too), spent and left."""
        claims = self.claims(person, "chat")
        got = await self.store.standing([(c.scope, c.period) for c, _, _ in claims])
        lines = []
        for (claim, period, label), standing in zip(claims, got, strict=True):
            cap = claim.cap + standing.raised
            left = max(0.0, cap - standing.spent - standing.held)
            lines.append(
                f"{label[0].upper()}{label[1:]}: ${standing.spent:.2f} of ${cap:.2f} spent, "
                f"${left:.2f} left; resets {_when(period.ends)}"
            )
        s = self.settings
        if s.max_cost is not None:
            lines.append(f"Each turn: at most ${s.max_cost:.2f}")
        if s.max_tokens is not None:
            lines.append(f"Each turn: at most {s.max_tokens:,} tokens")
        return lines

    async def grant(self, target: str, amount: float, daily: bool, by: str) -> str:
        """Raise the budget `target` names ("all", "cron", "heartbeat" or a person's id)
        by `amount` USD for today (`daily`) or this month; what was done."""
        day, month = periods(self.clock(), self.settings.timezone)
        period = day if daily else month
        scope = {"all": INSTALL, "cron": "cron", "heartbeat": "heartbeat"}.get(
            target, PERSON + target
        )
        await self.store.add_raise(scope, period.key, amount, by)
        self._warned.discard((scope, period.key))
        logger.warning("budget {} {} raised by ${:.2f} by {}", scope, period.key, amount, by)
        whose = "everyone's" if scope == INSTALL else f"{target}'s"
        span = "today" if daily else "this month"
        return f"Raised {whose} budget by ${amount:.2f} for {span} (until {_when(period.ends)})."


class TurnSpend:
    """One turn's spend (`run.Spend`): its own caps, and its calls held against the period
    budgets. `notes`: the warnings to send with its reply."""

    def __init__(
        self, budgets: Budgets, person: str | None, source: Source, channel: str | None
    ) -> None:
        self._budgets, self._person, self._source, self._channel = (
            budgets,
            person,
            source,
            channel,
        )
        self.cost = 0.0
        self.tokens = 0
        self.notes: list[str] = []
        self.model: str | None = None  # `degrade_to`, once a budget is past warn_at
        self._hold: tuple[str, list[tuple[Claim, Period, str]]] | None = None

    async def reserve(self, messages: Sequence[Message]) -> str | None:
        budgets, s = self._budgets, self._budgets.settings
        claims = budgets.claims(self._person, self._source)
        self.model = budgets.degraded(claims)
        tokens, cost = budgets.expected(messages, self.model)
        if s.max_tokens is not None and self.tokens + tokens > s.max_tokens:
            return (
                f"I stopped: this turn would pass its limit of {s.max_tokens:,} tokens "
                f"({self.tokens:,} used so far). Send a message to go on."
            )
        if s.max_cost is not None and self.cost + cost > s.max_cost + 1e-12:
            return (
                f"I stopped: this turn would pass its limit of ${s.max_cost:.2f} "
                f"(${self.cost:.4f} spent so far). Send a message to go on."
            )
        if not claims:
            return None
        await budgets.reconcile()
        hold = uuid.uuid4().hex
        if not await budgets.store.reserve(hold, [c for c, _, _ in claims], cost, s.hold):
            return await budgets.refusal(claims, cost, self._channel)
        self._hold = hold, claims
        return None

    async def spent(self, usage: Usage) -> None:
        self.cost += usage.cost
        self.tokens += usage.total_tokens
        held, self._hold = self._hold, None
        if held is None:
            return
        hold, claims = held
        try:
            totals = await self._budgets.store.settle(
                hold, [(c.scope, c.period) for c, _, _ in claims], usage.cost
            )
            self.notes += await self._budgets.note_spend(claims, totals)
        except Exception:  # noqa: BLE001 - the call was made; its hold expires by itself
            logger.exception("could not record the cost of a call against the budgets")

    async def release(self) -> None:
        held, self._hold = self._hold, None
        if held is None:
            return
        try:
            await self._budgets.store.release(held[0], [(c.scope, c.period) for c, _, _ in held[1]])
        except Exception:  # noqa: BLE001 - the hold expires by itself
            logger.exception("could not release a budget hold")


def over_text(label: str, cap: float, standing: Standing, period: Period, who: str) -> str:
    """The reply to a turn over a budget: which, how much was spent, when it resets, who
    can raise it."""
    held = f" (${standing.held:.2f} more held by replies under way)" if standing.held else ""
    return (
        f"Over budget: {label} is ${cap:.2f}, and ${standing.spent:.2f} is spent{held}. "
        f"It resets {_when(period.ends)}. {who}"
    )


def _when(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} {moment.tzname() or ''}".rstrip()
