"""The budgets and prices, built from the config: `budget` and `agent.prices`."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, timedelta

from loguru import logger

from nanobot.agent.budget import Budgets, BudgetSettings, Caps
from nanobot.config import Config
from nanobot.providers.catalog import Prices
from nanobot.providers.provider import Provider
from nanobot.store import Database
from nanobot.store.budgets import BudgetStore

PER_MILLION = 1_000_000
# A call's hold outlives any call: a turn's time limit, and some.
HOLD_MARGIN = timedelta(minutes=5)


def config_prices(config: Config) -> dict[str, Prices]:
    """`agent.prices`, per token."""
    return {
        model: Prices(
            price.input / PER_MILLION,
            price.output / PER_MILLION,
            cached=price.cached / PER_MILLION if price.cached is not None else None,
        )
        for model, price in config.agent.prices.items()
    }


def say_unpriced(provider: Provider, *, loud: bool = True) -> list[str]:
    """Say once, at start, which models have no known price (their cost is shown as
    "price unknown", and no budget can hold their calls); those models. `loud`: as a
    warning (a gateway's start), else at INFO (one message from the terminal, whose
    stderr is its answer's)."""
    unpriced = provider.unpriced()
    for model in unpriced:
        logger.log(
            "WARNING" if loud else "INFO",
            "no price known for {}: its cost is shown as 'price unknown' and budgets count "
            "only what the provider reports (set agent.prices.{} to price it)",
            model,
            model,
        )
    return unpriced


def budget_settings(config: Config) -> BudgetSettings:
    budget = config.budget
    approvers = {name: getattr(config.channels, name).approvers for name in ("telegram", "discord")}
    return BudgetSettings(
        install=Caps(budget.daily, budget.monthly),
        person=Caps(budget.person.daily, budget.person.monthly),
        people={who: Caps(p.daily, p.monthly) for who, p in budget.people.items()},
        max_cost=budget.max_cost,
        max_tokens=budget.max_tokens,
        cron_daily=budget.cron.daily,
        heartbeat_daily=budget.heartbeat.daily,
        warn_at=budget.warn_at,
        degrade_to=budget.degrade_to,
        timezone=zoneinfo.ZoneInfo(config.timezone) if config.timezone else UTC,
        hold=timedelta(seconds=config.agent.max_turn_seconds) + HOLD_MARGIN,
        approvers=approvers,
    )


async def build_budgets(
    config: Config, db: Database, provider: Provider, *, gateway: bool = True
) -> Budgets | None:
    """The budgets, where any cap is set (None: no call is checked); the holds that
    crashed processes left are dropped first. The models with no known price are said
    (a warning for a `gateway`)."""
    say_unpriced(provider, loud=gateway)
    if not config.budget.configured:
        return None
    budgets = Budgets(
        BudgetStore(db),
        budget_settings(config),
        price=provider.price,
        count=provider.count_tokens,
        model=provider.model,
        max_tokens=config.agent.max_tokens,
    )
    await budgets.reconcile()
    return budgets
