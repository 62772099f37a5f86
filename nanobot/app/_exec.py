"""exec's setup from the config: the sandbox (bubblewrap, its network of its own and the
egress proxy), the command limits and the disk reserve, and how `nanobot status` and the
start-up log describe them. Part of the composition root (`nanobot.app`).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from loguru import logger

from nanobot.config import Config
from nanobot.errors import ConfigError
from nanobot.reserve import DiskReserve
from nanobot.sizes import format_size
from nanobot.tools.egress import EgressProxy
from nanobot.tools.limits import Limits, inspect
from nanobot.tools.netns import NamespaceError, NetworkNamespace
from nanobot.tools.sandbox import (
    SANDBOX_ERROR_HINT,
    Confinement,
    Network,
    Sandbox,
    SandboxUnavailable,
    Unavailable,
    probe,
)


def build_sandbox(config: Config, network: Network | None = None) -> Sandbox:
    """The sandbox exec runs commands in, as `tools.exec.sandbox` says. Blocking (it tries
    bubblewrap once): call it off the event loop. `network`: how `network: public` commands
    join their namespace and reach the proxy (see `open_sandbox`); required then.

    Raises:
        ConfigError: `sandbox: bwrap` and bubblewrap cannot run here.
    """
    hidden = [config.data_dir, config.state_db_path, config.log_dir]
    if config.source is not None:
        hidden.append(config.source)
    if (reserve := build_reserve(config)) is not None:
        hidden.append(reserve.ballast)
    confinement = Confinement(
        config.workspace_path,
        tuple(hidden),
        network=config.tools.exec.network,
        tmp_size=config.tools.exec.limits.tmp_size,
        programs=server_programs(config),
    )
    try:
        return probe(config.tools.exec.sandbox, confinement, network=network)
    except SandboxUnavailable as exc:
        raise ConfigError(
            f"tools.exec.sandbox is bwrap, but bubblewrap cannot run here: {exc}. "
            f"{SANDBOX_ERROR_HINT}"
        ) from None


def _public(config: Config) -> bool:
    return config.tools.exec.network == "public" and config.tools.exec.sandbox != "none"


def _no_namespace(config: Config, exc: NamespaceError) -> Sandbox:
    """What exec gets where `network: public` cannot have its namespace: refused under
    `sandbox: auto`, like a sandbox that cannot run; a start-up error under `bwrap`."""
    reason = (
        f"tools.exec.network is public, but {exc}. Set tools.exec.network: none (no network "
        "for commands) or host (the host's network, loopback services included)"
    )
    if config.tools.exec.sandbox == "bwrap":
        raise ConfigError(f"tools.exec.sandbox is bwrap, but {reason}. {SANDBOX_ERROR_HINT}")
    return Unavailable(reason)


def sandboxed_servers(config: Config) -> list[str]:
    """The enabled MCP servers nanobot starts in exec's sandbox (they need it with exec off)."""
    return [
        name
        for name, server in config.mcp.enabled().items()
        if server.transport == "stdio" and server.sandbox == "auto"
    ]


def server_programs(config: Config) -> tuple[str, ...]:
    """The folders of the sandboxed MCP servers' commands (as given, or found on PATH),
    which the sandbox shows like PATH's: `/opt/venv/bin/python -m server` runs there."""
    folders: list[str] = []
    for name in sandboxed_servers(config):
        command = config.mcp.servers[name].command or ""
        found = command if Path(command).is_absolute() else shutil.which(command)
        if found:
            folders.append(str(Path(found).parent))
    return tuple(dict.fromkeys(folders))


