"""The composition root: builds nanobot's parts from the Config and wires them together.

The only package that knows every other one: the provider and its transports, the sandbox
and the tools (exec's setup in `_exec`), the store and the agent loop (`open_parts`), the
way in (`Intake`), the approver, subagents, channels and the gateway (`build_gateway`).
How each of them is run
(`agent -m`, a terminal chat, the gateway) is `nanobot.launch`'s.
"""

from __future__ import annotations

import asyncio
import stat
import zoneinfo
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta, tzinfo
from functools import partial
from pathlib import Path
from typing import Any

from loguru import logger

from nanobot import cluster
from nanobot.agent.approvals import ApprovalPolicy
from nanobot.agent.approver import Approver
from nanobot.agent.context import ContextBuilder
from nanobot.agent.dispatcher import Dispatcher, OutcomeSink
from nanobot.agent.held import Held
from nanobot.agent.loop import AgentLoop, LoopSettings
from nanobot.agent.prompt_budget import PromptBudget
from nanobot.agent.run import LoopLimits, ToolPolicy
from nanobot.agent.runner import Runner
from nanobot.agent.subagents import Subagents, SubagentSettings, subagent_tools
from nanobot.agent.taint import Ledger
from nanobot.app._channels import build_channels, channel_rules, check_channels
from nanobot.app._exec import (
    build_reserve,
    build_sandbox,
    describe_limits,
    describe_sandbox,
    exec_limits,
    open_sandbox,
)
from nanobot.app._provider import build_provider
from nanobot.bus.events import ChatRef, Source
from nanobot.bus.intake import EventIntake
from nanobot.bus.queue import MessageBus
from nanobot.channels.manager import ChannelManager
from nanobot.channels.terminal import TerminalChannel
from nanobot.cluster import SCHEDULE
from nanobot.cluster.agreement import agreement
from nanobot.config import Config, exposed
from nanobot.cron.jobs import Jobs
from nanobot.cron.service import CronService
from nanobot.gate import ChannelRules, Entry, Gate
from nanobot.gateway import Gateway
from nanobot.heartbeat import Heartbeat
from nanobot.outage import DEFAULT_BACKOFF, Backoff
from nanobot.providers.provider import Provider
from nanobot.reserve import DiskReserve
from nanobot.store import Access, ApprovalStore, Database, Journal, SessionStore, UsageLedger
from nanobot.store.cron import CronStore
from nanobot.store.taint import TaintStore
from nanobot.store.wakeups import CRON_CHANGED
from nanobot.tools.cron import CronTool
from nanobot.tools.filesystem import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from nanobot.tools.limits import NO_LIMITS, Enforcement, enforce, log_enforcement
from nanobot.tools.message import MessageTool
from nanobot.tools.registry import ToolRegistry
from nanobot.tools.sandbox import Sandbox
from nanobot.tools.shell import DEFAULT_DENY_PATTERNS, ExecTool
from nanobot.tools.spawn import SpawnTool
from nanobot.tools.taint import TaintLedger
from nanobot.tools.web import WebFetchTool, WebSearchTool
from nanobot.workspace import copy_template

__all__ = [
    "EVERYONE",
    "Intake",
    "Parts",
    "build_gateway",
    "build_provider",
    "build_sandbox",
    "describe_limits",
    "describe_sandbox",
    "exec_limits",
    "open_parts",
    "open_sandbox",
    "private_dir",
]

JOURNAL_KEEP = timedelta(days=7)  # how long answered messages are remembered, for dedupe


def _timezone(config: Config) -> tzinfo | None:
    return zoneinfo.ZoneInfo(config.timezone) if config.timezone else None


