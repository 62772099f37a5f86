"""`/usage` and `/budget`: what a person spent and has left, and an approver's raise."""

from __future__ import annotations

import math
from datetime import datetime, time

from nanobot.agent.loop import AgentLoop
from nanobot.bus.events import InboundMessage
from nanobot.store import UsageTotals

RAISE_USAGE = (
    "Say /budget raise USD today|month [ID|all|cron|heartbeat], e.g. /budget raise 5 today "
    "(all: the install's budget, the default; an ID: that person's)."
)


def is_approver(loop: AgentLoop, message: InboundMessage) -> bool:
    """Whether the sender of `message` is one of its channel's approvers."""
    channel, sender = message.chat.channel, message.sender_id
    if loop.budgets is not None:
        return sender in loop.budgets.settings.approvers.get(channel, ())
    return loop.approver is not None and loop.approver.is_approver(channel, sender)


async def usage_command(message: InboundMessage, loop: AgentLoop) -> str:
    """`/usage`: the sender's spend today and this month, the model, what is left of the
    budgets that apply; an approver sees the install's totals too."""
    usage, budgets = loop.usage, loop.budgets
    if usage is None:
        return "Usage is not recorded here."
    now = loop.now()
    today = datetime.combine(now.date(), time(0), now.tzinfo)
    month = today.replace(day=1)
    person = message.sender_id
    lines = [f"Model: {loop.model}"]
    for span, since in (("today", today), ("this month", month)):
        totals = await usage.totals(since=since, person=person)
        lines.append(f"You, {span}: {spend_text(totals)}")
    if budgets is not None:
        lines += await budgets.standings(person)
    if is_approver(loop, message):
        for span, since in (("today", today), ("this month", month)):
            lines.append(f"Everyone, {span}: {spend_text(await usage.totals(since=since))}")
    return "\n".join(lines)


async def budget_command(message: InboundMessage, loop: AgentLoop) -> str:
    """`/budget`: the budgets and where they stand; `/budget raise USD today|month
    [target]`, for approvers only, raises one at once (kept in the store, logged)."""
    budgets = loop.budgets
    if budgets is None:
        return "No budgets are set (the `budget` section of the config)."
    words = message.text.split()[1:]
    if not words:
        lines = await budgets.standings(message.sender_id)
        return "\n".join(lines or ["No period budgets apply to you."])
    if not is_approver(loop, message):
        return f"Only an approver can raise a budget. {budgets.who_raises(message.chat.channel)}"
    amount = _amount(words)
    if amount is None:
        return RAISE_USAGE
    target = words[3].lstrip("@") if len(words) == 4 else "all"
    by = f"{message.chat.channel}:{message.sender_id}"
    return await budgets.grant(target, amount, words[2].lower() == "today", by)


def _amount(words: list[str]) -> float | None:
    """The amount of `raise USD today|month [target]`; None: not such words."""
    if words[0].lower() != "raise" or len(words) not in (3, 4):
        return None
    if words[2].lower() not in ("today", "month"):
        return None
    try:
        amount = float(words[1].lstrip("$"))
    except ValueError:
        return None
    return amount if 0 < amount < math.inf else None


def spend_text(totals: UsageTotals) -> str:
    """A spend as a person reads it; a cost never shown as 0 where a price was unknown."""
    turns = f"{totals.runs} turn{'' if totals.runs == 1 else 's'}"
    cost = f"${totals.cost:.4f}"
    if totals.unpriced:
        cost = "price unknown" if totals.unpriced == totals.runs else f"{cost} + price unknown"
    return f"{cost} ({turns}, {totals.tokens:,} tokens)"
