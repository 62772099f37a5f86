"""The composition root: builds nanobot's parts from the Config and wires them together.

The only package that knows every other one: the provider and its transports, the sandbox
and the tools (exec's setup in `_exec`), the store, the journal, the approver and the agent
loop (`open_parts`, in `_parts`), the way in (`Intake`), subagents, channels and the gateway
(`build_gateway`). Each part is built complete, in order, from what it needs; where two need
each other, a typed port built first says so (`LateWatcher`, `LateSpawner`). How each of
them is run (`agent -m`, a terminal chat, the gateway) is `nanobot.launch`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from loguru import logger

from nanobot import cluster, log
from nanobot.agent.dispatcher import Dispatcher, OutcomeSink
from nanobot.agent.held import Held
from nanobot.agent.run import ToolPolicy
from nanobot.agent.subagents import EveryTool, Subagents, SubagentSettings
from nanobot.agent.taint import Ledger
from nanobot.app._channels import build_channels, channel_rules, check_channels
from nanobot.app._exec import (
    build_sandbox,
    describe_limits,
    describe_sandbox,
    exec_limits,
    open_sandbox,
)
from nanobot.app._mcp import start_when_quiet, test_server
from nanobot.app._media import build_speaker, build_voices
from nanobot.app._parts import (
    Parts,
    build_tools,
    cluster_setting,
    open_parts,
    private_dir,
    timezone,
)
from nanobot.app._provider import build_provider
from nanobot.bus.events import ChatRef, Source
from nanobot.bus.intake import EventIntake
from nanobot.bus.queue import MessageBus
from nanobot.channels.health import FILE as CHANNELS_FILE
from nanobot.channels.health import ChannelHealth
from nanobot.channels.manager import ChannelManager
from nanobot.channels.terminal import TerminalChannel
from nanobot.cluster import SCHEDULE
from nanobot.config import Config
from nanobot.cron.service import CronService
from nanobot.gate import ChannelRules, Entry, Gate
from nanobot.gateway import Gateway
from nanobot.heartbeat import Heartbeat
from nanobot.providers.provider import Provider
from nanobot.store import Access, Journal, UsageLedger
from nanobot.store.cron import CronStore
from nanobot.store.taint import TaintStore
from nanobot.store.wakeups import CRON_CHANGED, Listener

__all__ = [
    "EVERYONE",
    "Intake",
    "Parts",
    "build_gateway",
    "build_provider",
    "build_sandbox",
    "build_tools",
    "describe_limits",
    "describe_sandbox",
    "exec_limits",
    "open_parts",
    "open_sandbox",
    "private_dir",
    "test_server",
]

JOURNAL_KEEP = timedelta(days=7)  # how long answered messages are remembered, for dedupe


def build_subagents(config: Config, parts: Parts, intake: EventIntake) -> Subagents:
    """Background tasks for the gateway, bound to the spawn tool's port (`parts.spawner`;
    none when `agent.max_subagents` is 0); their results come back in through `intake`."""
    agent = config.agent
    subagents = Subagents(
        parts.runner,
        parts.sessions,
        intake,
        SubagentSettings(
            max_subagents=agent.max_subagents,
            max_iterations=agent.subagent_max_iterations,
            max_seconds=agent.subagent_max_seconds,
            tools=EveryTool(exec=agent.subagent_exec and "exec" in parts.tools),
            policy=ToolPolicy(
                max_parallel=agent.max_parallel_tools, max_calls_per_run=agent.max_tool_calls
            ),
            timezone=timezone(config),
        ),
        usage=UsageLedger(parts.db),
        model=agent.model,
        budgets=parts.loop.budgets,
        approver=parts.approver,
        persons=parts.persons,
    )
    if parts.spawner is not None:
        parts.spawner.bind(subagents)
    return subagents


EVERYONE = ChannelRules(frozenset({"*"}))  # the person at this machine's own terminal


@dataclass(frozen=True)
class Intake:
    """The way in, built on the parts: bus, journal and gate."""

    bus: MessageBus
    journal: Journal
    gate: Gate

    @classmethod
    async def build(
        cls,
        parts: Parts,
        rules: dict[str, ChannelRules],
        *,
        entry: Entry | None = None,
    ) -> Intake:
        """`entry`: see `Gate`."""
        bus, journal = parts.bus, parts.journal
        pruned = await journal.prune(JOURNAL_KEEP)
        if pruned:
            logger.debug("pruned {} finished journal rows", pruned)
        await parts.approver.recover(alone=entry is None)  # before any turn resumes
        gate = Gate(rules, Access(parts.db), journal, bus, entry=entry, retry=parts.retry)
        parts.failures.bind(gate)  # any write failing for want of storage stops intake
        return cls(bus, journal, gate)


async def build_gateway(config: Config, parts: Parts, *, terminal: bool) -> Gateway:
    """The gateway on `parts`: the enabled channels (and the terminal, when attached), the
    dispatcher, subagents, the heartbeat and cron, all coming in through one gate. Without
    a terminal, it stops once every channel has stopped for good (`all_refused`).

    It is a member of the cluster on its store: a channel's polling or gateway connection,
    and the schedule (cron and the heartbeat), run while it holds their roles
    (`nanobot.cluster.roles`); on its own it takes every role at once. `parts` are a
    gateway's (`open_parts(gateway=True)`: its membership, and the spawn tool).

    Raises:
        ConfigError: see `check_channels`.
        ValueError: `parts` were not opened for a gateway.
    """
    if parts.enrolment is None:
        raise ValueError("the gateway is built on a gateway's parts: open_parts(gateway=True)")
    check_channels(config, terminal=terminal)
    rules = channel_rules(config)
    if terminal:
        rules[TerminalChannel.name] = EVERYONE
    part = cluster.join(
        cluster_setting(config),
        parts.enrolment,
        parts.db,
        parts.journal,
        parts.bus,
        approvals=parts.approver,
        channels=rules,
    )
    distributor, roles = part.distributor, part.roles
    way_in = await Intake.build(parts, rules, entry=distributor)
    people = parts.persons.people if parts.persons is not None else None
    channels = build_channels(config, way_in.gate, way_in.journal, cluster=roles, people=people)
    if not channels:
        logger.warning(
            "no chat channel is enabled, only this terminal: set channels.telegram or "
            "channels.discord (enabled, token, allow_from) in the config"
        )
    console = TerminalChannel(way_in.gate, own_interrupts=False) if terminal else None
    if console is not None:
        channels.append(console)
    subagents = build_subagents(config, parts, way_in.gate)
    services: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]
    services = [("subagents", subagents.run), ("fallbacks", partial(_fallbacks, parts.provider))]
    scheduled: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = []
    heard: dict[str, Listener] = {}  # what the cluster's wake-ups tell parts built here
    outcomes: dict[Source, OutcomeSink] = {}
    beat = config.heartbeat
    if beat.enabled:
        target = beat.deliver_to
        heartbeat = Heartbeat(
            config.workspace_path / "HEARTBEAT.md",
            beat.interval_minutes * 60,
            way_in.gate,
            ChatRef(target.channel, target.chat_id) if target else None,
            ledger=Ledger(TaintStore(parts.db), config.workspace_path),
        )
        scheduled.append(("heartbeat", heartbeat.run))
        outcomes["heartbeat"] = heartbeat
    if config.cron.enabled:
        cron = CronService(
            CronStore(parts.db),
            way_in.gate,
            catch_up_window=config.cron.catch_up_window,
            channels=[n for n in ("telegram", "discord") if getattr(config.channels, n).enabled],
            retry=parts.retry,
        )
        scheduled.append(("cron", cron.run))
        outcomes["cron"] = cron
        heard[CRON_CHANGED] = lambda _: cron.changed()  # by another member: look at once
    listening = cluster.listening(part, heard)  # last: it calls into the parts above
    if listening is not None:
        services.append(("wake-ups", listening.run))
    if scheduled:  # one member of the cluster at a time schedules
        schedule = partial(_together, scheduled)
        services.append((SCHEDULE, partial(roles.role(SCHEDULE).hold, schedule)))
    dispatcher = Dispatcher(
        parts.loop,
        way_in.bus,
        way_in.journal,
        subagents=subagents,
        outcomes=outcomes,
        whole_replies=[
            n for n in ("telegram", "discord") if not getattr(config.channels, n).stream
        ],
        held=Held(way_in.gate, way_in.journal),
        reader=parts.reader,
        voices=build_voices(config, parts.db),
        recall=parts.recall,
    )
    # In the data dir, for `nanobot status` (this gateway's own: each member of a cluster has one).
    health = ChannelHealth(
        [c.name for c in channels],
        config.data_dir / CHANNELS_FILE,
        lambda: datetime.now(UTC),
        log.redact,
    )
    manager = ChannelManager(
        channels, way_in.bus, way_in.journal, health, voices=build_speaker(config)
    )
    if parts.servers:

        def tried() -> bool:  # each channel connected, or failed, once
            return all(state.up or state.reason for state in health.states())

        def busy() -> bool:
            return dispatcher.running > 0

        services.append(("mcp", partial(start_when_quiet, parts.servers, tried, busy)))
    return Gateway(
        bus=way_in.bus,
        gate=way_in.gate,
        dispatcher=dispatcher,
        manager=manager,
        shutdown_timeout=config.gateway.shutdown_timeout,
        until=console.ended if console is not None else manager.all_refused,
        services=services,
        membership=part.membership,
        distributor=distributor,
    )


async def _fallbacks(provider: Provider) -> None:
    """Load what the fallback models need (litellm, for one that goes through it) while
    the gateway already answers: a direct reply waits for no import. A failure here is
    logged, not fatal: a fallback's call says again what is wrong with it."""
    try:
        await asyncio.to_thread(provider.prepare_fallbacks)
    except Exception:  # noqa: BLE001 - the task's boundary; the primary model still answers
        logger.exception("could not prepare the fallback models")


async def _together(
    services: Sequence[tuple[str, Callable[[], Coroutine[Any, Any, None]]]],
) -> None:
    """Run `services` side by side until cancelled (or one fails)."""
    async with asyncio.TaskGroup() as group:
        for name, start in services:
            group.create_task(start(), name=name)