def build_tools(
    config: Config,
    jobs: Jobs | None = None,
    sandbox: Sandbox | None = None,
    *,
    limits: Enforcement | None = None,
    reserve: DiskReserve | None = None,
    ledger: TaintLedger | None = None,
) -> ToolRegistry:
    """The built-in tools, configured from `config.tools` (and `cron` when `jobs` is given).

    exec is registered when it is enabled and `sandbox` is given (see `build_sandbox`); its
    commands run under `limits` (`enforce`; none when not given) and stop when the data
    volume's free space falls short of `reserve`. The file tools and exec follow taint
    through `ledger` when it is given."""
    tools, workspace = config.tools, config.workspace_path
    restrict = tools.restrict_to_workspace
    registry = ToolRegistry(
        [
            ReadFileTool(workspace, restrict=restrict, ledger=ledger),
            WriteFileTool(workspace, restrict=restrict, ledger=ledger),
            EditFileTool(workspace, restrict=restrict, ledger=ledger),
            ListDirTool(workspace, restrict=restrict),
            WebSearchTool(tools.web.search_api_key.get_secret_value() or None),
            WebFetchTool(
                max_bytes=tools.web.fetch_max_bytes,
                timeout=tools.web.fetch_timeout,
                allow_hosts=tools.web.fetch_allow_hosts,
            ),
            MessageTool(),
        ]
    )
    if tools.exec.enabled and sandbox is not None:
        deny = tools.exec.deny_patterns
        registry.register(
            ExecTool(
                workspace,
                sandbox=sandbox,
                timeout=tools.exec.timeout,
                deny_patterns=DEFAULT_DENY_PATTERNS if deny is None else deny,
                limits=limits or NO_LIMITS,
                reserve=reserve,
                ledger=ledger,
            )
        )
    if jobs is not None and config.cron.enabled:
        deliverable = [n for n in ("telegram", "discord") if getattr(config.channels, n).enabled]
        registry.register(CronTool(jobs, deliverable=deliverable))
    return registry


@dataclass(frozen=True)
class Parts:
    """What a running nanobot is made of, built once from the config."""

    db: Database
    loop: AgentLoop
    jobs: Jobs
    runner: Runner
    tools: ToolRegistry
    sessions: SessionStore
    bus: MessageBus
    journal: Journal
    approver: Approver
    provider: Provider
    sandbox: Sandbox | None = None  # exec's, when exec is on
    retry: Backoff = DEFAULT_BACKOFF  # store.retry_seconds: the pauses of a failing store


def private_dir(path: Path) -> None:
    """Make `path` a directory only its owner can enter (0700): created so, or with group and
    others' access taken away if it exists with any. The data dir holds the state database,
    the logs and the workspace."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        path.chmod(mode & 0o700)


@asynccontextmanager
async def open_parts(config: Config, *, require_key: bool = True) -> AsyncIterator[Parts]:
    """Everything a turn needs, built from `config`. `require_key` False lets a gateway
    start without the model's API key (warned about; replies fail until it is set)."""
    private_dir(config.data_dir)
    if (exposure := exposed(config)) is not None:
        logger.warning(exposure)
    copy_template(config.workspace_path)
    agent = config.agent
    settings = LoopSettings(
        max_tokens=agent.max_tokens,
        max_concurrent_turns=agent.max_concurrent_turns,
        limits=LoopLimits(
            max_iterations=agent.max_iterations,
            max_tool_rounds=agent.max_tool_rounds,
            max_run_duration=agent.max_turn_seconds,
        ),
        policy=ToolPolicy(
            max_parallel=agent.max_parallel_tools, max_calls_per_run=agent.max_tool_calls
        ),
        queue_mode=agent.queue_mode,
        steering_delivery=agent.steering_delivery,
        follow_up_delivery=agent.follow_up_delivery,
        timezone=_timezone(config),
    )
    budget = PromptBudget(config.agent.prompt_file_chars, config.agent.prompt_total_chars)
    context = ContextBuilder(config.workspace_path, timezone=settings.timezone, budget=budget)
    limits, reserve = None, build_reserve(config)
    if reserve is not None:
        await asyncio.to_thread(reserve.restore)  # before the sandbox, which hides it
    provider = build_provider(config)
    try:
        async with open_sandbox(config) as sandbox:
            if sandbox is not None:
                limits = await asyncio.to_thread(
                    partial(enforce, exec_limits(config), confined=sandbox.confined)
                )
                log_enforcement(limits)
            await asyncio.to_thread(partial(provider.prepare, require_key=require_key))
            async with await Database.open(config.store_target, reserve=reserve) as db:
                jobs = Jobs(CronStore(db), config.timezone)
                ledger = Ledger(TaintStore(db), config.workspace_path)
                tools = build_tools(
                    config, jobs, sandbox, limits=limits, reserve=reserve, ledger=ledger
                )
                runner = Runner(provider, tools)
                sessions = SessionStore(db)
                bus, journal = MessageBus(), Journal(db)
                approver = build_approver(config, db, journal, bus)
                loop = AgentLoop(
                    provider,
                    runner,
                    sessions,
                    context,
                    settings,
                    usage=UsageLedger(db),
                    approver=approver,
                    ledger=ledger,
                )
                yield Parts(
                    db,
                    loop,
                    jobs,
                    runner,
                    tools,
                    sessions,
                    bus,
                    journal,
                    approver,
                    provider,
                    sandbox,
                    config.store.retry,
                )
    finally:
        await provider.aclose()
        if limits is not None:
            await asyncio.to_thread(limits.close)


