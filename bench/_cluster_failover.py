"""One failover trial of ``bench/cluster.py``: kill -9 of the member holding a busy session,
and the time until that session's answer arrives."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import asyncpg

from bench._cluster import LEASE_S, Member, holder_pid
from bench._common import BenchError
from bench._gateway import Child
from bench._setup import ZERO_MS_TEXT
from nanobot.store._times import from_text

ANSWER = ZERO_MS_TEXT  # the 0 ms model's answer
REPLY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Failover:
    killed_s: float  # kill -9 → the answer arrived at the fake Telegram
    lapse_s: float  # kill -9 → the dead member's lease on the session ran out
    taken_by_other: bool  # another member holds the session after the answer


@dataclass(frozen=True)
class Trial:
    """What a trial works with: the cluster, its fakes and its database."""

    telegram: Child  # python -m bench._cluster telegram
    members: Sequence[Member]
    http: aiohttp.ClientSession
    llm_url: str  # the fake model's /v1 base; its default answer is ANSWER at once
    store: str


async def failover_trial(t: Trial, chat: int) -> Failover:
    """A message to ``chat``; its turn hangs at the model; after a random part of the lease
    renewal period (so the kill falls at any phase of it), kill -9 of the member holding the
    session, and the balancer stops sending to it; the time until the chat's answer. The
    killed member is started again once it is answered."""
    key = f"telegram:{chat}"
    await _script(t, [{"type": "Hang"}])
    send = {"op": "send", "chat": chat, "text": "A long one", "final": ANSWER}
    await t.telegram.ask(send, 10)
    async with asyncio.timeout(30):
        # Until a request took the hang (the turn is at the model): the fake model is another
        # process, asked for how many scripted replies wait.
        while await _script(t, []):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    pid = await holder_pid(t.store, key)
    victims = [m for m in t.members if m.alive and m.pid == pid]
    if pid is None or len(victims) != 1:
        raise BenchError(f"no live member holds {key} (pid {pid})")
    await asyncio.sleep(random.uniform(0, LEASE_S / 3))
    killed_wall, killed = time.time(), time.monotonic()
    os.kill(pid, signal.SIGKILL)
    lapse = await _lease_end(t.store, key) - killed_wall
    await victims[0].gateway.kill()  # reaped
    await _balance(t)
    reply = await t.telegram.ask({"op": "reply", "chat": chat, "timeout": REPLY_TIMEOUT_S}, 70)
    if reply["at"] is None:
        raise BenchError(f"{key}: no answer in {REPLY_TIMEOUT_S:g} s after the kill")
    taker = await holder_pid(t.store, key)
    await victims[0].start()
    await _balance(t)
    return Failover(float(reply["at"]) - killed, lapse, taker != pid)


async def _script(t: Trial, replies: list[dict[str, str]]) -> int:
    """Queue ``replies`` at the fake model; how many scripted replies wait."""
    base = t.llm_url.removesuffix("/v1")
    async with t.http.post(f"{base}/_fake/script", json={"replies": replies}) as response:
        response.raise_for_status()
        return int((await response.json())["pending"])


async def _balance(t: Trial) -> None:
    """The load balancer sends the webhook's posts to the live members."""
    urls = [m.url for m in t.members if m.alive]
    await t.telegram.ask({"op": "targets", "urls": urls}, 10)


async def _lease_end(store: str, session_key: str) -> float:
    """When the session's lease runs out, on the wall clock (time.time())."""
    conn = await asyncpg.connect(store)
    try:
        text = await conn.fetchval(
            "SELECT expires_at FROM leases WHERE name = 'session:' || $1", session_key
        )
    finally:
        await conn.close()
    return from_text(str(text)).timestamp()
