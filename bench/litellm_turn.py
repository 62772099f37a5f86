"""Issue 14, CPU of a plain turn through litellm: watched (streamed) and unwatched (whole).

A turn someone watches being written (a chat's, where the reply is edited in place as it
grows) asks litellm for a streamed answer; one nobody watches (`agent -m`, background tasks,
a channel with `stream: false`) asks for it whole, which litellm handles for under half the
CPU (it spends some 250 µs on each streamed chunk). This benchmark measures both, beside the
bare `litellm.acompletion` each makes, with the app's own stack (`agent.transport: litellm`)
against the fake model in its own process. Every round runs the four items once, in a
shuffled order; each is charged the CPU of this process (all threads) until it returned and
the tasks it started finished. Medians over the rounds; nanobot's part is the median of the
per-round differences turn − bare call of the same kind.

The issue's target: a plain turn costs no more CPU than the original nanobot's, measured at
8.5 ms on an earlier machine of this kind, *without streaming*, where a bare unstreamed
litellm call cost 3.2 ms (docs/benchmarks.md, issue 14). Machines differ several-fold, so the
original's cost is carried over as 8.5 / 3.2 = 2.66 bare unstreamed calls of this run.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench._common import write_results
from bench._turns.fake import ProcessFake
from bench._turns.harness import Bench, Request
from bench._turns.stack import bench_config, open_stack
from bench._turns.timing import Samples, Timing
from nanobot import log

NAME = "litellm_turn"
WARMUP_ROUNDS, ROUNDS = 10, 80
SEED = 14
ORIGINAL_MS, ORIGINAL_BARE_MS = 8.5, 3.2  # the original's turn and a bare unstreamed call then
ITEMS = ("turn watched", "bare streamed", "turn unwatched", "bare whole")


async def measure() -> Samples:
    rng = random.Random(SEED)
    samples = Samples()
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-litellm-") as tmp:
        async with (
            ProcessFake.running() as fake,
            open_stack(bench_config(Path(tmp) / "data", fake.base_url)) as stack,
        ):
            b = Bench(stack, fake, "litellm")
            _, (request,) = await b.turn(b.key())
            for index in range(WARMUP_ROUNDS + ROUNDS):
                await _round(b, request, rng, samples if index >= WARMUP_ROUNDS else None)
    return samples


async def _round(b: Bench, request: Request, rng: random.Random, samples: Samples | None) -> None:
    async def turn(watched: bool) -> Timing:
        timing, _ = await b.turn(b.key(), watched=watched)
        return timing

    items: dict[str, Callable[[], Awaitable[Timing]]] = {
        "turn watched": lambda: turn(True),
        "bare streamed": lambda: b.bare(request, streamed=True),
        "turn unwatched": lambda: turn(False),
        "bare whole": lambda: b.bare(request, streamed=False),
    }
    order = list(ITEMS)
    rng.shuffle(order)
    for name in order:
        timing = await items[name]()
        if samples is not None:
            samples.add(name, timing)


def main() -> None:
    for name in [n for n in os.environ if n.startswith("NANOBOT_")]:
        del os.environ[name]  # the Config built here must be exactly this benchmark's
    log.setup(level="WARNING")
    load_before = os.getloadavg()
    print(f"{WARMUP_ROUNDS} warm-up + {ROUNDS} rounds of {', '.join(ITEMS)} ...", flush=True)
    s = asyncio.run(measure())
    cpu = {name: s.median(name, "cpu") for name in ITEMS}
    ours = {
        kind: statistics.median(
            t - c
            for t, c in zip(s.ms(f"turn {kind}", "cpu"), s.ms(f"bare {bare}", "cpu"), strict=True)
        )
        for kind, bare in (("watched", "streamed"), ("unwatched", "whole"))
    }
    original = ORIGINAL_MS / ORIGINAL_BARE_MS * cpu["bare whole"]
    print(f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"{'CPU per item (median, ms)':<52}{'':>10}")
    for name in ITEMS:
        print(f"  {name:<50}{cpu[name]:>10.2f}")
    print(f"  {'nanobot part, watched (turn - bare streamed)':<50}{ours['watched']:>10.2f}")
    print(f"  {'nanobot part, unwatched (turn - bare whole)':<50}{ours['unwatched']:>10.2f}")
    print(f"  {'the original, carried over (2.66 bare whole)':<50}{original:>10.2f}")
    for kind in ("watched", "unwatched"):
        ratio = cpu[f"turn {kind}"] / original
        verdict = "met" if ratio <= 1 else "not met"
        print(f"  turn {kind} / the original: {ratio:.2f}x (target <= 1.00x: {verdict})")
    path = write_results(
        NAME,
        {
            "rounds": ROUNDS,
            "load_average": [load_before[0], os.getloadavg()[0]],
            "cpu_ms": cpu,
            "nanobot_part_ms": ours,
            "original_carried_over_ms": original,
            "ratio_to_original": {k: cpu[f"turn {k}"] / original for k in ("watched", "unwatched")},
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
