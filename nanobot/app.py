"""The composition root: builds nanobot's parts from the Config and runs them.

The only module that knows every other one. The CLI calls the plain functions here; each
sets up logging, builds what it needs, runs it and tears it down in order.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import os
import stat
import sys
import tempfile
import uuid
import zoneinfo
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta, tzinfo
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from nanobot import log
from nanobot.agent.approvals import ApprovalPolicy
from nanobot.agent.approver import Approver
from nanobot.agent.context import ContextBuilder
from nanobot.agent.dispatcher import Dispatcher, OutcomeSink
from nanobot.agent.loop import AgentLoop, LoopSettings
from nanobot.agent.run import LoopLimits, ToolPolicy
from nanobot.agent.runner import Runner
from nanobot.agent.subagents import Subagents, SubagentSettings, subagent_tools
from nanobot.bus.events import ChatRef, InboundMessage, Source, TurnOutcome
from nanobot.bus.intake import EventIntake
from nanobot.bus.queue import MessageBus
from nanobot.channels.base import Channel, InboxPolicy, IntakePort, OutboxPort
from nanobot.channels.manager import ChannelManager
from nanobot.channels.terminal import TerminalChannel
from nanobot.config import Config
from nanobot.cron.jobs import Jobs
from nanobot.cron.service import CronService
from nanobot.errors import ConfigError, NanobotError, ProviderError
from nanobot.gate import ChannelRules, Gate
from nanobot.gateway import Gateway
from nanobot.heartbeat import Heartbeat
from nanobot.membership import Membership
from nanobot.providers.provider import Provider, RetryPolicy, Routes
from nanobot.store import Access, ApprovalStore, Database, Journal, SessionStore, UsageLedger
from nanobot.store.cron import CronStore
from nanobot.store.members import Members
from nanobot.tools.cron import CronTool
from nanobot.tools.filesystem import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from nanobot.tools.message import MessageTool
from nanobot.tools.registry import ToolRegistry
from nanobot.tools.sandbox import (
    SANDBOX_ERROR_HINT,
    Confinement,
    Sandbox,
    SandboxUnavailable,
    Unavailable,
    probe,
)
from nanobot.tools.shell import DEFAULT_DENY_PATTERNS, ExecTool
from nanobot.tools.spawn import SpawnTool
from nanobot.tools.web import WebFetchTool, WebSearchTool
from nanobot.workspace import copy_template

if TYPE_CHECKING:
    from nanobot.providers.litellm_provider import LiteLLMTransport

JOURNAL_KEEP = timedelta(days=7)  # how long answered messages are remembered, for dedupe
GC_YOUNG_THRESHOLD = 10_000  # new objects between two collections of the youngest generation
GATEWAY_LOCK = "gateway.lock"  # in the data dir: held by the running gateway (see `serve`)


def _timezone(config: Config) -> tzinfo | None:
    return zoneinfo.ZoneInfo(config.timezone) if config.timezone else None


def build_provider(config: Config) -> Provider:
    """The model provider, its calls made by the transports `agent.transport` names; the
    caller closes it (`aclose`)."""
    agent = config.agent
    api_key = agent.api_key.get_secret_value() if agent.api_key else None
    timeout = agent.request_timeout
    routes: Routes
    if agent.transport == "litellm" or not agent.api_base:  # auto without api_base: litellm
        routes = Routes(_litellm_transport(config, api_key))
    else:
        from nanobot.providers.openai_direct import DirectTransport  # aiohttp: ~0.1 s

        auto = agent.transport == "auto"
        direct = DirectTransport(
            agent.api_base, api_key=api_key, key_from_env=auto, request_timeout=timeout
        )
        routes = Routes(direct)
        if auto:
            routes = Routes.auto(
                _litellm_transport(config, api_key),
                direct,
                max_tokens=agent.max_tokens,
                temperature=agent.temperature,
            )
    return Provider(
        agent.model,
        routes,
        fallbacks=agent.fallbacks,
        max_tokens=agent.max_tokens,
        temperature=agent.temperature,
        retry=RetryPolicy(attempts=agent.max_retries, max_total=agent.retry_max_seconds),
        context_window=agent.context_window,
    )


def _litellm_transport(config: Config, api_key: str | None) -> LiteLLMTransport:
    from nanobot.providers.litellm_provider import LiteLLMTransport

    agent = config.agent
    return LiteLLMTransport(
        agent.model,
        api_key=api_key,
        api_base=agent.api_base,
        request_timeout=agent.request_timeout,
        # An answer asked for whole (nobody watches it written) may take as long as a turn.
        answer_timeout=agent.max_turn_seconds,
    )


def build_sandbox(config: Config) -> Sandbox:
    """The sandbox exec runs commands in, as `tools.exec.sandbox` says. Blocking (it tries
    bubblewrap once): call it off the event loop.

    Raises:
        ConfigError: `sandbox: bwrap` and bubblewrap cannot run here.
    """
    hidden = [config.data_dir, config.state_db_path, config.log_dir]
    if config.source is not None:
        hidden.append(config.source)
    confinement = Confinement(
        config.workspace_path, tuple(hidden), network=config.tools.exec.network
    )
    try:
        return probe(config.tools.exec.sandbox, confinement)
    except SandboxUnavailable as exc:
        raise ConfigError(
            f"tools.exec.sandbox is bwrap, but bubblewrap cannot run here: {exc}. "
            f"{SANDBOX_ERROR_HINT}"
        ) from None


def describe_sandbox(config: Config) -> str:
    """Which sandbox exec would use, or why none can run (for `nanobot status`)."""
    if not config.tools.exec.enabled:
        return "exec is off (tools.exec.enabled: false)"
    with tempfile.TemporaryDirectory(prefix="nanobot-status-") as spare:
        if not config.workspace_path.exists():  # not created before the first start
            config = config.model_copy(update={"workspace": Path(spare)})
        try:
            return build_sandbox(config).description
        except ConfigError as exc:
            return str(exc)


def log_sandbox(sandbox: Sandbox) -> None:
    """Say at start-up which sandbox exec uses, loudly when it is none."""
    if not sandbox.confined:
        logger.warning(
            "exec runs WITHOUT a sandbox (tools.exec.sandbox: none): shell commands the model "
            "chooses run with nanobot's own rights and can read its config, state and your "
            "files. Only do this where nanobot's account holds nothing else worth protecting."
        )
    elif isinstance(sandbox, Unavailable):
        logger.warning("exec sandbox: {}. {}", sandbox.description, SANDBOX_ERROR_HINT)
    else:
        logger.info("exec sandbox: {}", sandbox.description)


def build_tools(
    config: Config, jobs: Jobs | None = None, sandbox: Sandbox | None = None
) -> ToolRegistry:
    """The built-in tools, configured from `config.tools` (and `cron` when `jobs` is given).

    exec is registered when it is enabled and `sandbox` is given (see `build_sandbox`)."""
    tools, workspace = config.tools, config.workspace_path
    restrict = tools.restrict_to_workspace
    registry = ToolRegistry(
        [
            ReadFileTool(workspace, restrict=restrict),
            WriteFileTool(workspace, restrict=restrict),
            EditFileTool(workspace, restrict=restrict),
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


def private_dir(path: Path) -> None:
    """Make `path` a directory only its owner can enter (0700): created so, or with group and
    others' access taken away if it exists with any. The data dir holds the state database,
    the logs and the workspace."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        path.chmod(mode & 0o700)


