"""The composition root: builds nanobot's parts from the Config and runs them.

The only module that knows every other one. The CLI calls the plain functions here; each
sets up logging, builds what it needs, runs it and tears it down in order.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import zoneinfo
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta, tzinfo
from functools import partial
from pathlib import Path
from typing import Any

from loguru import logger

from nanobot import log
from nanobot.agent.context import ContextBuilder
from nanobot.agent.dispatcher import Dispatcher
from nanobot.agent.loop import AgentLoop, LoopSettings, TurnRequest
from nanobot.agent.run import LoopLimits, ToolPolicy
from nanobot.agent.runner import Runner
from nanobot.bus.events import ChatRef
from nanobot.bus.queue import MessageBus
from nanobot.channels.base import Channel, InboxPolicy, IntakeFn
from nanobot.channels.manager import ChannelManager
from nanobot.config import Config, load
from nanobot.errors import NanobotError, ProviderError
from nanobot.gate import ChannelRules, Gate
from nanobot.gateway import Gateway
from nanobot.heartbeat import Heartbeat, heartbeat_turn
from nanobot.providers.litellm_provider import LiteLLMProvider, RetryPolicy
from nanobot.store import Access, Database, Journal, SessionStore, UsageLedger
from nanobot.tools.filesystem import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from nanobot.tools.message import MessageTool
from nanobot.tools.registry import ToolRegistry
from nanobot.tools.shell import DEFAULT_DENY_PATTERNS, ExecTool
from nanobot.tools.web import WebFetchTool, WebSearchTool
from nanobot.workspace import bundled, copy_template

JOURNAL_KEEP = timedelta(days=7)  # how long answered messages are remembered, for dedupe


def _secrets(config: Config) -> list[str]:
    channels = config.channels
    values = [
        config.agent.api_key,
        channels.telegram.token,
        channels.discord.token,
        config.tools.web.search_api_key,
    ]
    return [v.get_secret_value() for v in values if v is not None and v.get_secret_value()]


def _setup_logging(config: Config, *, quiet: bool) -> None:
    level = "WARNING" if quiet and config.log.level in ("INFO", "DEBUG", "TRACE") else None
    log.setup(
        level=level or config.log.level,
        json=config.log.json_,
        log_dir=config.log_dir,
        secrets=_secrets(config),
    )


def _timezone(config: Config) -> tzinfo | None:
    return zoneinfo.ZoneInfo(config.timezone) if config.timezone else None


def build_provider(config: Config) -> LiteLLMProvider:
    agent = config.agent
    return LiteLLMProvider(
        agent.model,
        api_key=agent.api_key.get_secret_value() if agent.api_key else None,
        api_base=agent.api_base,
        fallbacks=agent.fallbacks,
        max_tokens=agent.max_tokens,
        temperature=agent.temperature,
        request_timeout=agent.request_timeout,
        retry=RetryPolicy(attempts=agent.max_retries, max_total=agent.retry_max_seconds),
        context_window=agent.context_window,
    )


def build_tools(config: Config) -> ToolRegistry:
    """The built-in tools, configured from `config.tools`."""
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
    if tools.exec.enabled:
        deny = tools.exec.deny_patterns
        registry.register(
            ExecTool(
                workspace,
                timeout=tools.exec.timeout,
                deny_patterns=DEFAULT_DENY_PATTERNS if deny is None else deny,
            )
        )
    return registry


@dataclass(frozen=True)
class Parts:
    """What a running nanobot is made of, built once from the config."""

    db: Database
    loop: AgentLoop


@asynccontextmanager
async def _agent(config: Config) -> AsyncIterator[AgentLoop]:
    async with _parts(config) as parts:
        yield parts.loop


@asynccontextmanager
async def _parts(config: Config) -> AsyncIterator[Parts]:
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    copy_template(config.workspace_path)
    agent = config.agent
    provider = build_provider(config)
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
    async with await Database.open(config.state_db_path) as db:
        runner = Runner(provider, build_tools(config))
        loop = AgentLoop(
            provider, runner, SessionStore(db), context, settings, usage=UsageLedger(db)
        )
        yield Parts(db, loop)


def ask(config: Config, message: str, session_key: str, *, verbose: bool = False) -> str:
    """One turn in `session_key`; returns the reply.

    Raises:
        ProviderError: the model could not be reached.
        NanobotError: the turn failed otherwise (a limit, storage); the message says why.
    """
    _setup_logging(config, quiet=not verbose)

    async def run() -> str:
        async with _agent(config) as agent:
            reply = await agent.handle(TurnRequest(session_key, message))
        assert reply is not None  # nothing else runs in this session here
        result = reply.result
        if isinstance(result.error, ProviderError):
            raise result.error
        if result.status != "completed":
            raise NanobotError(result.final_text)
        return reply.text or result.final_text

    return asyncio.run(run())


def chat(config: Config, session_key: str, *, verbose: bool = False) -> None:
    """An interactive chat in the terminal until EOF, /exit or Ctrl-C twice."""
    from nanobot.channels import terminal

    _setup_logging(config, quiet=not verbose)

    async def run() -> None:
        async with _agent(config) as agent:
            await terminal.chat(agent, session_key)

    asyncio.run(run())


def serve(config: Config) -> int:
    """Run the gateway until SIGTERM/SIGINT; returns the exit code."""
    _setup_logging(config, quiet=False)
    return asyncio.run(_serve(config))


async def _serve(config: Config) -> int:
    from nanobot.channels import terminal

    async with _parts(config) as parts:
        bus = MessageBus()
        journal = Journal(parts.db)
        pruned = await journal.prune(JOURNAL_KEEP)
        if pruned:
            logger.debug("pruned {} finished journal rows", pruned)
        gate = Gate(_channel_rules(config), Access(parts.db), journal, bus)
        manager = ChannelManager(
            build_channels(config, gate),
            bus,
            confirm=journal.delivered,
            failed=journal.attempt_failed,
        )
        dispatcher = Dispatcher(parts.loop, bus, journal, parts.loop)
        gateway = Gateway(
            bus=bus,
            gate=gate,
            dispatcher=dispatcher,
            manager=manager,
            shutdown_timeout=config.gateway.shutdown_timeout,
            terminal=(
                terminal.chat(parts.loop, "terminal:local", own_interrupts=False)
                if sys.stdin.isatty()
                else None
            ),
            services=_services(config, parts, dispatcher),
        )
        return await gateway.run()


def _services(
    config: Config, parts: Parts, dispatcher: Dispatcher
) -> list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]]:
    """Background producers of work: the heartbeat (and, later, cron)."""
    services: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = []
    beat = config.heartbeat
    if beat.enabled:
        target = beat.deliver_to
        chat = ChatRef(target.channel, target.chat_id) if target else None

        async def deliver(text: str) -> None:
            assert chat is not None
            await dispatcher.send(chat, text)

        heartbeat = Heartbeat(
            config.workspace_path / "HEARTBEAT.md",
            beat.interval_minutes * 60,
            partial(heartbeat_turn, parts.loop),
            deliver if chat else None,
        )
        services.append(("heartbeat", heartbeat.run))
    return services


def _channel_rules(config: Config) -> dict[str, ChannelRules]:
    rules = {}
    for name in ("telegram", "discord"):
        section = getattr(config.channels, name)
        if section.enabled:
            rules[name] = ChannelRules(frozenset(section.allow_from), section.group_policy)
    return rules


def build_channels(config: Config, intake: IntakeFn) -> list[Channel]:
    """The enabled chat channels (their libraries are imported only when enabled)."""
    channels: list[Channel] = []
    inbox = config.workspace_path / "inbox"
    telegram = config.channels.telegram
    if telegram.enabled:
        from nanobot.channels.telegram import TelegramChannel

        policy = InboxPolicy(inbox, int(telegram.max_file_mb * 1024 * 1024))
        channels.append(TelegramChannel(telegram, intake, policy))
    discord = config.channels.discord
    if discord.enabled:
        from nanobot.channels.discord import DiscordChannel

        policy = InboxPolicy(inbox, int(discord.max_file_mb * 1024 * 1024))
        channels.append(DiscordChannel(discord, intake, policy))
    return channels


def pairing(config: Config, action: str, *args: str) -> tuple[list[str], bool]:
    """Run a `nanobot pairing` action; returns the lines to print and whether it succeeded."""
    _setup_logging(config, quiet=True)
    actions: dict[str, Callable[..., Awaitable[tuple[list[str], bool]]]] = {
        "approve": _approve,
        "deny": _deny,
        "revoke": _revoke,
        "list": _pairing_list,
    }

    async def run() -> tuple[list[str], bool]:
        config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        async with await Database.open(config.state_db_path) as db:
            return await actions[action](Access(db), *args)

    return asyncio.run(run())


async def _approve(access: Access, code: str) -> tuple[list[str], bool]:
    request = await access.approve(code)
    if request is None:
        return [f"No pending request has the code {code} (or it expired)."], False
    who = f"{request.name or 'user'} ({request.channel} id {request.user_id})"
    return [f"Approved {who}. They can talk to nanobot now."], True


async def _deny(access: Access, code: str) -> tuple[list[str], bool]:
    if await access.deny(code):
        return [f"Denied request {code.upper()}."], True
    return [f"No pending request has the code {code}."], False


async def _revoke(access: Access, user: str, channel: str | None = None) -> tuple[list[str], bool]:
    if await access.revoke(user, channel):
        return [f"Revoked user {user}."], True
    return [f"User {user} was not approved by pairing."], False


async def _pairing_list(access: Access) -> tuple[list[str], bool]:
    lines = ["Pending requests:"]
    pending = await access.pending()
    for r in pending:
        expires = r.expires_at.astimezone().strftime("%H:%M")
        lines.append(f"  {r.code}  {r.channel} user {r.user_id} ({r.name or '?'}), until {expires}")
    if not pending:
        lines.append("  none")
    lines.append("Approved users:")
    allowed = await access.allowed()
    for u in allowed:
        lines.append(
            f"  {u.channel} user {u.user_id} ({u.name or '?'}), since {u.approved_at:%Y-%m-%d}"
        )
    if not allowed:
        lines.append("  none")
    return lines, True


def describe_error(exc: NanobotError) -> str:
    """One line for the terminal: the user-facing reason, then the detail."""
    if isinstance(exc, ProviderError):
        return f"{exc.user_message()} ({exc.kind}: {exc})"
    return str(exc)


def onboard(path: Path, answers: dict[str, str]) -> list[str]:
    """Write the config (from the example, with `answers` filled in) and the workspace.

    Never overwrites: an existing config is kept and only missing workspace files are added.
    Returns what it did, one line each.

    Raises:
        ConfigError: the existing (or written) config is not valid.
    """
    lines: list[str] = []
    if path.exists():
        lines.append(f"config: {path} exists; left as it is")
    else:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        text = _fill_example(bundled("config.example.yaml").read_text(encoding="utf-8"), answers)
        # Exclusive create: a file that appeared meanwhile is not clobbered; 0600 as it may
        # hold an API key.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        lines.append(f"config: wrote {path}")
    config = load(path)
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    created = copy_template(config.workspace_path)
    state = f"added {len(created)} files" if created else "already complete"
    lines.append(f"workspace: {config.workspace_path} ({state})")
    if not path.exists() or not answers.get("api_key"):
        lines.append(
            "next: set agent.api_key (or your provider's key variable), then `nanobot agent -m hi`"
        )
    return lines


def _fill_example(text: str, answers: dict[str, str]) -> str:
    for key in ("model", "api_key", "api_base"):
        value = answers.get(key)
        if value:
            # A JSON string is a valid YAML scalar; escaped so re.sub takes it literally.
            line = f"  {key}: {json.dumps(value)}".replace("\\", "\\\\")
            text = re.sub(rf"(?m)^  {key}: .*$", line, text, count=1)
    return text


def status(config: Config, path: Path) -> list[tuple[str, str]]:
    """Rows of (label, value) describing this installation, without any secret."""
    rows = [
        ("config", f"{path}" + ("" if path.exists() else " (not found; using defaults)")),
        ("data dir", str(config.data_dir)),
        (
            "workspace",
            str(config.workspace_path) + ("" if config.workspace_path.exists() else " (missing)"),
        ),
        (
            "model",
            config.agent.model + (f" via {config.agent.api_base}" if config.agent.api_base else ""),
        ),
        ("api key", "set" if config.agent.api_key else "not set (provider env vars may apply)"),
    ]
    for name in ("telegram", "discord"):
        channel = getattr(config.channels, name)
        state = f"enabled, {len(channel.allow_from)} allowed" if channel.enabled else "disabled"
        rows.append((name, state))
    if not config.state_db_path.exists():
        return [*rows, ("state", f"{config.state_db_path} (not created yet)")]
    return rows + asyncio.run(_store_rows(config.state_db_path))


async def _store_rows(db_path: Path) -> list[tuple[str, str]]:
    async with await Database.open(db_path) as db:
        stats = await SessionStore(db).stats()
    return [
        ("state", f"{db_path} ({stats.size_bytes / 1024:.0f} KiB)"),
        ("sessions", f"{stats.sessions} ({stats.live_sessions} live), {stats.entries} entries"),
    ]
