"""Issue 24, the gateway: from exec to polling, and its idle RSS after one message.

Four gateways, each started afresh in every round (a new HOME, data dir and fake Telegram),
in an order that rotates from round to round, after one warm-up round:

- ``auto`` and ``direct``: our default config plus ``agent.api_base`` (the fake model) and a
  key, ``agent.transport`` auto or direct, Telegram on against a FakeTelegram
  (``channels.telegram.api_base``).
- ``default``: our default config as it stands, model openai/gpt-4o-mini with an api key and
  no api_base; the calls reach the fake through ``OPENAI_BASE_URL`` (litellm and our direct
  path both read it). Telegram on, as above.
- ``original``: nanobot-ai 0.3.5 (bench/_original.py) on its default config with the same
  model and key and Telegram on; the same ``OPENAI_BASE_URL``. It has no setting for the Bot
  API's URL, so it reaches its FakeTelegram through its ``proxy`` setting and a local proxy
  that plays api.telegram.org (bench/_telegram_tunnel.py).

Each is timed from just before its spawn (``time.monotonic()``, one clock for every process
on Linux) to the first ``getUpdates`` at its fake, and ours also to the line the gateway logs
as polling starts (``telegram connected``, nanobot/channels/manager.py: the channel's
``ready()``, called just before the first poll). Then one message is queued at the fake;
once the chat shows the reply, after ``SETTLE_S`` more, the idle RSS is the median of a few
readings of VmRSS summed over the gateway's process and its descendants (/proc), and the
peak its VmHWM. The fake model (tests/fakes/llm.py, 0 ms) and the fakes of Telegram run in
this process's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import _original
from bench._common import BenchError, Metric, format_table, isolated_env, write_results
from bench._gateway import Child, descendants, hwm_kib, tree_rss_kib
from bench._telegram_tunnel import Certificates, TelegramTunnel
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import GatewayProcess

NAME = "gateway_startup"
WARMUPS, ROUNDS = 1, 5
AUTO, DIRECT, DEFAULT, ORIGINAL = "auto", "direct", "default", "original"
OURS = (AUTO, DIRECT, DEFAULT)
MESSAGE, REPLY_PREFIX, CHAT = "hi", "echo: ", 42
POLLING = "telegram connected"  # the manager's line, once the first getUpdates was answered
START_LIMIT_S, REPLY_LIMIT_S = 90.0, 60.0
SETTLE_S = 5.0  # after the reply: typing stops, the outbox confirms, the turn's tasks end
SAMPLES, SAMPLE_GAP_S = 5, 0.2
POLLING_RATIO_TARGET = 1.25  # auto / direct, exec -> polling
IDLE_RATIO_TARGET = 1.0  # default / original, idle RSS


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Start:
    """One gateway, started, given one message, measured idle, stopped."""

    variant: str
    polling_s: float | None  # exec -> the "polling" log line (ours)
    first_poll_s: float  # exec -> the first getUpdates at its fake
    reply_s: float  # the message queued -> the chat shows the reply
    idle_rss_kib: int  # median VmRSS over the process tree, SETTLE_S after the reply
    peak_rss_kib: int  # VmHWM of the gateway's process
    processes: int  # in the tree when idle
    model_requests: int  # the message's turn

    @property
    def idle_rss_mib(self) -> float:
        return self.idle_rss_kib / 1024


@dataclass(frozen=True)
class Lab:
    """What every start shares: the fake model, the original (or why not) and its CA."""

    llm: FakeLLM
    tmp: Path
    original: _original.Original | str
    certs: Certificates | None

    def home(self, variant: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"gateway-{variant}-", dir=self.tmp))


def _our_config(variant: str, llm_url: str, telegram_url: str) -> dict[str, Any]:
    agent: dict[str, Any] = {"api_key": _original.API_KEY}
    if variant != DEFAULT:
        agent |= {"api_base": llm_url, "transport": variant}
    telegram = {"enabled": True, "token": DEFAULT_TOKEN, "allow_from": ["*"]}
    return {"agent": agent, "channels": {"telegram": telegram | {"api_base": telegram_url}}}


def _first_poll(telegram: FakeTelegram) -> float | None:
    return next((c.at for c in telegram.requests if c.method.lower() == "getupdates"), None)


def _replied(telegram: FakeTelegram) -> bool:
    """The fake model echoes the message; nanobot puts the time in front of it."""
    return any(
        m.visible.startswith(REPLY_PREFIX) and m.visible.strip().endswith(MESSAGE)
        for m in telegram.sent(CHAT)
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _measure(
    lab: Lab,
    telegram: FakeTelegram,
    *,
    variant: str,
    pid: int,
    launched: float,
    polling_at: float | None,
    tail: Callable[[], str],
) -> Start:
    """From a started gateway's first poll to its idle RSS after one message."""
    try:
        await telegram.wait_for(lambda: _first_poll(telegram) is not None, START_LIMIT_S)
        before = len(lab.llm.requests)
        queued = time.monotonic()
        telegram.user_message(CHAT, MESSAGE, user_id=CHAT)
        await telegram.wait_for(lambda: _replied(telegram), REPLY_LIMIT_S)
    except TimeoutError:
        raise BenchError(f"{variant} gateway: no poll or no reply in time{tail()}") from None
    replied = time.monotonic()
    requests = len(lab.llm.requests) - before
    if requests < 1:
        raise BenchError(f"{variant} gateway: its reply did not come from the fake model")
    await asyncio.sleep(SETTLE_S)
    samples = []
    for _ in range(SAMPLES):
        samples.append(tree_rss_kib(pid))
        await asyncio.sleep(SAMPLE_GAP_S)
    first_poll = _first_poll(telegram)
    assert first_poll is not None
    return Start(
        variant=variant,
        polling_s=None if polling_at is None else polling_at - launched,
        first_poll_s=first_poll - launched,
        reply_s=replied - queued,
        idle_rss_kib=int(statistics.median(samples)),
        peak_rss_kib=hwm_kib(pid),
        processes=1 + len(descendants(pid)),
        model_requests=requests,
    )