@asynccontextmanager
async def _parts(config: Config, *, require_key: bool = True) -> AsyncIterator[Parts]:
    """Everything a turn needs, built from `config`. `require_key` False lets a gateway
    start without the model's API key (warned about; replies fail until it is set)."""
    private_dir(config.data_dir)
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
    context = ContextBuilder(config.workspace_path, timezone=settings.timezone)
    sandbox = None
    if config.tools.exec.enabled:
        sandbox = await asyncio.to_thread(build_sandbox, config)
        log_sandbox(sandbox)
    provider = build_provider(config)
    try:
        await asyncio.to_thread(partial(provider.prepare, require_key=require_key))
        async with await Database.open(config.state_db_path) as db:
            jobs = Jobs(CronStore(db), config.timezone)
            tools = build_tools(config, jobs, sandbox)
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
            )
            yield Parts(db, loop, jobs, runner, tools, sessions, bus, journal, approver)
    finally:
        await provider.aclose()


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


CLI = "cli"  # the channel of `nanobot agent -m`: its answer is printed, not delivered
EVERYONE = ChannelRules(frozenset({"*"}))  # the person at this machine's own terminal


class _Answer:
    """The outcome of the one message `ask` sends (an `OutcomeSink`)."""

    def __init__(self) -> None:
        self.outcome: asyncio.Future[TurnOutcome] = asyncio.get_running_loop().create_future()

    async def finished(self, message: InboundMessage, outcome: TurnOutcome) -> None:
        if not self.outcome.done():
            self.outcome.set_result(outcome)


