"""Issue 5, automation: cron firing accuracy and the heartbeat's idle cost.

Cron: 100 one-shot jobs are stored, all due at the same second a few seconds ahead, and the
real `CronService` (real SQLite store in a temporary directory) runs them; each run records
the wall-clock moment it was handed to the gate. The delay is start minus due time. Three rounds.

Heartbeat: the shipped HEARTBEAT.md (nothing actionable) is checked 48 times, a simulated day
at the default 30-minute interval, against an intake that counts the turns it would start.
"""

from __future__ import annotations

import asyncio
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench._common import Metric, format_table, write_results
from nanobot.bus.events import InboundMessage
from nanobot.cron.models import At
from nanobot.cron.service import CronService
from nanobot.heartbeat import Heartbeat
from nanobot.store import Database
from nanobot.store.cron import CronStore
from nanobot.workspace import bundled

NAME = "automation"
JOBS, ROUNDS, LEAD = 100, 3, 3.0


async def cron_round(directory: Path) -> list[float]:
    """Delays (ms) between due time and run start for JOBS jobs due together."""
    async with await Database.open(directory / "state.db") as db:
        store = CronStore(db)
        due = (datetime.now(UTC) + timedelta(seconds=LEAD)).replace(microsecond=0)
        for i in range(JOBS):
            await store.add(name=f"job {i}", message="tick", schedule=At(due), next_run=due)
        delays: list[float] = []
        done = asyncio.Event()

        class Intake:  # the gate: where a due run's event is handed in
            async def submit(self, message: InboundMessage) -> int | None:
                delays.append((datetime.now(UTC) - due).total_seconds() * 1000)
                if len(delays) == JOBS:
                    done.set()
                return len(delays)

        service = CronService(store, Intake(), catch_up_window=timedelta(hours=1))
        task = asyncio.create_task(service.run())
        await asyncio.wait_for(done.wait(), LEAD + 30)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return delays


async def heartbeat_day() -> int:
    calls = 0

    class Intake:  # the gate: each beat that asks for a turn is handed in here
        async def submit(self, message: InboundMessage) -> int | None:
            nonlocal calls
            calls += 1
            return calls

    beat = Heartbeat(bundled("workspace_template") / "HEARTBEAT.md", 1800, Intake(), None)
    for _ in range(48):
        await beat.beat()
    return calls


async def measure() -> list[Metric]:
    medians: list[float] = []
    worsts: list[float] = []
    for round_ in range(ROUNDS):
        with tempfile.TemporaryDirectory(prefix=f"nanobot-cron-{round_}-") as directory:
            delays = sorted(await cron_round(Path(directory)))
        medians.append(delays[len(delays) // 2])
        worsts.append(delays[-1])
    calls = await heartbeat_day()
    return [
        Metric("cron: median delay due -> start (100 jobs)", "ms", medians),
        Metric("cron: worst delay due -> start (100 jobs)", "ms", worsts),
        Metric("heartbeat: model calls, idle file, simulated day", "calls", [float(calls)], 0),
    ]


def main() -> None:
    metrics = asyncio.run(measure())
    print(f"=== {NAME} ===")
    print(format_table(metrics))
    path = write_results(NAME, {"metrics": [m.as_json() for m in metrics]})
    print(f"\nResults: {path}")
