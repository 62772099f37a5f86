"""Helpers of ``bench/mcp.py``: a gateway started with 0, 1 or 5 stdio MCP servers, timed to
its first reply, then measured idle.

Each start gets a new HOME, data dir and FakeTelegram (tests/fakes/telegram.py); the fake
model (tests/fakes/llm.py, Echo, 0 ms) is shared. The config is our default plus the fakes'
URLs, a key and `agent.transport: auto` (the default, named), and `servers` copies of the
fake MCP server (tests/fakes/mcp_server.py, copied into the workspace) under `mcp.servers`,
in the sandbox where it runs here (the default, `sandbox: auto`), else with `sandbox: none`.
A `silent` server is `sleep` instead: a process that never answers the handshake, so the
gateway does all its own work for the server (the SDK's import, the start, the wait) while
the server costs no CPU; what the fake costs beyond that is its own start-up's CPU.

One plain message ("hi") is queued at the fake before the gateway is spawned, so the first
getUpdates takes it: the figure runs from just before the spawn (``time.monotonic()``, one
clock for every process on Linux) to the arrival at the fake of the Bot API request that
makes the chat show the reply. The gateway's CPU time (user + system) is read as the reply
is seen: under load it varies less than the wall time. Then, once every server has logged
that it runs and ``SETTLE_S`` more have passed, the idle RSS: VmRSS of the gateway's own
process (nanobot's side), and summed over its descendants (the servers, and whatever else
the gateway runs), with their PSS too, as the median of a few readings. After the stop,
every descendant seen while idle is looked for again: none may outlive the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import BenchError, isolated_env
from bench._gateway import cpu_seconds, descendants, rss_kib
from bench._mcp_calls import SCRIPT, SERVER_FILE
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import GatewayProcess

MESSAGE, REPLY_PREFIX, CHAT = "hi", "echo: ", 42
API_KEY = "sk-bench-mcp-0123456789"
POLLING = "telegram connected"  # the channel manager's line, once the first poll is answered
REPLY_LIMIT_S, RUNNING_LIMIT_S = 60.0, 90.0
SETTLE_S = 3.0  # after the last server runs: its first listing's garbage, the turn's tasks
SAMPLES, SAMPLE_GAP_S = 5, 0.2
REPLY_METHODS = frozenset({"sendmessage", "editmessagetext"})


@dataclass(frozen=True)
class Variant:
    """What a gateway is started with: `servers` copies of the fake, or of `sleep`."""

    label: str
    servers: int
    silent: bool = False


@dataclass(frozen=True)
class Start:
    """One gateway, started with a message waiting, measured idle, stopped."""

    variant: str
    first_poll_s: float  # exec -> the first getUpdates at the fake
    reply_s: float  # exec -> the request that shows the reply
    reply_cpu_s: float  # the gateway process's CPU time when the reply was seen here
    running_s: float | None  # exec -> the last server's "running" line, as read here
    mcp_tools_offered: int  # MCP tools in the first model request (the reply's)
    gateway_rss_kib: int  # VmRSS of the gateway's own process, idle
    children_rss_kib: int  # VmRSS summed over its descendants, idle
    children_pss_kib: int  # PSS, likewise (shared pages counted once over all processes)
    processes: int  # the gateway and its descendants, idle
    survivors: int  # of those descendants, alive after the gateway stopped


def server_config(variant: Variant, *, sandboxed: bool) -> dict[str, Any]:
    """`mcp.servers` of `variant` (no servers: no `mcp` section at all)."""
    if not variant.servers:
        return {}
    server: dict[str, Any] = {"command": sys.executable, "args": [SERVER_FILE]}
    if variant.silent:
        server = {"command": "sleep", "args": ["3600"]}
    if not sandboxed:
        server["sandbox"] = "none"
    names = (f"fake{n}" for n in range(1, variant.servers + 1))
    return {"mcp": {"servers": {name: dict(server) for name in names}}}


def _config(llm_url: str, telegram_url: str, mcp: dict[str, Any]) -> dict[str, Any]:
    agent = {"api_key": API_KEY, "api_base": llm_url, "transport": "auto"}
    telegram = {"enabled": True, "token": DEFAULT_TOKEN, "allow_from": ["*"]}
    return {"agent": agent, "channels": {"telegram": telegram | {"api_base": telegram_url}}, **mcp}


def _reply_at(telegram: FakeTelegram) -> float | None:
    """When the chat first showed the reply: the fake model echoes the message, and nanobot
    puts the time in front of the message's text."""
    for call in telegram.requests:
        if call.method.lower() not in REPLY_METHODS or call.params.get("chat_id") is None:
            continue
        text = str(call.params.get("text", "")).strip()
        chat = int(call.params["chat_id"])
        if chat == CHAT and text.startswith(REPLY_PREFIX) and text.endswith(MESSAGE):
            return call.at
    return None


