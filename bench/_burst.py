"""One gateway, one burst: a quick look at the 1,000-chat figure of `gateway_throughput`.

``python -m bench._burst [--transport litellm] [--chats 1000] [--cap 120] [--turns N]``
starts the fake model (200 ms, a tool call then the text), a fake Telegram and one real
``nanobot gateway`` exactly as `gateway_throughput` does, sends a warm-up burst, then one
burst of ``--chats`` fresh chats, watched for at most ``--cap`` seconds, and prints one JSON
line: how many were answered and when (first, median, last; how many by 5, 10, 20, ... s),
when intake had taken them all, the CPU seconds of the gateway and of the fakes, RSS growth
and the Bot API calls.

It runs against the nanobot its interpreter imports, so a before/after pair is this module
run from each tree's own venv, alternating (a minute or two each): e.g.
``cd /tmp/before && .venv/bin/python -m bench._burst`` (copy this file there if that tree
has none), then the same in this tree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench import gateway_throughput as g
from bench._gateway import Child
from bench._setup import (
    FINAL_TEXT,
    MODEL_DELAY_S,
    TOOL_CALL,
    WARMUP_CHATS,
    Setup,
    run_burst,
    start_gateway,
    start_llm,
)

MARKS_S = (5, 10, 20, 30, 40, 60, 90, 120, 180)


async def burst(transport: str, chats: int, cap: float, turns: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-burst-") as name:
        tmp = Path(name)
        children: list[Child] = []
        reply = {"type": "ToolThenText", "call": TOOL_CALL, "text": FINAL_TEXT}
        llm = await start_llm(tmp, "model-200ms", MODEL_DELAY_S, reply)
        children.append(llm[0])
        setup: Setup | None = None
        try:
            setup = await start_gateway(tmp, "gateway", llm, (turns, transport), children)
            await run_burst(setup, WARMUP_CHATS)
            await asyncio.sleep(1.0)
            b = await run_burst(setup, chats, seconds=cap, cap=True)
        finally:
            if setup is not None:
                await setup.gateway.kill()
            for child in children:
                await child.stop()
    final = b.final_s
    return {
        "tree": str(Path.cwd()),
        "transport": transport,
        "max_concurrent_turns": turns,
        "chats": chats,
        "cap_s": cap,
        "answered": len(final),
        "complete": b.complete,
        "first_s": min(final, default=None),
        "median_s": statistics.median(final) if final else None,
        "last_s": max(final, default=None),
        "answered_by": {t: b.answered_by(t) for t in MARKS_S if t <= cap},
        "taken_s": b.taken_s,
        "cpu_s": b.cpu_s,
        "gateway_cpu_ms_per_answered": 1000 * b.cpu_s["gateway"] / max(1, len(final)),
        "rss_growth_mib": b.rss_growth_mib,
        "api_calls": b.api_calls,
        "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench._burst", description=__doc__)
    parser.add_argument("--transport", default="litellm", help="agent.transport")
    parser.add_argument("--chats", type=int, default=g.BIG_CHATS)
    parser.add_argument("--cap", type=float, default=120.0, help="seconds watched at most")
    parser.add_argument("--turns", type=int, default=None, help="max_concurrent_turns")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(burst(args.transport, args.chats, args.cap, args.turns))))


if __name__ == "__main__":
    main()
