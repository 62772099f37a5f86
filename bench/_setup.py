"""A gateway under test for the gateway benchmarks: its config, starting it next to its own
fake Telegram and a fake model (each a process of its own, see bench/_gateway.py), and one
burst of chats on it with what became of them.

The scenario is `gateway_throughput`'s, shared by the benchmarks that compare against it
(cluster, _burst): a model that answers each chat's first call with a ``list_dir`` tool call
and the next with the text, 200 ms before the first byte of every answer.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import REPO_ROOT, BenchError, isolated_env
from bench._gateway import Child, RssSampler, cpu_seconds, hwm_kib
from tests.fakes.telegram import DEFAULT_TOKEN
from tests.gateway_process import GatewayProcess

PYTHON = sys.executable

MODEL_DELAY_S = 0.2
TOOL_CALL = {"name": "list_dir", "arguments": {"path": "."}}
USER_TEXT = "What is in my workspace?"
FINAL_TEXT = "Your workspace holds the usual files: memory, skills and notes."
ZERO_MS_TEXT = "Hello! The fake model answered this at once."

BURST_CHATS = 20  # a small burst: it records every bot message (its timeline)
WARMUP_CHATS = 4  # one warm-up burst per gateway: lazy imports, first-call set-up
BURST_TIMEOUT_S = 120.0


@dataclass
class Setup:
    """One gateway under test, its own fake Telegram and the fake model it calls."""

    name: str
    gateway: GatewayProcess
    telegram: Child
    llm: Child
    next_chat: int = 1_000_000

    @property
    def pid(self) -> int:
        assert self.gateway.process is not None
        return self.gateway.process.pid

    def chats(self, count: int) -> list[int]:
        """``count`` chats (private, user id = chat id) this gateway has never seen."""
        first, self.next_chat = self.next_chat, self.next_chat + count
        return list(range(first, first + count))


@dataclass(frozen=True)
class Burst:
    """``chats`` messages queued at once on one gateway, and what became of them.

    Times are seconds since the messages were queued at the fake Telegram.
    """

    config: str
    chats: int
    complete: bool  # every chat got its final reply (else: stopped looking at the cap)
    looked_s: float  # how long it was watched: until the last reply, or the cap
    taken_s: float | None  # the getUpdates that acknowledged the last message, if seen
    first_s: list[float]  # per chat that got one: its first bot message
    final_s: list[float]  # per chat that got it: its final text
    verified: int  # chats that show the final text
    two_messages: int  # chats whose reply left a separate partial message behind
    api_calls: dict[str, int]
    cpu_s: dict[str, float]  # gateway, telegram, model: CPU used while watched
    timeline: list[tuple[float, str, int]] = field(default_factory=list)
    rss_before_mib: float = 0.0
    rss_peak_mib: float = 0.0
    hwm_after_mib: float = 0.0
    rss_samples: int = 0

    @property
    def wall(self) -> float:
        """Until the last final reply."""
        if not self.complete:
            raise BenchError(f"{self.config}: the burst did not complete")
        return max(self.final_s)

    def answered_by(self, seconds: float) -> int:
        return sum(1 for t in self.final_s if t <= seconds)

    @property
    def rss_growth_mib(self) -> float:
        return self.rss_peak_mib - self.rss_before_mib


def gateway_config(
    root: Path, llm_url: str, telegram_url: str, turns: int | None, transport: str
) -> dict[str, Any]:
    agent: dict[str, Any] = {
        "model": "openai/fake-model",
        "api_base": llm_url,
        "api_key": "sk-bench-not-a-secret",
        "max_retries": 0,
        "transport": transport,
    }
    if turns is not None:
        agent["max_concurrent_turns"] = turns
    return {
        "data_dir": str(root / "data"),
        "agent": agent,
        "channels": {
            "telegram": {
                "enabled": True,
                "token": DEFAULT_TOKEN,
                "allow_from": ["*"],
                "api_base": telegram_url,
            }
        },
        "gateway": {"shutdown_timeout": 5},
    }


async def start_llm(
    tmp: Path, name: str, delay: float, default: dict[str, Any], *, keep_requests: int | None = None
) -> tuple[Child, str]:
    """The fake model, answering every call with `default` after `delay` seconds; the child
    and its URL. `keep_requests`: how many requests it keeps to be read back (its own default
    otherwise)."""
    script = tmp / f"{name}.json"
    script.write_text(json.dumps({"default": default}), encoding="utf-8")
    argv = [PYTHON, "-m", "tests.fakes.llm", "--port", "0", "--delay", str(delay)]
    argv += ["--script", str(script)]
    if keep_requests is not None:
        argv += ["--keep-requests", str(keep_requests)]
    child = await Child.start(name, argv, isolated_env(tmp), REPO_ROOT, tmp / f"{name}.log")
    url = await child.line(60)
    if not url.startswith("http://"):
        raise BenchError(f"{name}: unexpected first line {url!r}")
    return child, url


async def start_telegram(tmp: Path, name: str) -> tuple[Child, str]:
    argv = [PYTHON, "-m", "bench._gateway", "telegram"]
    child = await Child.start(name, argv, isolated_env(tmp), REPO_ROOT, tmp / f"{name}.log")
    return child, str(json.loads(await child.line(60))["base_url"])


async def start_echo_bot(tmp: Path, telegram_url: str) -> Child:
    """The baseline: a bare python-telegram-bot echo bot polling the fake at `telegram_url`."""
    argv = [PYTHON, "-m", "bench._gateway", "echo-bot", telegram_url]
    return await Child.start("echo-bot", argv, isolated_env(tmp), REPO_ROOT, tmp / "echo-bot.log")


def _slug(name: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in name).split())


async def start_gateway(
    tmp: Path,
    name: str,
    llm: tuple[Child, str],
    config: tuple[int | None, str],
    children: list[Child],
) -> Setup:
    root = tmp / f"gateway-{_slug(name)}"
    root.mkdir()
    telegram, telegram_url = await start_telegram(tmp, f"telegram-{_slug(name)}")
    children.append(telegram)
    turns, transport = config
    gateway = GatewayProcess(
        root, gateway_config(root, llm[1], telegram_url, turns, transport), isolated_env(root)
    )
    setup = Setup(name, gateway, telegram, llm[0])
    await gateway.start(ready="telegram connected")
    return setup


def _cpu(setup: Setup) -> dict[str, float]:
    return {
        "gateway": cpu_seconds(setup.pid),
        "telegram": cpu_seconds(setup.telegram.pid),
        "model": cpu_seconds(setup.llm.pid),
    }


async def run_burst(
    setup: Setup, chats: int, *, seconds: float = BURST_TIMEOUT_S, cap: bool = False
) -> Burst:
    """Queue one message in each of ``chats`` fresh chats; wait for every final reply (or,
    with ``cap``, for at most ``seconds``)."""
    command = {
        "op": "burst",
        "chats": setup.chats(chats),
        "text": USER_TEXT,
        "final": FINAL_TEXT,
        "timeout": seconds,
        "timeline": chats <= BURST_CHATS,
    }
    cpu_before = _cpu(setup)
    sampler = RssSampler(setup.pid)
    async with sampler:
        answer = await setup.telegram.ask(command, seconds + 30)
    cpu_after = _cpu(setup)
    complete = bool(answer["complete"]) and answer["verified"] == chats
    if not complete and not cap:
        raise BenchError(
            f"{setup.name}: {len(answer['final'])} of {chats} chats got their final reply "
            f"in {seconds:g} s ({answer['verified']} show it); api calls: {answer['api_calls']}"
        )
    start = float(answer["injected_at"])
    taken = answer["taken_at"]
    final_s = sorted(float(t) - start for t in answer["final"].values())
    return Burst(
        config=setup.name,
        chats=chats,
        complete=complete,
        looked_s=max(final_s) if complete else seconds,
        taken_s=None if taken is None else float(taken) - start,
        first_s=sorted(float(t) - start for t in answer["first"].values()),
        final_s=final_s,
        verified=int(answer["verified"]),
        two_messages=int(answer["chats_with_two_messages"]),
        api_calls=dict(answer["api_calls"]),
        cpu_s={k: cpu_after[k] - cpu_before[k] for k in cpu_before},
        timeline=[(float(t), str(m), int(c)) for t, m, c in answer.get("timeline", [])],
        rss_before_mib=sampler.before / 1024,
        rss_peak_mib=sampler.peak / 1024,
        hwm_after_mib=hwm_kib(setup.pid) / 1024,
        rss_samples=sampler.samples,
    )


async def run_sequence(
    telegram: Child, texts: Sequence[str], final: str | None, *, chat: int, pause: float
) -> tuple[list[float], list[float]]:
    """One message at a time in `chat`, the next `pause` seconds after the previous reply was
    final (`final` None: the reply repeats the message): (to the first bot message, to the
    final), per message."""
    command = {
        "op": "sequence",
        "chat": chat,
        "texts": list(texts),
        "final": final,
        "pause": pause,
        "timeout": 30.0,
    }
    answer = await telegram.ask(command, 30.0 * len(texts) + 30)
    if not answer["complete"]:
        raise BenchError(f"{telegram.name}: no reply to {answer['stuck_on']!r}")
    return [float(v) for v in answer["first"]], [float(v) for v in answer["final"]]