def _first_poll(telegram: FakeTelegram) -> float | None:
    return next((c.at for c in telegram.requests if c.method.lower() == "getupdates"), None)


def pss_kib(pid: int) -> int:
    """The process's proportional set size (smaps_rollup), 0 if it is gone."""
    with contextlib.suppress(OSError):
        text = Path(f"/proc/{pid}/smaps_rollup").read_text(encoding="utf-8")
        for line in text.splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def _children_kib(pid: int) -> tuple[int, int, list[int]]:
    """VmRSS and PSS summed over the descendants of `pid`, and their pids."""
    kids = descendants(pid)
    rss = 0
    for kid in kids:
        with contextlib.suppress(OSError, BenchError):
            rss += rss_kib(kid)
    return rss, sum(pss_kib(kid) for kid in kids), kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return state[0] not in ("Z", "X")


async def _running(gateway: GatewayProcess, variant: Variant, launched: float) -> float | None:
    """Wait until each server has logged that it runs; exec -> the last of those lines."""
    if not variant.servers or variant.silent:
        return None
    for n in range(1, variant.servers + 1):
        try:
            await gateway.wait_log(f"MCP server fake{n}: running", seconds=RUNNING_LIMIT_S)
        except (AssertionError, TimeoutError) as exc:
            raise BenchError(f"gateway, {variant.label}: {exc}") from None
    return time.monotonic() - launched


async def start_one(llm: FakeLLM, tmp: Path, variant: Variant, *, sandboxed: bool) -> Start:
    """Start a gateway of `variant` with a message waiting; measure it; stop it."""
    root = Path(tempfile.mkdtemp(prefix="mcp-gateway-", dir=tmp))
    workspace = root / ".nanobot" / "workspace"
    workspace.mkdir(parents=True)
    shutil.copy(SCRIPT, workspace / SERVER_FILE)
    async with FakeTelegram(token=DEFAULT_TOKEN) as telegram:
        config = _config(
            llm.base_url, telegram.base_url, server_config(variant, sandboxed=sandboxed)
        )
        gateway = GatewayProcess(root, config, isolated_env(root))
        telegram.user_message(CHAT, MESSAGE, user_id=CHAT)
        before = len(llm.requests)
        launched = time.monotonic()
        try:
            try:
                await gateway.start(ready=POLLING)
                await telegram.wait_for(lambda: _reply_at(telegram) is not None, REPLY_LIMIT_S)
            except (AssertionError, TimeoutError) as exc:
                tail = "\n".join(gateway.lines[-30:])
                raise BenchError(f"gateway, {variant.label}: {exc}\n{tail}") from None
            assert gateway.process is not None
            cpu = cpu_seconds(gateway.process.pid)
            replied, polled = _reply_at(telegram), _first_poll(telegram)
            assert replied is not None and polled is not None
            requests = llm.requests[before:]
            if not requests:
                raise BenchError(f"gateway, {variant.label}: no model request")
            offered = sum(
                1 for t in requests[0].tools if str(t["function"]["name"]).startswith("fake")
            )
            running = await _running(gateway, variant, launched)
            await asyncio.sleep(SETTLE_S)
            pid = gateway.process.pid
            samples: list[tuple[int, int, int]] = []
            kids: set[int] = set()
            for _ in range(SAMPLES):
                rss, pss, seen = _children_kib(pid)
                samples.append((rss_kib(pid), rss, pss))
                kids.update(seen)
                await asyncio.sleep(SAMPLE_GAP_S)
        finally:
            try:
                await gateway.stop(seconds=20)
            except TimeoutError:
                await gateway.kill()
    await asyncio.sleep(0.5)  # a survivor's parent, if any, has to let go of it first
    return Start(
        variant=variant.label,
        first_poll_s=polled - launched,
        reply_s=replied - launched,
        reply_cpu_s=cpu,
        running_s=running,
        mcp_tools_offered=offered,
        gateway_rss_kib=int(statistics.median(s[0] for s in samples)),
        children_rss_kib=int(statistics.median(s[1] for s in samples)),
        children_pss_kib=int(statistics.median(s[2] for s in samples)),
        processes=1 + len(kids),
        survivors=sum(1 for kid in kids if _alive(kid)),
    )
