"""The gateway's lifecycle: start everything in order, run, and stop in order within bounds.

Start: channels connect, interrupted work is recovered, the dispatcher starts taking
messages. Stop (SIGTERM or SIGINT): stop intake, let running turns finish within the
deadline (what does not finish resumes on the next start), flush the outbox, disconnect.
A second SIGINT exits at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from loguru import logger

from nanobot.agent.dispatcher import Dispatcher
from nanobot.bus.queue import MessageBus
from nanobot.channels.manager import ChannelManager
from nanobot.gate import Gate

FLUSH_TIMEOUT = 5.0


@dataclass
class Gateway:
    bus: MessageBus
    gate: Gate
    dispatcher: Dispatcher
    manager: ChannelManager
    shutdown_timeout: float = 10.0
    terminal: Coroutine[Any, Any, None] | None = None
    services: Sequence[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = ()

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (or the terminal chat ends); returns the exit code."""
        stop = asyncio.Event()
        self._handle_signals(stop)
        for line in self.gate.describe():
            logger.info(line)
        if not self.manager.names:
            logger.warning(
                "no chat channel is enabled: set channels.telegram or channels.discord "
                "(enabled, token, allow_from) in the config"
            )
        async with asyncio.TaskGroup() as group:
            channels = group.create_task(self.manager.run(), name="channels")
            await self.dispatcher.recover()
            dispatching = group.create_task(self.dispatcher.run(), name="dispatcher")
            services = [group.create_task(start(), name=name) for name, start in self.services]
            terminal = None
            if self.terminal is not None:
                terminal = group.create_task(self.terminal, name="terminal")
                terminal.add_done_callback(lambda _: stop.set())
            logger.info("gateway started; channels: {}", ", ".join(self.manager.names) or "none")
            await stop.wait()
            if terminal is not None:
                terminal.cancel()
            for service in services:  # no new work from schedules while stopping
                service.cancel()
            await self._shutdown(dispatching, channels)
        logger.info("gateway stopped")
        return 0

    async def _shutdown(
        self, dispatching: asyncio.Task[None], channels: asyncio.Task[None]
    ) -> None:
        self.gate.close()
        self.bus.close_inbound()
        running = self.dispatcher.running
        if running:
            logger.info(
                "waiting up to {:g}s for {} running turn(s)", self.shutdown_timeout, running
            )
        try:
            async with asyncio.timeout(self.shutdown_timeout):
                await dispatching
        except TimeoutError:
            logger.warning(
                "{} turn(s) did not finish in time; they resume on the next start",
                self.dispatcher.running,
            )
        try:
            async with asyncio.timeout(FLUSH_TIMEOUT):
                await self.manager.drain()
        except TimeoutError:
            logger.warning(
                "some replies were not delivered in time; they are sent on the next start"
            )
        self.bus.close_outbound()
        channels.cancel()

    def _handle_signals(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        interrupts = 0

        def on_signal(signum: int) -> None:
            nonlocal interrupts
            interrupts += 1
            if interrupts > 1 and signum == signal.SIGINT:
                logger.warning("second interrupt: exiting at once")
                os._exit(130)
            logger.info("received {}; shutting down", signal.Signals(signum).name)
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
