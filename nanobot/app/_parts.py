"""The parts every way of running nanobot is made of (`open_parts`): the provider, the
sandbox and the tools, the store, the journal, the approver and the agent loop, built in
that order, each complete from the ones before it.
"""

from __future__ import annotations

import asyncio
import stat
import zoneinfo
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import tzinfo
from functools import partial
from pathlib import Path
from typing import Any

from loguru import logger

from nanobot import cluster
from nanobot.agent.approvals import ApprovalPolicy, ToolRules, no_rules
from nanobot.agent.approver import Approver
from nanobot.agent.context import ContextBuilder
from nanobot.agent.loop import AgentLoop, LoopSettings
from nanobot.agent.persons import Persons
from nanobot.agent.prompt_budget import PromptBudget
from nanobot.agent.run import LoopLimits, ToolPolicy
from nanobot.agent.runner import Runner
from nanobot.agent.taint import Ledger
from nanobot.app._budget import build_budgets
from nanobot.app._exec import build_reserve, exec_limits, open_sandbox
from nanobot.app._media import build_reader
from nanobot.app._people import open_persons
from nanobot.app._provider import build_provider
from nanobot.bus.queue import MessageBus
from nanobot.cluster.agreement import agreement
from nanobot.config import Config, exposed
from nanobot.cron.jobs import Jobs
from nanobot.mcp.servers import FILE as MCP_FILE
from nanobot.mcp.servers import McpServers
from nanobot.mcp.settings import ServerSettings
from nanobot.media.reading import Reader
from nanobot.outage import DEFAULT_BACKOFF, Backoff
from nanobot.people import PEOPLE_DIR
from nanobot.providers.provider import Provider
from nanobot.reserve import DiskReserve
from nanobot.store import ApprovalStore, Database, Journal, SessionStore, UsageLedger
from nanobot.store.cron import CronStore
from nanobot.store.failures import LateWatcher
from nanobot.store.search import SearchIndex
from nanobot.store.taint import TaintStore
from nanobot.store.wakeups import Wakeups
from nanobot.tasks import TaskSet
from nanobot.tools.base import Tool
from nanobot.tools.cron import CronTool
from nanobot.tools.filesystem import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from nanobot.tools.limits import NO_LIMITS, Enforcement, enforce, log_enforcement
from nanobot.tools.memory_search import MemoryGetTool, MemoryRecall, MemorySearchTool
from nanobot.tools.message import MessageTool
from nanobot.tools.registry import ToolRegistry, ToolSource
from nanobot.tools.sandbox import Sandbox
from nanobot.tools.shell import DEFAULT_DENY_PATTERNS, ExecTool
from nanobot.tools.spawn import LateSpawner, Spawner, SpawnTool
from nanobot.tools.taint import TaintLedger
from nanobot.tools.web import WebFetchTool, WebSearchTool
from nanobot.workspace import copy_template


def timezone(config: Config) -> tzinfo | None:
    return zoneinfo.ZoneInfo(config.timezone) if config.timezone else None


