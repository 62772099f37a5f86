"""Issue 31, budgets: what holding each model call against the budgets costs.

1. **The check per model call, in process, on SQLite**: `TurnSpend.reserve` (the expected
   cost counted from a 12-message conversation, held against the install's daily and
   monthly and the person's daily budget in one conditional statement) and
   `TurnSpend.spent` (the hold replaced by the cost, the budgets' spend upserted), as a
   model call pays them, one call after another on a fresh state file. Median of
   ``CALLS`` calls, in ``ROUNDS`` rounds (the round medians' median is the figure).
2. **The 1,000-chat burst** of `gateway_throughput` (one real `nanobot gateway`, the fake
   model at 200 ms, a tool call then the text: two model calls a chat), with a `budget`
   section against without; both price the fake model (`agent.prices`), so the check
   counts and holds real amounts. Alternating, ``BURST_ROUNDS`` rounds each; the ratio
   of the medians of the time to the last answer is the figure, that of the gateway's
   CPU seconds beside it (less moved by other load on the machine).

``python -m bench budget`` (the burst needs a few minutes; ``--micro`` alone skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import isolated_env, write_results
from bench._gateway import Child
from bench._setup import (
    FINAL_TEXT,
    MODEL_DELAY_S,
    TOOL_CALL,
    WARMUP_CHATS,
    Setup,
    gateway_config,
    run_burst,
    start_llm,
    start_telegram,
)
from nanobot import log
from nanobot.agent.budget import Budgets, BudgetSettings, Caps
from nanobot.providers.base import Usage
from nanobot.providers.catalog import Prices
from nanobot.providers.tokens import TokenCounter
from nanobot.store import Database
from nanobot.store.budgets import BudgetStore
from tests.gateway_process import GatewayProcess

NAME = "budget"
CALLS = 2000
ROUNDS = 5
BURST_CHATS = 1000
BURST_ROUNDS = 5
TARGET_CHECK_MS = 0.3
TARGET_RATIO = 1.1
PRICE = Prices(1e-6, 4e-6)
BUDGET = {
    "daily": 1e6,
    "monthly": 1e7,
    "person": {"daily": 1e5},
    "max_cost": 100.0,
}
PRICES = {"openai/fake-model": {"input": 1.0, "output": 4.0}}


def _conversation() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are nanobot. " * 200}]
    for n in range(11):
        role = "user" if n % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"message {n}: " + "words and more " * 30})
    return messages


async def check_per_call() -> dict[str, Any]:
    """Milliseconds of reserve + spent per model call, per round."""
    counter = TokenCounter("openai/fake-model")
    messages = _conversation()
    settings = BudgetSettings(
        install=Caps(daily=1e6, monthly=1e7), person=Caps(daily=1e5), max_cost=100.0
    )
    medians = []
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-budget-") as name:
        async with await Database.open(Path(name) / "state.db") as db:
            budgets = Budgets(
                BudgetStore(db),
                settings,
                price=lambda _model: PRICE,
                count=counter.count,
                model="openai/fake-model",
                max_tokens=4096,
            )
            usage = Usage(2000, 300, PRICE.cost(2000, 300), reported=True)
            for _ in range(ROUNDS):
                times = []
                for call in range(CALLS):
                    spend = budgets.for_turn(f"person{call % 50}", "chat", "telegram")
                    started = time.perf_counter()
                    refused = await spend.reserve(messages)
                    await spend.spent(usage)
                    times.append(time.perf_counter() - started)
                    assert refused is None, refused
                medians.append(1000 * statistics.median(times))
    return {"round_medians_ms": medians, "median_ms": statistics.median(medians)}


async def _gateway(tmp: Path, name: str, llm: tuple[Child, str], budget: bool) -> Setup:
    root = tmp / name
    root.mkdir()
    telegram, url = await start_telegram(tmp, f"telegram-{name}")
    config = gateway_config(root, llm[1], url, None, "direct")
    config["agent"]["prices"] = PRICES
    if budget:
        config["budget"] = BUDGET
    gateway = GatewayProcess(root, config, isolated_env(root))
    setup = Setup(name, gateway, telegram, llm[0])
    await gateway.start(ready="telegram connected")
    return setup


async def bursts() -> dict[str, Any]:
    """Seconds to the last answer of each burst, with and without budgets, alternating."""
    walls: dict[str, list[float]] = {"without": [], "with": []}
    cpus: dict[str, list[float]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-budget-burst-") as name:
        tmp = Path(name)
        reply = {"type": "ToolThenText", "call": TOOL_CALL, "text": FINAL_TEXT}
        llm = await start_llm(tmp, "model-200ms", MODEL_DELAY_S, reply)
        try:
            for index in range(BURST_ROUNDS * 2):
                kind = ("without", "with")[index % 2]
                setup = await _gateway(tmp, f"{kind}-{index}", llm, kind == "with")
                try:
                    await run_burst(setup, WARMUP_CHATS)
                    await asyncio.sleep(1.0)
                    burst = await run_burst(setup, BURST_CHATS)
                    walls[kind].append(burst.wall)
                    cpus[kind].append(burst.cpu_s["gateway"])
                    print(
                        f"  {kind} budgets: {burst.wall:.2f} s, gateway CPU "
                        f"{burst.cpu_s['gateway']:.2f} s",
                        flush=True,
                    )
                finally:
                    await setup.gateway.kill()
                    await setup.telegram.stop()
        finally:
            await llm[0].stop()
    ratio = statistics.median(walls["with"]) / statistics.median(walls["without"])
    cpu_ratio = statistics.median(cpus["with"]) / statistics.median(cpus["without"])
    return {"walls_s": walls, "cpu_s": cpus, "ratio": ratio, "cpu_ratio": cpu_ratio}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench budget", description=__doc__)
    parser.add_argument("--micro", action="store_true", help="only the check per call")
    args = parser.parse_args(argv if argv is not None else [a for a in sys.argv[1:] if a != NAME])
    log.setup(level="WARNING")
    payload: dict[str, Any] = {"check": asyncio.run(check_per_call())}
    check = payload["check"]["median_ms"]
    print(
        f"budget check per model call (SQLite, in process): {check:.3f} ms median "
        f"(target <= {TARGET_CHECK_MS} ms); rounds: "
        + ", ".join(f"{m:.3f}" for m in payload["check"]["round_medians_ms"])
    )
    if not args.micro:
        payload["burst"] = asyncio.run(bursts())
        ratio = payload["burst"]["ratio"]
        cpu = payload["burst"]["cpu_ratio"]
        print(
            f"1,000-chat burst, with budgets / without: {ratio:.3f}x time to the last answer "
            f"(target <= {TARGET_RATIO}), {cpu:.3f}x gateway CPU (medians)"
        )
    path = write_results(NAME, payload)
    print(f"Results: {path}")


if __name__ == "__main__":
    main()