def build_approver(config: Config, db: Database, journal: Journal, bus: MessageBus) -> Approver:
    """Who asks before risky tool calls, as `tools.approval` and each channel's `approvers`
    say; its cards go out through `journal` and `bus`."""
    approval = config.tools.approval
    policy = ApprovalPolicy(
        tools=approval.policies(),
        other=approval.other,
        timeout=approval.timeout,
        unattended=approval.unattended,
    )
    approvers = {name: getattr(config.channels, name).approvers for name in ("telegram", "discord")}
    return Approver(
        ApprovalStore(db), policy, approvers, journal, bus, workspace=config.workspace_path
    )


def build_subagents(config: Config, parts: Parts, intake: EventIntake) -> Subagents:
    """Background tasks for the gateway, and the spawn tool that starts them (unless
    `agent.max_subagents` is 0); their results come back in through `intake`."""
    agent = config.agent
    subagents = Subagents(
        parts.runner,
        parts.sessions,
        intake,
        SubagentSettings(
            max_subagents=agent.max_subagents,
            max_iterations=agent.subagent_max_iterations,
            max_seconds=agent.subagent_max_seconds,
            tools=subagent_tools(parts.tools.names, allow_exec=agent.subagent_exec),
            policy=ToolPolicy(
                max_parallel=agent.max_parallel_tools, max_calls_per_run=agent.max_tool_calls
            ),
            timezone=_timezone(config),
        ),
        usage=UsageLedger(parts.db),
        model=agent.model,
        approver=parts.approver,
    )
    if agent.max_subagents > 0:
        parts.tools.register(SpawnTool(subagents))
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
        parts.db.watch(gate)  # any write failing for want of storage stops intake
        return cls(bus, journal, gate)


async def build_gateway(
    config: Config, parts: Parts, *, terminal: bool, succeeds: str | None = None
) -> Gateway:
    """The gateway on `parts`: the enabled channels (and the terminal, when attached), the
    dispatcher, subagents, the heartbeat and cron, all coming in through one gate. Without
    a terminal, it stops once every channel has stopped for good (`all_refused`).

    It is a member of the cluster on its store: a channel's polling or gateway connection,
    and the schedule (cron and the heartbeat), run while it holds their roles
    (`nanobot.cluster.roles`); on its own it takes every role at once. `succeeds`: the member id
    of the gateway that ran on this data dir before (gone: its roles are taken at once).

    Raises:
        ConfigError: see `check_channels`.
    """
    check_channels(config, terminal=terminal)
    rules = channel_rules(config)
    if terminal:
        rules[TerminalChannel.name] = EVERYONE
    part = cluster.join(
        _cluster_setting(config, parts),
        parts.db,
        parts.journal,
        parts.bus,
        parts.approver,
        channels=rules,
        succeeds=succeeds,
    )
    distributor, roles = part.distributor, part.roles
    way_in = await Intake.build(parts, rules, entry=distributor)
    channels = build_channels(config, way_in.gate, way_in.journal, cluster=roles)
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
        if distributor is not None:  # a job changed by another member: look at once
            distributor.wakeups.listen(CRON_CHANGED, lambda _: cron.changed())
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
    )
    manager = ChannelManager(channels, way_in.bus, way_in.journal)
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


def _cluster_setting(config: Config, parts: Parts) -> cluster.Setting:
    """What the cluster reads of the config (`nanobot.cluster.join`)."""
    target = config.store_target
    return cluster.Setting(
        lease=config.cluster.lease,
        shared_url=target if isinstance(target, str) else None,
        workspace=str(config.workspace_path.resolve()),
        agreement=agreement(config),
        retry=parts.retry,
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