@asynccontextmanager
async def open_sandbox(config: Config) -> AsyncIterator[Sandbox | None]:
    """The sandbox exec runs commands in (None when exec is off and no MCP server is
    started in it), said in the log, with, for
    `network: public`, its network namespace and egress proxy running. On exit the proxy
    stops, its tunnels in flight are closed and the namespace's holder ends.

    Raises:
        ConfigError: `sandbox: bwrap` and bubblewrap (or, for `public`, the namespace)
            cannot work here.
    """
    if not config.tools.exec.enabled and not sandboxed_servers(config):
        yield None
        return
    log_network(config)
    namespace: NetworkNamespace | None = None
    proxy: EgressProxy | None = None
    try:
        sandbox: Sandbox | None = None
        if _public(config):
            try:
                # On the loop's thread: the holder's PDEATHSIG follows the thread that made it.
                namespace = NetworkNamespace.create()
            except NamespaceError as exc:
                sandbox = _no_namespace(config, exc)
            else:
                proxy = EgressProxy(
                    namespace.listener, allow_hosts=config.tools.exec.allowed_hosts()
                )
                await proxy.start()
        if sandbox is None:
            network = None if namespace is None else Network.of(namespace, proxy)
            sandbox = await asyncio.to_thread(build_sandbox, config, network)
        log_sandbox(sandbox)
        try:
            yield sandbox
        finally:
            sandbox.close()
    finally:
        if proxy is not None:
            await proxy.close()
        if namespace is not None:
            await asyncio.to_thread(namespace.close)


def describe_sandbox(config: Config) -> str:
    """Which sandbox exec would use, or why none can run (for `nanobot status`)."""
    if not config.tools.exec.enabled:
        return "exec is off (tools.exec.enabled: false)"
    with tempfile.TemporaryDirectory(prefix="nanobot-status-") as spare:
        if not config.workspace_path.exists():  # not created before the first start
            config = config.model_copy(update={"workspace": Path(spare)})
        namespace = None
        try:
            if _public(config):
                try:
                    namespace = NetworkNamespace.create()
                except NamespaceError as exc:
                    return _no_namespace(config, exc).description
            network = None if namespace is None else Network.of(namespace)
            sandbox = build_sandbox(config, network)
            sandbox.close()
            return sandbox.description
        except ConfigError as exc:
            return str(exc)
        finally:
            if namespace is not None:
                namespace.close()


def log_network(config: Config) -> None:
    """Say once at start what an old `network: true/false` now means, and warn at every
    start when commands share the host's network."""
    exec_ = config.tools.exec
    if exec_.legacy_network is not None:
        logger.info(
            "tools.exec.network: {} is the old form; it now means {} (public: a network of "
            "its own, out only through nanobot's proxy to public addresses; none; host)",
            str(exec_.legacy_network).lower(),
            exec_.network,
        )
    if exec_.network == "host" and exec_.sandbox != "none":
        logger.warning(
            "tools.exec.network is host: sandboxed commands share this machine's network, "
            "so they reach its loopback services (databases, Redis, nanobot's webhook port), "
            "the LAN and cloud metadata addresses. The default, public, reaches only the "
            "public internet."
        )


def exec_limits(config: Config) -> Limits:
    """`tools.exec.limits` as the exec tool takes them."""
    limits = config.tools.exec.limits
    return Limits(
        processes=limits.processes,
        memory=limits.memory,
        cpu_time=limits.cpu_time,
        open_files=limits.open_files,
        file_size=limits.file_size,
        tmp_size=limits.tmp_size,
    )


def describe_limits(config: Config) -> str:
    """The limits each command runs under and how they are enforced (`nanobot status`)."""
    if not config.tools.exec.enabled:
        return "exec is off (tools.exec.enabled: false)"
    confined = config.tools.exec.sandbox != "none"
    line = inspect(exec_limits(config), confined=confined).describe()
    reserve = build_reserve(config)
    if reserve is not None:
        line += f"; disk_reserve {format_size(reserve.size)} ({_reserve_state(reserve)})"
    return line


def _reserve_state(reserve: DiskReserve) -> str:
    if reserve.in_place:
        return f"kept at {reserve.ballast}"
    try:
        free = format_size(reserve.free())
    except OSError:  # no data dir yet
        return "made at the first start"
    return f"not in place: {free} free, made once there is twice the reserve"


def build_reserve(config: Config) -> DiskReserve | None:
    """The disk reserve for a SQLite store (`tools.exec.limits.disk_reserve`); None for
    PostgreSQL, whose disk is not nanobot's to guard, or when it is null."""
    size = config.tools.exec.limits.disk_reserve
    if size is None or config.shared_store:
        return None
    return DiskReserve(config.state_db_path, size)


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
