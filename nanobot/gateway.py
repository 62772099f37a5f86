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
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from loguru import logger

from nanobot.agent.dispatcher import Dispatcher
from nanobot.bus.queue import MessageBus
from nanobot.channels.manager import ChannelManager
from nanobot.cluster.distribution import Distributor
from nanobot.cluster.membership import Membership
from nanobot.gate import Gate

FLUSH_TIMEOUT = 5.0


@dataclass
class Gateway:
    """`until`, when given, stops the gateway once set (the terminal chat ended).
    `membership`, when given, keeps this process's row in the members table from start to
    the end of a clean stop (`nanobot status --check` reads it)."""

    bus: MessageBus
    gate: Gate
    dispatcher: Dispatcher
    manager: ChannelManager
    shutdown_timeout: float = 10.0
    until: asyncio.Event | None = None
    services: Sequence[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = ()
    membership: Membership | None = None
    # In a cluster: this member's share of the work, taken from the journal (it recovers
    # what the cluster left pending, instead of `Dispatcher.recover`).
    distributor: Distributor | None = None

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (or `until`); returns the exit code."""
        async with self.membership or nullcontext():
            return await self._serve()

    async def _serve(self) -> int:
        stop = asyncio.Event()
        self._handle_signals(stop)
        for line in self.gate.describe():
            logger.info(line)
        # Recovery first: a message a channel takes in once it runs is journaled *and*
        # dispatched, and recovery must not find it pending and answer it a second time.
        # (In a cluster every message is claimed from the journal once, recovered or not.)
        if self.distributor is None:
            await self.dispatcher.recover(self.manager.names)
        async with asyncio.TaskGroup() as group:
            channels = group.create_task(self.manager.run(), name="channels")
            dispatching = group.create_task(self.dispatcher.run(), name="dispatcher")
            services = [group.create_task(start(), name=name) for name, start in self.services]
            if self.distributor is not None:
                taking = self.distributor.run(self.dispatcher)
                services.append(group.create_task(taking, name="distribution"))
            relay = None
            if self.until is not None:
                relay = group.create_task(_relay(self.until, stop), name="until")
            logger.info("gateway started; channels: {}", ", ".join(self.manager.names) or "none")
            await stop.wait()
            for service in services:  # no new work from schedules while stopping
                service.cancel()
            await self._shutdown(dispatching, channels)
            if self.distributor is not None:  # its turns are over: others may take its sessions
                await self.distributor.leave()
            if relay is not None:
                relay.cancel()
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
        # Not asyncio.timeout: its cancellation ends the turns before they could be counted.
        done, _ = await asyncio.wait({dispatching}, timeout=self.shutdown_timeout)
        if not done:
            left = self.dispatcher.running
            dispatching.cancel()
            await asyncio.wait({dispatching})
            logger.warning("{} turn(s) did not finish in time; they resume on the next start", left)
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


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()