@dataclass(frozen=True)
class _Intake:
    """The way in, built on the parts: bus, journal and gate."""

    bus: MessageBus
    journal: Journal
    gate: Gate

    @classmethod
    async def build(cls, parts: Parts, rules: dict[str, ChannelRules]) -> _Intake:
        bus, journal = parts.bus, parts.journal
        pruned = await journal.prune(JOURNAL_KEEP)
        if pruned:
            logger.debug("pruned {} finished journal rows", pruned)
        await parts.approver.recover()  # before any turn resumes
        return cls(bus, journal, Gate(rules, Access(parts.db), journal, bus))


def ask(config: Config, message: str, session_key: str, *, verbose: bool = False) -> str:
    """One turn in `session_key`; returns the reply. The message goes the one way in (gate,
    journal, dispatcher) like any other; its answer is printed rather than delivered.

    Raises:
        ProviderError: the model could not be reached.
        NanobotError: the turn failed otherwise (a limit, storage); the message says why.
    """
    # The turn's failure is printed as one line by the caller; the runner's warning about
    # it goes to the log file only.
    log.configure(config, quiet=not verbose, reported=() if verbose else ("nanobot.agent.runner",))

    async def run() -> str:
        async with _parts(config) as parts:
            way_in = await _Intake.build(parts, {CLI: EVERYONE})
            answer = _Answer()
            outcomes: dict[Source, OutcomeSink] = {"chat": answer}
            dispatcher = Dispatcher(
                parts.loop, way_in.bus, way_in.journal, parts.loop, outcomes=outcomes
            )
            async with asyncio.TaskGroup() as group:
                dispatching = group.create_task(dispatcher.run(), name="dispatcher")
                event = InboundMessage(
                    ChatRef(CLI, "local"),
                    "local",
                    message,
                    uuid.uuid4().hex,
                    session=session_key,
                    deliver=False,
                )
                await way_in.gate(event)
                outcome = await answer.outcome
                way_in.bus.close_inbound()
                await dispatching
        if isinstance(outcome.error, ProviderError):
            raise outcome.error
        if not outcome.ok:
            raise NanobotError(outcome.text or f"the turn ended: {outcome.status}")
        return outcome.text or ""

    return asyncio.run(run())


