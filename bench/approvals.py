"""Issue 15, approvals: from a press to the tool starting, and what waiting runs cost.

Everything runs in this process and its event loop, as tests/test_approver.py has it: the
real gate, journal, bus, dispatcher, agent loop, runner and approver over SQLite (a
temporary data dir), litellm against the fake OpenAI-compatible server tests/fakes/llm.py
(in process, 0 ms replies), a policy where the test tool ``echo`` asks. Outbound records go
to a collector standing in for the channels: it confirms each outbox row, as a channel does
once a message is delivered, and feeds ``Typing`` to a real ``TypingIndicator`` with
Telegram's timing whose ``send`` only counts (the platform call itself is not made).
Every chat is a private chat of its own user; the fake answers a chat's first call with an
``echo`` call and, after the tool result, with text (``ToolThenText``).

1. Press to tool start: one chat at a time writes, its card arrives, SETTLE_S later (a
   person takes seconds) its "Allow once" button is pressed: an ``InboundMessage`` with
   ``press`` and the button's data as text, handed to the gate as a channel does. The time
   from handing it over to the first line of the tool's ``run`` (``EchoTool.on_call``) is
   nanobot's alone: no model call lies on that path. ROUNDS rounds of APPROVALS after
   WARMUP approvals; the median and the worst of each round.
2. Waiting at once: WAITING chats write at once and each run waits on its card. Process CPU
   (``time.process_time``, all threads) over an idle window of ``idle_s`` seconds, with
   nothing waiting (before) and with the WAITING runs waiting; voluntary context switches
   and the typing signals the indicator sent in the window say whether anything woke up.
   Then bursts of BURST fresh chats answered with text only (gate to the last reply),
   alternately with the WAITING runs waiting and with none (the runs are denied and new
   ones started between), in ABBA order: chats per second, and the ratio of each pair.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench._common import Metric, format_table, write_results
from nanobot import log
from nanobot.agent.approvals import ApprovalPolicy
from nanobot.agent.approver import Approver
from nanobot.agent.dispatcher import Dispatcher
from nanobot.bus.events import ChatRef, InboundMessage, OutboundMessage, Typing
from nanobot.bus.queue import MessageBus
from nanobot.channels._typing import DELAY, TypingIndicator
from nanobot.channels.telegram import TYPING_INTERVAL
from nanobot.gate import ChannelRules, Gate
from nanobot.store import Access, ApprovalStore, Database, Journal
from tests.fakes.llm import Call, Echo, FakeLLM, ToolThenText
from tests.test_loop import Parts, make_parts

NAME = "approvals"
APPROVALS, ROUNDS, WARMUP = 100, 3, 10
WAITING, BURST, PAIRS = 100, 200, 3  # PAIRS of bursts each way
IDLE_S = 60.0  # the idle window; `--idle` (or BENCH_IDLE_S) changes it
SETTLE_S = 0.05  # between a card arriving and its button being pressed
LIMIT_S = 120.0  # any one wait of the benchmark; beyond it the run failed
TARGET_MS, TARGET_IDLE_PCT = 20.0, 1.0
ASKING = ToolThenText(Call("echo", {"text": "rm -rf build"}), "Done.")
Key = tuple[str, str]  # (what: "card" | "reply", chat id)


class Rig:
    """The in-process nanobot and the stand-in for its channels."""

    def __init__(self, parts: Parts, db: Database, fake: FakeLLM, workspace: Path) -> None:
        self.parts, self.fake = parts, fake
        self.bus = MessageBus()
        self.journal = Journal(db)
        rules = {"telegram": ChannelRules(frozenset({"*"}))}
        self.gate = Gate(rules, Access(db), self.journal, self.bus)
        policy = ApprovalPolicy(tools={"echo": "ask"}, timeout=timedelta(minutes=10))
        store = ApprovalStore(db)
        self.approver = Approver(
            store, policy, {"telegram": ()}, self.journal, self.bus, workspace=workspace
        )
        parts.loop.approver = self.approver
        self.dispatcher = Dispatcher(parts.loop, self.bus, self.journal)
        self.typing = TypingIndicator(self._signal, TYPING_INTERVAL, delay=DELAY, name="telegram")
        self.signals = 0
        self.tool_started: float | None = None
        parts.echo.on_call = self._tool
        self._expected: dict[Key, asyncio.Future[OutboundMessage]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._users = 0

    async def start(self) -> None:
        self.typing.start()
        self._tasks = [
            asyncio.create_task(self.dispatcher.run()),
            asyncio.create_task(self._collect()),
        ]

    async def stop(self) -> None:
        self.bus.close_inbound()
        await asyncio.wait_for(self._tasks[0], 30)
        self.bus.close_outbound()
        await asyncio.wait_for(self._tasks[1], 30)
        await self.typing.stop()

    def _tool(self, _text: str) -> None:
        self.tool_started = time.perf_counter()

    async def _signal(self, _chat: ChatRef) -> None:
        self.signals += 1

    async def _collect(self) -> None:
        async for item in self.bus.outbound("telegram"):
            if isinstance(item, Typing):
                await self.typing.update(item)
                continue
            if not isinstance(item, OutboundMessage):
                continue
            if item.outbox_id is not None:
                await self.journal.confirm(item.outbox_id)
            what = "card" if item.kind == "card" and item.buttons else item.kind
            future = self._expected.pop((what, item.chat.chat_id), None)
            if future is not None and not future.done():
                future.set_result(item)

    def expect(self, what: str, chat_id: str) -> asyncio.Future[OutboundMessage]:
        future = asyncio.get_running_loop().create_future()
        self._expected[(what, chat_id)] = future
        return future

    def user(self) -> str:
        self._users += 1
        return str(1000 + self._users)

    async def say(self, user: str, text: str = "clean up the build") -> None:
        chat = ChatRef("telegram", user)
        await self.gate(InboundMessage.from_chat(chat, user, text, f"m{user}", is_private=True))

    async def press(self, user: str, data: str) -> None:
        chat, press = ChatRef("telegram", user), f"p{user}"
        await self.gate(
            InboundMessage.from_press(chat, user, data, press, message_id=press, is_private=True)
        )

    async def waiting(self, count: int) -> None:
        """Until `count` runs wait on their card (the approver's own table of waits)."""
        async with asyncio.timeout(LIMIT_S):
            while len(self.approver._waits) != count:  # noqa: ASYNC110 - setup, never measured
                await asyncio.sleep(0.01)


async def approve_one(rig: Rig) -> float:
    """One chat asks, its card is pressed: ms from the press at the gate to the tool."""
    user = rig.user()
    card, reply = rig.expect("card", f"@{user}"), rig.expect("reply", user)
    await rig.say(user)
    async with asyncio.timeout(LIMIT_S):
        shown = await card
    await rig.waiting(1)
    await asyncio.sleep(SETTLE_S)
    rig.tool_started = None
    pressed = time.perf_counter()
    await rig.press(user, shown.buttons[0].data)  # Allow once
    async with asyncio.timeout(LIMIT_S):
        await reply
    assert rig.tool_started is not None, "the tool did not run"
    return (rig.tool_started - pressed) * 1000


async def start_waits(rig: Rig, count: int) -> list[tuple[str, OutboundMessage]]:
    """`count` chats write at once; each run waits on its card."""
    rig.fake.default_reply = ASKING
    users = [rig.user() for _ in range(count)]
    cards = [rig.expect("card", f"@{u}") for u in users]
    await asyncio.gather(*(rig.say(u) for u in users))
    async with asyncio.timeout(LIMIT_S):
        shown = await asyncio.gather(*cards)
    rig.fake.default_reply = Echo()  # what follows answers with text only
    await rig.waiting(count)
    return list(zip(users, shown, strict=True))


async def release(rig: Rig, waits: Sequence[tuple[str, OutboundMessage]]) -> None:
    """Deny every waiting call; until each chat has its final reply."""
    replies = [rig.expect("reply", user) for user, _ in waits]
    await asyncio.gather(*(rig.press(user, card.buttons[-1].data) for user, card in waits))
    async with asyncio.timeout(LIMIT_S):
        await asyncio.gather(*replies)
    await rig.waiting(0)


async def burst(rig: Rig, count: int) -> float:
    """`count` fresh chats write at once (text answers); chats answered per second."""
    users = [rig.user() for _ in range(count)]
    replies = [rig.expect("reply", u) for u in users]
    started = time.perf_counter()
    await asyncio.gather(*(rig.say(u, "hello") for u in users))
    async with asyncio.timeout(LIMIT_S):
        await asyncio.gather(*replies)
    return count / (time.perf_counter() - started)


async def idle(rig: Rig, seconds: float) -> dict[str, float]:
    """Process CPU, context switches and typing signals over `seconds` of nothing."""
    await asyncio.sleep(1.0)  # let what just finished settle (stream timers, typing tasks)
    signals = rig.signals
    before, cpu, wall = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.time()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu, time.time() - wall
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_pct": 100 * cpu / wall,
        "voluntary_switches": after.ru_nvcsw - before.ru_nvcsw,
        "involuntary_switches": after.ru_nivcsw - before.ru_nivcsw,
        "typing_signals": rig.signals - signals,
        "threads": threading.active_count(),
    }


