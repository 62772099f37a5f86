"""How nanobot runs: one message (`ask`, `nanobot agent -m`), a chat in the terminal (`chat`,
`nanobot agent`) and the gateway (`serve`). Each sets up logging, builds its parts through
the composition root (`nanobot.app`), runs them and tears them down in order.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

from loguru import logger

from nanobot import log
from nanobot.agent.dispatcher import Dispatcher, OutcomeSink
from nanobot.app import EVERYONE, Intake, build_gateway, open_parts
from nanobot.bus.events import ChatRef, InboundMessage, Source, TurnOutcome
from nanobot.channels.manager import ChannelManager
from nanobot.channels.terminal import TerminalChannel
from nanobot.config import Config
from nanobot.errors import CONFIG_EXIT, NanobotError, ProviderError
from nanobot.gateway import Gateway
from nanobot.manage import GATEWAY_LOCK, lock_holder

GC_YOUNG_THRESHOLD: Final = 10_000  # new objects between two collections of the youngest one
CLI: Final = "cli"  # the channel of `nanobot agent -m`: its answer is printed, not delivered


class _Answer:
    """The outcome of the one message `ask` sends (an `OutcomeSink`)."""

    def __init__(self) -> None:
        self.outcome: asyncio.Future[TurnOutcome] = asyncio.get_running_loop().create_future()

    async def finished(self, message: InboundMessage, outcome: TurnOutcome) -> None:
        if not self.outcome.done():
            self.outcome.set_result(outcome)


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
        async with open_parts(config) as parts:
            if parts.servers is not None:
                # One message, no later turn: its MCP tools are there, or have failed, first
                # (a chat's turns never wait for them).
                await parts.servers.settled()
            way_in = await Intake.build(parts, {CLI: EVERYONE})
            answer = _Answer()
            outcomes: dict[Source, OutcomeSink] = {"chat": answer}
            dispatcher = Dispatcher(
                parts.loop,
                way_in.bus,
                way_in.journal,
                outcomes=outcomes,
                reader=parts.reader,
                recall=parts.recall,
            )
            async with asyncio.TaskGroup() as group:
                dispatching = group.create_task(dispatcher.run(), name="dispatcher")
                event = InboundMessage.from_chat(
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
        async with open_parts(config) as parts:
            way_in = await Intake.build(parts, {TerminalChannel.name: EVERYONE})
            terminal = TerminalChannel(way_in.gate, session=session_key)
            gateway = Gateway(
                bus=way_in.bus,
                gate=way_in.gate,
                dispatcher=Dispatcher(parts.loop, way_in.bus, way_in.journal),
                manager=ChannelManager([terminal], way_in.bus, way_in.journal),
                shutdown_timeout=config.gateway.shutdown_timeout,
                until=terminal.ended,
            )
            await gateway.run()

    asyncio.run(run())


def serve(config: Config) -> int:
    """Run the gateway until SIGTERM/SIGINT; returns the exit code: 2 (`CONFIG_EXIT`) when
    it stopped because no chat channel could run (each refused its token).

    Raises:
        ConfigError: the data dir cannot be written, or the channels cannot start (see
            `check_channels`).
        NanobotError: another gateway runs on the same data dir, with the state on SQLite.
    """
    log.configure(config, quiet=False)
    with _gateway_lock(config) as lock:
        if config.gateway.event_loop == "uvloop":
            try:
                import uvloop
            except ImportError:
                logger.warning("uvloop is not installed; the gateway uses asyncio's own event loop")
            else:
                logger.debug("event loop: uvloop")
                return uvloop.run(_serve(config, lock))
        logger.debug("event loop: asyncio")
        return asyncio.run(_serve(config, lock))


@dataclass
class _Lock:
    """The data dir's gateway lock as this process holds it (`fd`; None when it runs
    without it), and the member id of the gateway that held it before (`predecessor`)."""

    fd: int | None
    predecessor: str | None = None

    def record(self, member: str) -> None:
        """Write this process's pid and member id in the lock file (the next gateway on the
        data dir takes this one's roles at once: it is gone by then)."""
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, f"{os.getpid()} {member}\n".encode(), 0)


@contextmanager
def _gateway_lock(config: Config) -> Iterator[_Lock]:
    """Hold the data dir's gateway lock (`gateway.lock`: this process's pid, then its
    member id) while the gateway runs. The kernel drops the lock when the process ends,
    however it ends, so a lock file left behind by a crash stops nothing, and whoever takes
    the lock knows that the member it names is gone.

    With the state on SQLite a second gateway on the data dir is refused: it would share
    the first one's state and files unawares. With the state on PostgreSQL several may
    share one (members of a cluster): one that finds the lock held runs without it, and
    says so.

    Raises:
        NanobotError: another gateway holds the lock and the state is on SQLite; the
            message names its pid.
    """
    data_dir = config.data_dir
    fd = os.open(
        data_dir / GATEWAY_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = lock_holder(fd)
            if not config.shared_store:
                raise NanobotError(
                    f"another gateway is running on the data dir {data_dir} (pid {pid}): stop "
                    "it first, or give this one its own data_dir"
                ) from None
            logger.info(
                "another gateway runs on the data dir {} (pid {}): with the state on "
                "PostgreSQL both are members of one cluster, so this one runs without the "
                "data dir's lock (they share its files: give each its own data_dir, with one "
                "shared workspace, to keep their logs apart)",
                data_dir,
                pid,
            )
            yield _Lock(None)
            return
        before = os.pread(fd, 100, 0).decode("ascii", "replace").split()
        lock = _Lock(fd, before[1] if len(before) > 1 else None)
        lock.record("")
        yield lock
    finally:
        os.close(fd)


async def _serve(config: Config, lock: _Lock) -> int:
    # A fresh `make run` has no API key yet: the gateway starts, says so, and answers.
    parts_of_a_gateway = open_parts(
        config, require_key=False, gateway=True, succeeds=lock.predecessor
    )
    async with parts_of_a_gateway as parts:
        if parts.sandbox is not None:
            parts.sandbox.prepare()  # so that the first command does not wait for it
        _tune_garbage_collection()
        gateway = await build_gateway(config, parts, terminal=sys.stdin.isatty())
        if gateway.membership is not None:
            lock.record(gateway.membership.member.id)
        code = await gateway.run()
        # Every channel refused (a token rejected, an intent not enabled): a configuration
        # error, which a restart cannot mend (systemd's RestartPreventExitStatus=2).
        return CONFIG_EXIT if gateway.manager.all_refused.is_set() else code


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


def describe_error(exc: NanobotError) -> str:
    """One line for the terminal: the user-facing reason, then the detail."""
    if isinstance(exc, ProviderError):
        return f"{exc.user_message()} ({exc.kind}: {exc})"
    return str(exc)