def chat(config: Config, session_key: str, *, verbose: bool = False) -> None:
    """An interactive chat in the terminal until EOF, /exit or Ctrl-C twice: the terminal
    channel on its own, through the gate, the journal and the outbox."""
    log.configure(config, quiet=not verbose)

    async def run() -> None:
        async with _parts(config) as parts:
            way_in = await _Intake.build(parts, {TerminalChannel.name: EVERYONE})
            terminal = TerminalChannel(way_in.gate, session=session_key)
            gateway = Gateway(
                bus=way_in.bus,
                gate=way_in.gate,
                dispatcher=Dispatcher(parts.loop, way_in.bus, way_in.journal, parts.loop),
                manager=ChannelManager([terminal], way_in.bus, way_in.journal),
                shutdown_timeout=config.gateway.shutdown_timeout,
                until=terminal.ended,
            )
            await gateway.run()

    asyncio.run(run())


def serve(config: Config) -> int:
    """Run the gateway until SIGTERM/SIGINT; returns the exit code: 1 when it stopped
    because no chat channel could run (each refused its token).

    Raises:
        ConfigError: the data dir cannot be written, or the channels cannot start (see
            `check_channels`).
        NanobotError: another gateway runs on the same data dir.
    """
    log.configure(config, quiet=False)
    with _only_gateway(config.data_dir):
        if config.gateway.event_loop == "uvloop":
            try:
                import uvloop
            except ImportError:
                logger.warning("uvloop is not installed; the gateway uses asyncio's own event loop")
            else:
                logger.debug("event loop: uvloop")
                return uvloop.run(_serve(config))
        logger.debug("event loop: asyncio")
        return asyncio.run(_serve(config))