async def _ours(variant: str, lab: Lab) -> Start:
    root = lab.home(variant)
    async with FakeTelegram(token=DEFAULT_TOKEN) as telegram:
        config = _our_config(variant, lab.llm.base_url, telegram.base_url)
        extra = {"OPENAI_BASE_URL": lab.llm.base_url} if variant == DEFAULT else {}
        gateway = GatewayProcess(root, config, isolated_env(root, **extra))
        launched = time.monotonic()
        try:
            try:
                await gateway.start(ready=POLLING)
                index = await gateway.wait_log(POLLING)
                while not gateway.lines[index].endswith(POLLING):
                    index = await gateway.wait_log(POLLING, seconds=START_LIMIT_S, after=index + 1)
            except (AssertionError, TimeoutError) as exc:
                raise BenchError(f"{variant} gateway: {exc}") from None
            polling_at = time.monotonic()
            assert gateway.process is not None

            def tail() -> str:
                return "\nlog (tail):\n" + "\n".join(gateway.lines[-30:])

            return await _measure(
                lab,
                telegram,
                variant=variant,
                pid=gateway.process.pid,
                launched=launched,
                polling_at=polling_at,
                tail=tail,
            )
        finally:
            try:
                await gateway.stop(seconds=20)
            except TimeoutError:
                await gateway.kill()


async def _theirs(lab: Lab) -> Start:
    assert isinstance(lab.original, _original.Original) and lab.certs is not None
    root = lab.home(ORIGINAL)
    async with (
        FakeTelegram(token=DEFAULT_TOKEN) as telegram,
        TelegramTunnel(lab.certs, telegram.port) as tunnel,
    ):
        env = lab.original.gateway_env(
            root,
            llm_url=lab.llm.base_url,
            proxy_url=tunnel.url,
            ca_file=lab.certs.ca_file,
            websocket_port=_free_port(),
        )
        argv = [lab.original.nanobot, "gateway", "--port", str(_free_port())]
        launched = time.monotonic()
        child = await Child.start("original gateway", argv, env, root, root / "gateway.log")
        try:
            start = await _measure(
                lab,
                telegram,
                variant=ORIGINAL,
                pid=child.pid,
                launched=launched,
                polling_at=None,
                tail=child.tail,
            )
        finally:
            await child.stop()
    if tunnel.refused:
        raise BenchError(f"the original asked the proxy for more than Telegram: {tunnel.refused}")
    return start


