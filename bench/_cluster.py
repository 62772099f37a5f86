"""Helpers of ``bench/cluster.py``: a fake Telegram that posts like Telegram behind a load
balancer, cluster members as subprocesses, and a PostgreSQL database per run.

``python -m bench._cluster telegram``: a ``FloodTelegram`` in a process of its own, driven by
JSON lines on stdin, one JSON answer line each on stdout (as ``bench._gateway telegram``):

- ``{"op": "targets", "urls": [...]}``: where the load balancer sends the webhook's posts
  (``http://127.0.0.1:PORT`` of each member taking them), in turn.
- ``{"op": "flood", "chats": [...], "text", "final", "timeout"}``: one message in each chat,
  all queued at once; answers when every chat shows ``final`` (or on timeout) with the time
  each chat's final text arrived, and when the last post was acknowledged.
- ``{"op": "send", "chat", "text"}`` then ``{"op": "reply", "chat", "final", "timeout"}``:
  one message, and (later) when the chat's reply showing ``final`` arrived.

Times are ``time.monotonic()``, one clock for every process on Linux.

Why not the fake's own webhook delivery: it posts one update at a time, in order, to one
route (enough for tests, and it keeps them simple). Telegram posts up to the webhook's
``max_connections`` (40 by default) at once, and a load balancer in front of several members
spreads them. Posting one at a time would measure the fake: each post waits for the member to
journal the update, so a flood could reach a member no faster than one round trip to
PostgreSQL per message, whatever the number of members.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg

from bench._common import BenchError, isolated_env
from bench._gateway import JSON, _Tracker
from bench._setup import gateway_config
from tests.fakes._telegram_webhook import post
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import GatewayProcess

PUBLIC = "https://bot.example.test/telegram"  # the webhook's URL, as Telegram knows it
SECRET = "bench-Secret_0123456789"
PG_SERVER = "postgresql://postgres@127.0.0.1:5432"
LEASE_S = 10.0  # cluster.lease_seconds, its default: how long a dead member holds its sessions
READY = "gateway started"


# ---- in the fake Telegram's process ------------------------------------------------------


class FloodTelegram(FakeTelegram):
    """The fake Bot API, its webhook posting as Telegram does: up to the webhook's
    ``max_connections`` updates at once (one chat's one at a time, in order), each to the
    next of ``targets`` in turn (the load balancer). Updates go to the webhook only: there
    is no getUpdates in this benchmark."""

    def __init__(self) -> None:
        super().__init__(token=DEFAULT_TOKEN, webhook_retry=0.5)
        self.targets: list[str] = []
        self.acked_at: float | None = None  # when the latest post was acknowledged
        self.refused = 0  # posts answered with anything but a 2xx, or not at all
        self._ready: deque[JSON] = deque()
        self._held: dict[int, deque[JSON]] = {}  # chat -> its updates behind one in flight
        self._turn = 0

    def _enqueue(self, update: JSON) -> int:
        self._last_update_id += 1
        self._ready.append({"update_id": self._last_update_id, **update})
        self._changed()
        return self._last_update_id

    async def _deliver(self) -> None:
        webhook = self.webhook
        assert webhook is not None
        timeout = aiohttp.ClientTimeout(total=self.webhook_timeout)
        connector = aiohttp.TCPConnector(limit=0)
        async with (
            aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
            asyncio.TaskGroup() as group,
        ):
            for n in range(webhook.max_connections):
                group.create_task(self._poster(session), name=f"webhook-post-{n}")

    async def _poster(self, session: aiohttp.ClientSession) -> None:
        while (webhook := self.webhook) is not None and not self._stopping.is_set():
            if not self._ready or not self.targets:
                await self._wake.wait()
                continue
            update = self._ready.popleft()
            chat = int(update["message"]["chat"]["id"])
            if chat in self._held:  # one of its updates is being posted
                self._held[chat].append(update)
                continue
            self._held[chat] = deque()
            target = self.targets[self._turn % len(self.targets)] + urlsplit(webhook.url).path
            self._turn += 1
            body = json.dumps(update).encode()
            _, error = await post(session, target, body, webhook.secret_token)
            if error is None:
                self._acknowledged[update["update_id"]] = update
                self.acked_at = time.monotonic()
            else:
                self.refused += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.webhook_retry)
            behind = self._held.pop(chat)
            if error is not None:
                behind.appendleft(update)
            self._ready.extendleft(reversed(behind))
            self._changed()


async def _flood(fake: FloodTelegram, command: JSON) -> JSON:
    chats = [int(c) for c in command["chats"]]
    tracker = _Tracker(fake, dict.fromkeys(chats, str(command["final"])))
    refused = fake.refused
    injected_at = time.monotonic()
    for chat in chats:
        fake.user_message(chat, str(command["text"]), user_id=chat)
    complete = await tracker.wait(float(command["timeout"]))
    report = tracker.report(injected_at, 0)
    del report["taken_at"]  # of getUpdates
    return report | {
        "complete": complete,
        "acked_at": fake.acked_at,
        "refused_posts": fake.refused - refused,
    }


async def _host() -> None:
    async with FloodTelegram() as fake:
        fake.route_webhook(PUBLIC, "http://127.0.0.1:9")  # setWebhook resolves the host
        print(json.dumps({"base_url": fake.base_url}), flush=True)
        trackers: dict[int, tuple[_Tracker, float]] = {}
        while line := await asyncio.to_thread(sys.stdin.readline):
            command: JSON = json.loads(line)
            answer: JSON
            match command["op"]:
                case "targets":
                    fake.targets = [str(u) for u in command["urls"]]
                    fake._changed()
                    answer = {"targets": len(fake.targets)}
                case "flood":
                    answer = await _flood(fake, command)
                case "send":
                    chat = int(command["chat"])
                    trackers[chat] = (_Tracker(fake, {chat: str(command["final"])}), 0.0)
                    fake.user_message(chat, str(command["text"]), user_id=chat)
                    answer = {"at": time.monotonic()}
                case "reply":
                    chat = int(command["chat"])
                    tracker, _ = trackers.pop(chat)
                    if await tracker.wait(float(command["timeout"])):
                        answer = {"at": tracker.done[chat]}
                    else:
                        answer = {"at": None}
                case op:
                    answer = {"error": f"unknown op {op!r}"}
            print(json.dumps(answer), flush=True)


# ---- in the benchmark's process ----------------------------------------------------------


async def unreachable() -> str | None:
    """Why the local PostgreSQL server cannot be used, or None if it answers."""
    try:
        conn = await asyncpg.connect(f"{PG_SERVER}/postgres", timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return f"no PostgreSQL answers at {PG_SERVER} (trust auth, user postgres): {exc}"
    await conn.close()
    return None


@asynccontextmanager
async def database() -> AsyncIterator[str]:
    """The URL of a new, empty database on the local server, dropped when the block ends."""
    name = f"nanobot_bench_{secrets.token_hex(6)}"
    try:
        admin = await asyncpg.connect(f"{PG_SERVER}/postgres", timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise BenchError(f"no PostgreSQL at {PG_SERVER}: {exc}") from exc
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"{PG_SERVER}/{name}"
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def holder_pid(url: str, session: str) -> int | None:
    """The pid of the member holding `session`'s lease, if one does."""
    conn = await asyncpg.connect(url)
    try:
        pid = await conn.fetchval(
            "SELECT m.pid FROM leases l JOIN members m ON m.id = l.holder"
            " WHERE l.name = 'session:' || $1",
            session,
        )
    finally:
        await conn.close()
    return None if pid is None else int(pid)


def postgres_cpu() -> float:
    """CPU seconds used so far by every running PostgreSQL server process (the server, its
    helpers, one backend per connection)."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            text = Path(entry.path, "stat").read_text(encoding="utf-8")
            if text[text.index("(") + 1 : text.rindex(")")] == "postgres":
                fields = text[text.rindex(")") + 2 :].split()
                total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def member_config(
    root: Path, llm_url: str, telegram_url: str, store: str, *, port: int, workspace: Path
) -> dict[str, Any]:
    """A gateway of the cluster: the defaults (as `gateway_throughput`'s), the state on
    `store`, Telegram's updates taken from the webhook on 127.0.0.1:`port`."""
    config = gateway_config(root, llm_url, telegram_url, None, "auto")
    config["store"] = {"url": store}
    config["workspace"] = str(workspace)
    config["cluster"] = {"lease_seconds": LEASE_S}
    config["channels"]["telegram"]["webhook"] = {
        "url": PUBLIC,
        "listen": f"127.0.0.1:{port}",
        "secret_token": SECRET,
    }
    return config


class Member:
    """One gateway of the cluster and where the load balancer reaches it."""

    def __init__(self, root: Path, llm_url: str, telegram_url: str, store: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = member_config(
            root, llm_url, telegram_url, store, port=self.port, workspace=root.parent / "workspace"
        )
        self.gateway = GatewayProcess(root, config, isolated_env(root))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.gateway.process is not None
        return self.gateway.process.pid

    @property
    def alive(self) -> bool:
        process = self.gateway.process
        return process is not None and process.returncode is None

    async def start(self) -> None:
        await self.gateway.start(ready=READY)


async def start_members(members: Sequence[Member]) -> None:
    """The first migrates the schema; the others start together once it is ready."""
    await members[0].start()
    await asyncio.gather(*(m.start() for m in members[1:]))


async def stop_members(members: Sequence[Member]) -> None:
    """Stop them cleanly together (SIGTERM), or kill what does not stop in 30 s."""

    async def stop(member: Member) -> None:
        if member.alive:
            try:
                await member.gateway.stop()
            except TimeoutError:
                await member.gateway.kill()

    await asyncio.gather(*(stop(m) for m in members))


def main(argv: Sequence[str]) -> None:
    match list(argv):
        case ["telegram"]:
            asyncio.run(_host())
        case _:
            raise SystemExit("usage: python -m bench._cluster telegram")


if __name__ == "__main__":
    main(sys.argv[1:])