@contextmanager
def _only_gateway(data_dir: Path) -> Iterator[None]:
    """Hold the data dir's gateway lock (`gateway.lock`, with this process's pid) while the
    gateway runs: a second one would poll Telegram against the first (409 Conflict, for
    ever) and share its state. The kernel drops the lock when the process ends, however
    it ends, so a lock file left behind by a crash stops nothing.

    Raises:
        NanobotError: another gateway holds the lock; the message names its pid.
    """
    path = data_dir / GATEWAY_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 20, 0).decode("ascii", "replace").strip() or "unknown"
            raise NanobotError(
                f"another gateway is running on the data dir {data_dir} (pid {pid}): stop it "
                "first, or give this one its own data_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


async def _serve(config: Config) -> int:
    # A fresh `make run` has no API key yet: the gateway starts, says so, and answers.
    async with _parts(config, require_key=False) as parts:
        _tune_garbage_collection()
        gateway = await build_gateway(config, parts, terminal=sys.stdin.isatty())
        code = await gateway.run()
        return 1 if gateway.manager.all_refused.is_set() else code


def check_channels(config: Config, *, terminal: bool) -> None:
    """What the gateway's chat channels need to start: a token for each enabled one, and
    at least one enabled when no terminal is attached (nobody could talk to nanobot).

    Raises:
        ConfigError: the reason, and how to fix it.
    """
    file = f"{config.source}: " if config.source is not None else ""
    for name, where in (("telegram", "from @BotFather"), ("discord", "from the developer portal")):
        section = getattr(config.channels, name)
        if section.enabled and not section.token.get_secret_value().strip():
            raise ConfigError(
                f"{file}channels.{name} is enabled but its token is empty: set "
                f"channels.{name}.token (the bot's token, {where}) or "
                f"NANOBOT_CHANNELS__{name.upper()}__TOKEN, or set enabled: false"
            )
    if not terminal and not _channel_rules(config):
        raise ConfigError(
            f"{file}no chat channel is enabled and no terminal is attached, so nobody could "
            "talk to nanobot: enable one, e.g. channels: {telegram: {enabled: true, token: "
            '"<from @BotFather>", allow_from: [<your user id>]}} (see config.example.yaml), '
            "or run `nanobot agent` to chat in this terminal"
        )


async def build_gateway(config: Config, parts: Parts, *, terminal: bool) -> Gateway:
    """The gateway on `parts`: the enabled channels (and the terminal, when attached), the
    dispatcher, subagents, the heartbeat and cron, all coming in through one gate. Without
    a terminal, it stops once every channel has stopped for good (`all_refused`).

    Raises:
        ConfigError: see `check_channels`.
    """
    check_channels(config, terminal=terminal)
    rules = _channel_rules(config)
    if terminal:
        rules[TerminalChannel.name] = EVERYONE
    way_in = await _Intake.build(parts, rules)
    channels = build_channels(config, way_in.gate, way_in.journal)
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
    services = [("subagents", subagents.run)]
    outcomes: dict[Source, OutcomeSink] = {}
    beat = config.heartbeat
    if beat.enabled:
        target = beat.deliver_to
        heartbeat = Heartbeat(
            config.workspace_path / "HEARTBEAT.md",
            beat.interval_minutes * 60,
            way_in.gate,
            ChatRef(target.channel, target.chat_id) if target else None,
        )
        services.append(("heartbeat", heartbeat.run))
        outcomes["heartbeat"] = heartbeat
    if config.cron.enabled:
        cron = CronService(
            CronStore(parts.db),
            way_in.gate,
            catch_up_window=config.cron.catch_up_window,
            channels=[n for n in ("telegram", "discord") if getattr(config.channels, n).enabled],
        )
        services.append(("cron", cron.run))
        outcomes["cron"] = cron
    dispatcher = Dispatcher(
        parts.loop,
        way_in.bus,
        way_in.journal,
        parts.loop,
        subagents=subagents,
        outcomes=outcomes,
        whole_replies=[
            n for n in ("telegram", "discord") if not getattr(config.channels, n).stream
        ],
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
        membership=Membership(Members(parts.db)),
    )


def _tune_garbage_collection() -> None:
    """Fit the garbage collector to a long-running server with many turns in flight.

    What start-up built is frozen out of every later collection: the imported modules
    (litellm's alone are about 300,000 objects) live as long as the process, and a full
    collection under load walked all of them, 0.1-0.2 s with the event loop stopped. And the
    youngest generation is collected after 10,000 new objects instead of 700: with hundreds
    of turns in flight, each of those frequent collections walked thousands of live objects
    (a tenth of the CPU of a 1,000-chat burst). Cyclic garbage waits a little longer; memory
    barely changes.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    logger.debug(
        "start-up heap frozen: {} objects left out of garbage collection; young generation "
        "collected every {} objects",
        gc.get_freeze_count(),
        GC_YOUNG_THRESHOLD,
    )


def _channel_rules(config: Config) -> dict[str, ChannelRules]:
    rules = {}
    for name in ("telegram", "discord"):
        section = getattr(config.channels, name)
        if section.enabled:
            rules[name] = ChannelRules(frozenset(section.allow_from), section.group_policy)
    return rules


def build_channels(
    config: Config, intake: IntakePort, outbox: OutboxPort | None = None
) -> list[Channel]:
    """The enabled chat channels (their libraries are imported only when enabled), taking
    messages in through `intake` and keeping `outbox` told where each reply stands."""
    channels: list[Channel] = []
    workspace = config.workspace_path
    inbox = workspace / "inbox"
    telegram = config.channels.telegram
    if telegram.enabled:
        from nanobot.channels.telegram import TelegramChannel

        policy = InboxPolicy(inbox, int(telegram.max_file_mb * 1024 * 1024), workspace)
        channels.append(TelegramChannel(telegram, intake, policy, outbox=outbox))
    discord = config.channels.discord
    if discord.enabled:
        from nanobot.channels.discord import DiscordChannel

        policy = InboxPolicy(inbox, int(discord.max_file_mb * 1024 * 1024), workspace)
        channels.append(DiscordChannel(discord, intake, policy, outbox=outbox))
    return channels


def describe_error(exc: NanobotError) -> str:
    """One line for the terminal: the user-facing reason, then the detail."""
    if isinstance(exc, ProviderError):
        return f"{exc.user_message()} ({exc.kind}: {exc})"
    return str(exc)
