"""Issue 3, per-turn overhead: what nanobot adds to a model call that answers in 0 ms.

Everything runs in this process and its event loop: nanobot's own composition root
(`nanobot.app.open_parts`: the `Provider` over a `LiteLLMTransport`, the real tools, SQLite
store, workspace template) in a temporary data dir, against the fake model server
tests/fakes/llm.py. These layers are measured in the same run, interleaved in a shuffled
order every round:

1. a bare ``litellm.acompletion(stream=True)`` consumed to its end, with exactly the messages
   and tools the turn sends (as the fake server received them, or as a thin recording wrapper
   around the provider saw them in the long session, where they change every turn);
2. ``Provider.complete()`` with the same messages and tools;
3. the whole turn, ``AgentLoop.handle()``;
0. the whole turn with an instant provider: the same app on the same database, whose model
   calls return the fake's answer at once, without litellm or HTTP: nanobot alone.

nanobot's overhead is (3) - (1) for a plain turn and (3) - (1a) - (1b) for a turn with one
tool call (two model calls). Each measurement lasts until the call returned *and* the
asyncio tasks it started (litellm's post-stream logging and caching tasks) have finished:
inside a turn those tasks run before the turn ends, so without this the bare call would be
charged less than its real cost. Wall-clock time is the figure; this process's CPU time over
the same interval is recorded too, as it does not grow when other processes take the CPU.
The fake runs in a separate process (its CPU is not on the measured event loop); a shorter
in-process variant is measured too.

The long-session part fills a session with 10,000 entries and compares turns there with
turns in empty sessions: whole, minus the bare litellm call with the same messages, and with
the instant provider. The stacks above are `agent.transport: litellm`; the same app with the
default transport (`auto`, which calls this model directly, as litellm would send the same
request) is measured alongside, in interleaved rounds and in rounds of its own. A profile
(cProfile) of plain turns says where the time goes, and micro-measurements price nanobot's
per-turn operations without the profiler's inflation.

The parts live in `bench/_turns/`: the fake model (`fake`), the app with its recording
provider (`stack`), timing and samples (`timing`), the layers of one call (`harness`), the
phases (`empty_sessions`, `transcript`, `long_session`), `profiling`, `micro`, the run
(`measure`), the table's rows (`metrics`) and the printed report and JSON (`report`).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from bench._common import write_results
from bench._turns.measure import measure
from bench._turns.metrics import metrics_of
from bench._turns.report import report
from nanobot import log

NAME = "turn_overhead"


def main() -> None:
    for name in [n for n in os.environ if n.startswith("NANOBOT_")]:
        del os.environ[name]  # the Config built here must be exactly this benchmark's
    log.setup(level="WARNING")
    load_before = os.getloadavg()
    m = asyncio.run(measure())
    load_after = os.getloadavg()
    metrics = metrics_of(m)
    payload = report(m, metrics)
    print(
        f"Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; "
        f"after: {', '.join(f'{x:.2f}' for x in load_after)} (other processes slow every figure)."
    )
    payload["load_average"] = {"before": load_before, "after": load_after}
    path = write_results(NAME, payload)
    print(f"\nResults: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