async def measure() -> tuple[dict[str, list[Start]], dict[str, Any]]:
    runs: dict[str, list[Start]] = {}
    original = await asyncio.to_thread(_original.install)
    info = _original.describe(original)
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-gateway-") as tmp:
        certs = None
        if isinstance(original, _original.Original):
            try:
                certs = Certificates.make(Path(tmp))
            except BenchError as exc:
                original = str(exc)
                info["skipped"] = original
        if isinstance(original, str):
            _progress(f"  the original nanobot is skipped: {original}")
        async with FakeLLM() as llm:  # Echo, no delay: the model answers in 0 ms
            lab = Lab(llm, Path(tmp), original, certs)
            variants = [*OURS, *([ORIGINAL] if certs is not None else [])]
            _progress(
                f"  gateways {', '.join(variants)}: {WARMUPS} warm-up + {ROUNDS} measured "
                f"rounds, order rotating"
            )
            for index in range(WARMUPS + ROUNDS):
                shift = index % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    start = await (_theirs(lab) if variant == ORIGINAL else _ours(variant, lab))
                    if index >= WARMUPS:
                        runs.setdefault(variant, []).append(start)
    return runs, info


def metrics_of(runs: dict[str, list[Start]]) -> list[Metric]:
    order = [v for v in (*OURS, ORIGINAL) if v in runs]

    def each(
        label: str, unit: str, value: Callable[[Start], float], variants: Sequence[str]
    ) -> list[Metric]:
        return [Metric(f"{v}: {label}", unit, [value(s) for s in runs[v]]) for v in variants]

    def ratio(
        name: str, a: str, b: str, value: Callable[[Start], float], target: float | None = None
    ) -> Metric:
        values = [value(x) / value(y) for x, y in zip(runs[a], runs[b], strict=True)]
        return Metric(name, "x", values, target=target, note="per round")

    def polling(start: Start) -> float:
        assert start.polling_s is not None
        return start.polling_s

    def first_poll(start: Start) -> float:
        return start.first_poll_s

    def idle(start: Start) -> float:
        return start.idle_rss_kib / 1024

    metrics = [
        *each("exec -> polling", "s", polling, OURS),
        ratio("exec -> polling: auto / direct", AUTO, DIRECT, polling, POLLING_RATIO_TARGET),
        *each("exec -> 1st getUpdates", "s", first_poll, order),
        ratio("exec -> 1st getUpdates: auto / direct", AUTO, DIRECT, first_poll),
        *each("message -> reply", "s", lambda s: s.reply_s, order),
        *each("idle RSS after 1 message", "MiB", idle, order),
        *each("peak RSS (VmHWM)", "MiB", lambda s: s.peak_rss_kib / 1024, order),
        ratio("idle RSS: auto / direct", AUTO, DIRECT, idle),
    ]
    if ORIGINAL in runs:
        metrics += [
            ratio("idle RSS: default / original", DEFAULT, ORIGINAL, idle, IDLE_RATIO_TARGET),
            ratio("idle RSS: auto / original", AUTO, ORIGINAL, idle),
        ]
    return metrics


def main() -> None:
    load = os.getloadavg()
    runs, original = asyncio.run(measure())
    metrics = metrics_of(runs)
    print(format_table(metrics))
    processes = {v: sorted({s.processes for s in starts}) for v, starts in runs.items()}
    print(f"\nProcesses per gateway when idle: {processes}")
    if "skipped" in original:
        print(f"The original nanobot was skipped: {original['skipped']}")
    path = write_results(
        NAME,
        {
            "metrics": [m.as_json() for m in metrics],
            "original": original,
            "load_average_at_start": load,
            "runs": {
                "warmups": WARMUPS,
                "rounds": ROUNDS,
                "settle_s": SETTLE_S,
                "starts": {v: [asdict(s) for s in starts] for v, starts in runs.items()},
            },
        },
    )
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd())
    print(f"\nResults: {path}")