def build_tools(
    config: Config,
    jobs: Jobs | None = None,
    sandbox: Sandbox | None = None,
    *,
    limits: Enforcement | None = None,
    reserve: DiskReserve | None = None,
    ledger: TaintLedger | None = None,
    spawner: Spawner | None = None,
    source: ToolSource | None = None,
    recall: MemoryRecall | None = None,
) -> ToolRegistry:
    """The built-in tools, configured from `config.tools` (and `cron` when `jobs` is given),
    then what `source` offers (the MCP servers' tools, as they come and go).

    exec is registered when it is enabled and `sandbox` is given (see `build_sandbox`); its
    commands run under `limits` (`enforce`; none when not given) and stop when the data
    volume's free space falls short of `reserve`. The file tools and exec follow taint
    through `ledger` when it is given. memory_search and memory_get come with `recall`. The
    spawn tool comes last, when `spawner` is given."""
    tools, workspace = config.tools, config.workspace_path
    restrict = tools.restrict_to_workspace
    built: list[Tool[Any]] = [
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
    if recall is not None:
        built += [MemorySearchTool(recall), MemoryGetTool(recall)]
    if tools.exec.enabled and sandbox is not None:
        deny = tools.exec.deny_patterns
        built.append(
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
        built.append(CronTool(jobs, deliverable=deliverable))
    if spawner is not None:
        built.append(SpawnTool(spawner))
    return ToolRegistry(built, source)


def mcp_settings(config: Config) -> list[ServerSettings]:
    """`mcp.servers` as the MCP client takes it (the secrets' values in the clear)."""
    return [
        ServerSettings(
            name,
            command=server.command,
            args=tuple(server.args),
            env={key: value.get_secret_value() for key, value in server.env.items()},
            cwd=server.cwd,
            url=server.url,
            headers={key: value.get_secret_value() for key, value in server.headers.items()},
            tools=tuple(server.tools) if server.tools is not None else None,
            timeout=server.timeout,
            startup_timeout=server.startup_timeout,
            approval=server.approval,
            approval_tools=dict(server.approval_tools),
            sandbox=server.sandbox,
            trust_annotations=server.trust_annotations,
            enabled=server.enabled,
        )
        for name, server in config.mcp.servers.items()
    ]


def build_servers(config: Config, sandbox: Sandbox | None, *, gateway: bool) -> McpServers:
    """The MCP servers of `config.mcp`, to be started; a gateway keeps their states in its
    data dir for `nanobot mcp list` and `status`."""
    return McpServers(
        mcp_settings(config),
        workspace=config.workspace_path,
        sandbox=sandbox,
        hiding=mcp_hiding(config),
        other=config.tools.approval.other,
        state_file=config.data_dir / MCP_FILE if gateway else None,
    )


def mcp_hiding(config: Config) -> tuple[Path, ...]:
    """The workspace's folders MCP servers do not see: people's own (`people/`), unless
    everyone shares the workspace by the config's word (`people.isolation: shared`; without
    the key a store may choose either, and an empty `people/` hidden costs nothing). A
    server is shared by everyone, so it sees no one's folder."""
    return () if config.people.isolation == "shared" else (Path(PEOPLE_DIR),)


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
    # Told of the store's storage failures, bound to the gate once it is built (`Intake`).
    failures: LateWatcher
    sandbox: Sandbox | None = None  # exec's, when exec is on (or an MCP server needs it)
    # The MCP servers: started with the parts, or a gateway's once it has answered
    # (`start_when_quiet`).
    servers: McpServers | None = None
    retry: Backoff = DEFAULT_BACKOFF  # store.retry_seconds: the pauses of a failing store
    # A gateway's: its membership of the cluster, and the spawn tool's port, bound to the
    # subagents once they are built (None without `agent.max_subagents`).
    enrolment: cluster.Enrolment | None = None
    spawner: LateSpawner | None = None
    reader: Reader | None = None  # what reads the files people send (voice, documents)
    recall: MemoryRecall | None = None  # the memory search, for `/search`
    persons: Persons | None = None  # whom turns run as (`people`), for `/search` and the inbox


@asynccontextmanager
async def memory_recall(
    db: Database, workspace: Path, zone: tzinfo | None, retry: Backoff = DEFAULT_BACKOFF
) -> AsyncIterator[MemoryRecall]:
    """The memory search over `db` and `workspace`; while it is open, the entries from before
    the index are indexed in the background (`SearchIndex.backfill_all`, a failing store
    tried again after `retry`'s pauses)."""
    index = SearchIndex(db)
    background = TaskSet("memory-search")
    background.spawn(index.backfill_all(retry=retry), name="memory-search-backfill")
    try:
        yield MemoryRecall(index, workspace, zone)
    finally:
        await background.close()


def private_dir(path: Path) -> None:
    """Make `path` a directory only its owner can enter (0700): created so, or with group and
    others' access taken away if it exists with any. The data dir holds the state database,
    the logs and the workspace."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        path.chmod(mode & 0o700)


def cluster_setting(config: Config) -> cluster.Setting:
    """What the cluster reads of the config (`nanobot.cluster`)."""
    target = config.store_target
    return cluster.Setting(
        lease=config.cluster.lease,
        shared_url=target if isinstance(target, str) else None,
        workspace=str(config.workspace_path.resolve()),
        agreement=agreement(config),
        retry=config.store.retry,
    )


@asynccontextmanager
async def open_parts(
    config: Config,
    *,
    require_key: bool = True,
    gateway: bool = False,
    succeeds: str | None = None,
) -> AsyncIterator[Parts]:
    """Everything a turn needs, built from `config`. `require_key` False lets a gateway
    start without the model's API key (warned about; replies fail until it is set).

    `gateway`: the parts of a gateway (`build_gateway`): a member of the cluster on its
    store (`cluster.enrol`; `succeeds`: the member id of the gateway that ran on this data
    dir before), whose journal queues its replies as that member's and whose approver tells
    the other members of its decisions; with the spawn tool, unless `agent.max_subagents` is
    0. Not a gateway (one message, a terminal chat): neither."""
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
        timezone=timezone(config),
    )
    budget = PromptBudget(config.agent.prompt_file_chars, config.agent.prompt_total_chars)
    context = ContextBuilder(config.workspace_path, timezone=settings.timezone, budget=budget)
    limits, reserve = None, build_reserve(config)
    if reserve is not None:
        await asyncio.to_thread(reserve.restore)  # before the sandbox, which hides it
    provider = build_provider(config)
    failures = LateWatcher()
    spawner = LateSpawner() if gateway and agent.max_subagents > 0 else None
    try:
        async with open_sandbox(config) as sandbox:
            if sandbox is not None:
                limits = await asyncio.to_thread(
                    partial(enforce, exec_limits(config), confined=sandbox.confined)
                )
                log_enforcement(limits)
            await asyncio.to_thread(partial(provider.prepare, require_key=require_key))
            target = config.store_target
            db_opened = await Database.open(target, reserve=reserve, watch=failures)
            async with (
                db_opened as db,
                memory_recall(
                    db, config.workspace_path, settings.timezone, config.store.retry
                ) as recall,
            ):
                setting = cluster_setting(config)
                enrolment = cluster.enrol(setting, db, succeeds=succeeds) if gateway else None
                jobs = Jobs(CronStore(db), config.timezone)
                persons = await open_persons(config, db, context, budget, settings.timezone)
                ledger = Ledger(TaintStore(db), config.workspace_path)
                servers = build_servers(config, sandbox, gateway=gateway)
                tools = build_tools(
                    config,
                    jobs,
                    sandbox,
                    limits=limits,
                    reserve=reserve,
                    ledger=ledger,
                    spawner=spawner,
                    source=servers if servers else None,
                    recall=recall,
                )
                runner = Runner(provider, tools)
                sessions = SessionStore(db)
                sender = None if enrolment is None else enrolment.sender
                bus, journal = MessageBus(), Journal(db, member=sender)
                wakeups = None if enrolment is None else enrolment.wakeups
                approver = build_approver(
                    config, db, journal, bus, wakeups=wakeups, rules=servers.rule
                )
                loop = AgentLoop(
                    provider,
                    runner,
                    sessions,
                    context,
                    settings,
                    usage=UsageLedger(db),
                    approver=approver,
                    ledger=ledger,
                    budgets=await build_budgets(config, db, provider, gateway=gateway),
                    persons=persons,
                )
                if not gateway:  # a gateway starts them once it has answered (`start_when_quiet`)
                    servers.start()
                try:
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
                        failures,
                        sandbox,
                        servers,
                        config.store.retry,
                        enrolment,
                        spawner,
                        build_reader(config),
                        recall,
                        persons,
                    )
                finally:
                    await servers.close()
    finally:
        await provider.aclose()
        if limits is not None:
            await asyncio.to_thread(limits.close)


def build_approver(
    config: Config,
    db: Database,
    journal: Journal,
    bus: MessageBus,
    *,
    wakeups: Wakeups | None = None,
    rules: ToolRules = no_rules,
) -> Approver:
    """Who asks before risky tool calls, as `tools.approval` (and `rules`, the MCP servers'
    own) and each channel's `approvers` say; its cards go out through `journal` and `bus`,
    its decisions to the other members of a cluster through `wakeups`."""
    approval = config.tools.approval
    policy = ApprovalPolicy(
        tools=approval.policies(),
        other=approval.other,
        timeout=approval.timeout,
        unattended=approval.unattended,
        rules=rules,
    )
    approvers = {name: getattr(config.channels, name).approvers for name in ("telegram", "discord")}
    return Approver(
        ApprovalStore(db),
        policy,
        approvers,
        journal,
        bus,
        workspace=config.workspace_path,
        wakeups=wakeups,
    )