async def measure(idle_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-approvals-") as name:
        tmp = Path(name)
        async with (
            FakeLLM(default_reply=ASKING, keep_requests=10) as fake,
            await Database.open(tmp / "state.db") as db,
        ):
            rig = Rig(await make_parts(tmp, fake, db), db, fake, tmp / "workspace")
            await rig.start()
            try:
                return await _phases(rig, idle_s)
            finally:
                await rig.stop()


async def _phases(rig: Rig, idle_s: float) -> dict[str, Any]:
    progress("warm-up")
    for _ in range(WARMUP):
        await approve_one(rig)
    await release(rig, await start_waits(rig, 20))
    await burst(rig, 50)
    rounds: list[list[float]] = []
    for index in range(ROUNDS):
        rig.fake.default_reply = ASKING
        rounds.append([await approve_one(rig) for _ in range(APPROVALS)])
        progress(f"approvals round {index + 1}: median {statistics.median(rounds[-1]):.2f} ms")
    progress(f"idle {idle_s:.0f} s, nothing waiting")
    idle_none = await idle(rig, idle_s)
    progress(f"{WAITING} runs waiting; idle {idle_s:.0f} s")
    waits = await start_waits(rig, WAITING)
    idle_waiting = await idle(rig, idle_s)
    with_waits: list[float] = []
    without: list[float] = []
    for index, waiting in enumerate(_abba(PAIRS)):
        if waiting and not waits:
            waits = await start_waits(rig, WAITING)
        elif not waiting and waits:
            await release(rig, waits)
            waits = []
        (with_waits if waiting else without).append(await burst(rig, BURST))
        progress(f"burst {index + 1}: {'waiting' if waiting else 'none'}")
    if waits:
        await release(rig, waits)
    return {
        "latencies_ms": rounds,
        "idle_none": idle_none,
        "idle_waiting": idle_waiting,
        "burst_waiting": with_waits,
        "burst_none": without,
    }


def _abba(pairs: int) -> list[bool]:
    """True (runs waiting) and False (none) in ABBA order: W N N W W N ..."""
    return [(i + 1) // 2 % 2 == 0 for i in range(2 * pairs)]


def metrics_of(m: dict[str, Any]) -> list[Metric]:
    rounds: list[list[float]] = m["latencies_ms"]
    everything = [x for r in rounds for x in r]
    idle_none, idle_waiting = m["idle_none"], m["idle_waiting"]
    ratios = [w / n for w, n in zip(m["burst_waiting"], m["burst_none"], strict=True)]
    note = f"over {APPROVALS} approvals, one chat at a time; per round"
    return [
        Metric("press -> tool start: median", "ms", [statistics.median(r) for r in rounds],
               TARGET_MS, note),
        Metric("press -> tool start: 90th percentile", "ms", [_pct(r, 0.9) for r in rounds]),
        Metric("press -> tool start: worst", "ms", [max(r) for r in rounds]),
        Metric(f"press -> tool start: all {len(everything)}", "ms", everything),
        Metric(f"idle CPU, {WAITING} runs waiting", "%", [idle_waiting["cpu_pct"]],
               TARGET_IDLE_PCT, "of one core, process CPU over the idle window"),
        Metric(f"idle CPU time, {WAITING} waiting", "ms", [1000 * idle_waiting["cpu_s"]]),
        Metric("idle CPU time, nothing waiting", "ms", [1000 * idle_none["cpu_s"]]),
        Metric(f"typing signals in the window, {WAITING} waiting", "calls",
               [idle_waiting["typing_signals"]]),
        Metric(f"burst of {BURST} chats, {WAITING} runs waiting", "chats/s", m["burst_waiting"]),
        Metric(f"burst of {BURST} chats, nothing waiting", "chats/s", m["burst_none"]),
        Metric("burst throughput waiting / none (per pair)", "x", ratios),
    ]  # fmt: skip


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main(idle_s: float | None = None) -> None:
    if idle_s is None:
        idle_s = float(os.environ.get("BENCH_IDLE_S", IDLE_S))
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    log.setup(level="WARNING")
    load_before = os.getloadavg()
    m = asyncio.run(measure(idle_s))
    load_after = os.getloadavg()
    metrics = metrics_of(m)
    print(format_table(metrics))
    for label in ("idle_none", "idle_waiting"):
        print(f"{label}: " + ", ".join(f"{k} {v:.3f}" for k, v in m[label].items()))
    print(
        f"Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; "
        f"after: {', '.join(f'{x:.2f}' for x in load_after)}."
    )
    payload = {
        "idle_s": idle_s,
        "metrics": [x.as_json() for x in metrics],
        "idle": {"none": m["idle_none"], "waiting": m["idle_waiting"]},
        "load_average": {"before": load_before, "after": load_after},
    }
    print(f"\nResults: {write_results(NAME, payload)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.approvals", description=__doc__)
    parser.add_argument("--idle", type=float, default=None, help=f"seconds (default {IDLE_S})")
    main(parser.parse_args().idle)
