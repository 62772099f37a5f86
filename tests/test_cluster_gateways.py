"""End to end: three `nanobot gateway` processes on one PostgreSQL database form a cluster.

Telegram posts every update to one webhook (the fake Bot API's route plays the load
balancer's part and sends them to the first member); every member takes sessions from the
journal. Observed as a user would: each message answered exactly once and in order, and
after a kill -9 of the member holding a busy session, that session's turn is finished by
another member once the dead one's lease lapses.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests._pgserver import PgServer, throwaway_server
from tests.conftest import Home
from tests.fakes.discord import FakeDiscord
from tests.fakes.llm import FakeLLM, Hang
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import WEBHOOK_LISTENING, GatewayProcess
from tests.test_cli import nanobot
from tests.test_gateway_telegram import gateway_config
from tests.test_telegram_webhook import PUBLIC, SECRET

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

READY = "gateway started"
LEASE_WAIT = 30  # seconds: a role held by a killed member moves within its lease (10 s)
HELD_NOTICE = "I can't save anything right now"
CHATS = 200


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=DEFAULT_TOKEN, webhook_retry=0.5) as fake:
        yield fake


def member_config(
    root: Path, llm: FakeLLM, telegram: FakeTelegram, store: str, workspace: Path
) -> dict[str, Any]:
    config = gateway_config(root, llm, telegram, queue_mode="follow_up")
    config["store"] = {"url": store}
    config["workspace"] = str(workspace)
    telegram_section = config["channels"]["telegram"]
    telegram_section["allow_from"] = ["*"]
    telegram_section["stream"] = False
    telegram_section["webhook"] = {
        "url": PUBLIC,
        "listen": "127.0.0.1:0",  # a port the system picks: `Cluster` routes to it
        "secret_token": SECRET,
    }
    return config


async def fetch(url: str, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def replies_confirmed(url: str, seconds: float = 30) -> None:
    """Until no reply waits in the outbox: each one the fake has is recorded as delivered.
    (A kill before that record may send a reply again: the Bot API has no idempotency key,
    and docs/channels.md says so; the tests that are not about that window wait it out.)"""
    async with asyncio.timeout(seconds):
        # The record is made in another process, which says nothing of it: look again.
        while await fetch(url, "SELECT 1 FROM outbox WHERE state = 'pending' LIMIT 1"):  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def first_to_log(members: list[GatewayProcess], text: str) -> GatewayProcess:
    """The member that logs `text` first (within 30 s)."""
    waits = [asyncio.create_task(m.wait_log(text, seconds=30)) for m in members]
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    first = next(iter(done))
    first.result()  # the member that exited or timed out says so
    return members[waits.index(first)]


@dataclass
class Cluster:
    members: list[GatewayProcess]
    telegram: FakeTelegram
    balanced: GatewayProcess | None = None

    async def balance_to(self, member: GatewayProcess) -> None:
        """The load balancer sends every update to `member` (the others get none), at the
        port it listens on since its last start (once it has said so: a loaded machine
        may see it start well before it listens)."""
        self.balanced = member
        await member.wait_log(WEBHOOK_LISTENING, seconds=60)
        self.telegram.route_webhook(PUBLIC, f"http://127.0.0.1:{member.webhook_port()}")

    async def start(self, *, migrated: bool = False) -> None:
        """Start every member, the first alone unless the schema is `migrated` already (it
        migrates it); then the updates go to the member they went to before (the first, at
        the first start), if it takes them by webhook. Meanwhile they go nowhere and
        Telegram keeps them: setWebhook only checks that PUBLIC's host resolves."""
        self.telegram.route_webhook(PUBLIC, "http://127.0.0.1:9")
        first = 0 if migrated else 1
        await asyncio.gather(*(m.start(ready=READY) for m in self.members[:first]))
        await asyncio.gather(*(m.start(ready=READY) for m in self.members[first:]))
        target = self.balanced or self.members[0]
        if target.config["channels"]["telegram"].get("webhook"):  # type: ignore[index]
            await self.balance_to(target)


@asynccontextmanager
async def running_cluster(
    tmp_path: Path, llm: FakeLLM, telegram: FakeTelegram, store: str
) -> AsyncIterator[Cluster]:
    """Three members on the database at `store`, the webhook balanced to the first, for the
    block; every member still running after it is killed, however it ends."""
    workspace = tmp_path / "shared-workspace"
    members = []
    for n in range(3):
        root = tmp_path / f"member{n}"
        root.mkdir()
        config = member_config(root, llm, telegram, store, workspace)
        members.append(GatewayProcess(root, config, dict(os.environ)))
    cluster = Cluster(members, telegram)
    try:
        await cluster.start()  # the first alone: an empty database (own_server's) it migrates
        yield cluster
    finally:
        for member in members:
            if member.process is not None and member.process.returncode is None:
                await member.stop(signal.SIGKILL)


@pytest.fixture
async def cluster(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, postgres_url: str
) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path, fake_llm, telegram, postgres_url) as cluster:
        yield cluster


@pytest.fixture
async def own_server() -> AsyncIterator[PgServer]:
    """A PostgreSQL server of the test's own, which it may restart (`tests._pgserver`)."""
    async with throwaway_server() as server:
        yield server


async def holders(url: str) -> dict[str, int]:
    """Member id -> sessions it holds a lease on."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT holder, count(*) FROM leases WHERE name LIKE 'session:%'"
            " AND expires_at > '1970-01-02' GROUP BY holder"  # not released
        )
    finally:
        await conn.close()
    return {str(r[0]): int(r[1]) for r in rows}


async def holder_pid(url: str, session: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        pid = await conn.fetchval(
            "SELECT m.pid FROM leases l JOIN members m ON m.id = l.holder"
            " WHERE l.name = 'session:' || $1",
            session,
        )
    finally:
        await conn.close()
    assert pid is not None
    return int(pid)


def texts(telegram: FakeTelegram, chat: int) -> list[str]:
    """The chat's replies, each the echo of the message it answers (its time stamp cut)."""
    return [m.visible.rsplit("\n", 1)[-1] for m in telegram.sent(chat)]


async def test_two_hundred_chats_at_once_each_answered_once_and_in_order(
    cluster: Cluster, telegram: FakeTelegram, postgres_url: str
) -> None:
    chats = range(1000, 1000 + CHATS)
    for round_ in ("first", "second"):
        for chat in chats:
            telegram.user_message(chat, f"{round_} from {chat}", user_id=chat)
    await telegram.wait_for(
        lambda: all(len(telegram.sent(chat)) >= 2 for chat in chats), seconds=120
    )
    await asyncio.sleep(1)  # anything doubled would have arrived by now
    for chat in chats:
        assert texts(telegram, chat) == [f"first from {chat}", f"second from {chat}"]
    held = await holders(postgres_url)
    assert sum(held.values()) == CHATS
    assert len(held) >= 2, f"every session went to one member: {held}"


async def test_a_killed_members_busy_session_is_finished_by_another_once(
    cluster: Cluster, telegram: FakeTelegram, fake_llm: FakeLLM, postgres_url: str
) -> None:
    fake_llm.script(Hang())
    telegram.user_message(42, "the long one", user_id=42)
    await fake_llm.wait_for_requests(1, seconds=30)
    pid = await holder_pid(postgres_url, "telegram:42")
    (holder,) = [m for m in cluster.members if m.process is not None and m.process.pid == pid]
    survivors = [m for m in cluster.members if m is not holder]
    await holder.stop(signal.SIGKILL)
    await cluster.balance_to(survivors[0])  # as a load balancer does once a member stops answering
    telegram.user_message(43, "meanwhile", user_id=43)  # the cluster still answers
    # Each member's health check is about itself: the others' beats do not hide its death.
    dead = await nanobot(home_of(holder), "status", "--check")
    assert (dead.code, dead.stdout) == (
        1,
        f"no gateway is running on this data dir (nothing holds {holder.data_dir}/gateway.lock)\n",
    )
    alive = await nanobot(home_of(survivors[0]), "status", "--check")
    assert alive.code == 0, alive.stdout + alive.stderr
    assert survivors[0].process is not None
    assert alive.stdout.startswith(f"gateway alive: pid {survivors[0].process.pid} on host ")
    await telegram.wait_for(lambda: len(telegram.sent(43)) == 1, seconds=30)
    await telegram.wait_for(lambda: len(telegram.sent(42)) == 1, seconds=60)
    await asyncio.sleep(1)
    assert texts(telegram, 42) == ["the long one"]
    assert any("resuming its turn" in m.log() for m in survivors)


def home_of(member: GatewayProcess) -> Home:
    """The member's installation, as `nanobot` commands run on its host see it."""
    return Home(member.root, member.config_path, member.data_dir, member.env)


async def test_a_restart_of_every_member_loses_and_doubles_nothing(
    cluster: Cluster, telegram: FakeTelegram, fake_llm: FakeLLM
) -> None:
    chats = range(2000, 2030)
    for chat in chats:
        telegram.user_message(chat, f"before from {chat}", user_id=chat)
    await telegram.wait_for(lambda: all(telegram.sent(chat) for chat in chats), seconds=60)
    fake_llm.script(Hang())  # one turn is cut off by the kill
    telegram.user_message(2100, "cut off", user_id=2100)
    await fake_llm.wait_for_requests(31, seconds=30)
    for member in cluster.members:  # a power cut: every member at once
        await member.kill()
    for chat in chats:  # sent while the whole cluster is down: Telegram keeps them
        telegram.user_message(chat, f"during from {chat}", user_id=chat)
    await cluster.start()
    await telegram.wait_for(
        lambda: all(len(telegram.sent(chat)) >= 2 for chat in chats) and bool(telegram.sent(2100)),
        seconds=120,
    )
    await asyncio.sleep(1)
    for chat in chats:
        assert texts(telegram, chat) == [f"before from {chat}", f"during from {chat}"]
    assert texts(telegram, 2100) == ["cut off"]


async def test_the_database_restarted_under_a_running_cluster_loses_and_doubles_nothing(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, own_server: PgServer
) -> None:
    """The server itself restarted (a fast shutdown: every session ended, connections
    refused until it is back) while messages come in and turns run: each is answered
    once, after the members reconnect, and every member lives through it (the schedule's
    holder too, whose watcher meets the outage). The server is the test's own: a restart of
    the shared one would break every test running beside it."""
    async with running_cluster(tmp_path, fake_llm, telegram, own_server.url()) as cluster:
        await _answered_through_a_restart(cluster, telegram, own_server)


async def _answered_through_a_restart(
    cluster: Cluster, telegram: FakeTelegram, server: PgServer
) -> None:
    chats = range(4000, 4060)
    for chat in chats[:20]:
        telegram.user_message(chat, f"one from {chat}", user_id=chat)
    await telegram.wait_for(lambda: all(telegram.sent(chat) for chat in chats[:20]), seconds=60)
    for chat in chats[20:40]:  # taken in and answered while the server goes down
        telegram.user_message(chat, f"one from {chat}", user_id=chat)
    await server.restart()
    since = len(telegram.deliveries)
    for chat in chats[40:]:
        telegram.user_message(chat, f"one from {chat}", user_id=chat)

    def answered(chat: int) -> bool:
        return f"one from {chat}" in texts(telegram, chat)

    try:
        await telegram.wait_for(lambda: all(answered(chat) for chat in chats), seconds=90)
    except TimeoutError:
        left = {chat: texts(telegram, chat) for chat in chats if not answered(chat)}
        tried = [(d.update_id, d.status, d.error) for d in telegram.deliveries[since:]]
        raise AssertionError(
            f"not answered: {left}; members exited: {exited(cluster)}; "
            f"the last posts since the restart: {tried[-5:]}"
        ) from None
    await asyncio.sleep(1)
    assert exited(cluster) == {}  # every member lived through it
    for chat in chats:
        # A turn whose write the restart cut off is held, and its user told so; it is
        # answered once the store is back.
        shown = [t for t in texts(telegram, chat) if not t.startswith(HELD_NOTICE)]
        assert shown == [f"one from {chat}"]


def exited(cluster: Cluster) -> dict[int, list[str]]:
    """The members whose process ended: their number and last log lines."""
    return {
        n: member.lines[-5:]
        for n, member in enumerate(cluster.members)
        if member.process is None or member.process.returncode is not None
    }


async def test_the_store_dropping_every_connection_loses_nothing(
    cluster: Cluster, telegram: FakeTelegram, postgres_url: str
) -> None:
    """What the members see of a database restart between two bursts: every connection
    (the pools' and the listening ones) ended by the server. A statement cut off in the
    middle of a turn fails that turn (the user is told); that is not what this tests."""
    chats = range(3000, 3040)
    for chat in chats[:20]:
        telegram.user_message(chat, f"one from {chat}", user_id=chat)
    await telegram.wait_for(lambda: all(telegram.sent(chat) for chat in chats[:20]), seconds=60)
    database = postgres_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(postgres_url.rsplit("/", 1)[0] + "/postgres")
    try:
        await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
    finally:
        await admin.close()
    for member in cluster.members:
        await member.wait_log("listening on", seconds=30)
    for chat in chats[20:]:
        telegram.user_message(chat, f"one from {chat}", user_id=chat)
    await telegram.wait_for(lambda: all(telegram.sent(chat) for chat in chats), seconds=60)
    await asyncio.sleep(1)
    for chat in chats:
        assert texts(telegram, chat) == [f"one from {chat}"]
    assert exited(cluster) == {}


async def cut_connections(url: str, *, refused_for: float) -> None:
    """What a managed database's failover, a `pg_terminate_backend` or a proxy's restart does
    to the members: every connection ended by the server, and new ones refused for a while."""
    database, server = url.rsplit("/", 1)[1], url.rsplit("/", 1)[0] + "/postgres"
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
        await asyncio.sleep(refused_for)
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()


async def test_connections_cut_mid_turn_answer_every_message_once(
    cluster: Cluster, telegram: FakeTelegram, fake_llm: FakeLLM, postgres_url: str
) -> None:
    """Each turn's answer could not be saved: it is held for the store's return, and the
    member's sessions lapse meanwhile. Answered twice, before: once by the held message,
    once by the session taken afresh; and a member took work while fenced, so that its
    resumed turns met their own earlier ones ("cannot resume ... while it is busy")."""
    chats = range(3100, 3110)
    fake_llm.delay = 1.5  # every turn mid-model when the connections go
    for chat in chats:
        telegram.user_message(chat, f"one from {chat}", user_id=chat)
    await fake_llm.wait_for_requests(len(chats), seconds=60)
    # Longer than two thirds of the lease (10 s): the members stop their turns, hand their
    # sessions back once the store answers, and take work afresh.
    await cut_connections(postgres_url, refused_for=8)

    def answered(chat: int) -> bool:
        return f"one from {chat}" in texts(telegram, chat)

    await telegram.wait_for(lambda: all(answered(chat) for chat in chats), seconds=90)
    await replies_confirmed(postgres_url)
    await asyncio.sleep(2)  # anything doubled would have arrived by now
    for chat in chats:
        shown = [t for t in texts(telegram, chat) if not t.startswith(HELD_NOTICE)]
        assert shown == [f"one from {chat}"], (chat, texts(telegram, chat))
    assert exited(cluster) == {}


async def test_discord_in_a_cluster_one_member_connects_and_another_takes_over_after_a_kill(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, postgres_url: str
) -> None:
    """Three members with Discord: one holds the gateway connection (Discord sends a bot's
    events over one); every chat is answered once, whichever member answers it. Its holder
    killed, another connects within the lease and reads what was sent meanwhile from the
    chats' history (Discord never sends those events again)."""
    async with FakeDiscord() as discord:
        users = range(5001, 5021)
        for user in users:
            discord.add_user(f"user{user}", user_id=user)
        dms = {user: discord.dm_channel(user) for user in users}
        members = []
        for n in range(3):
            root = tmp_path / f"member{n}"
            root.mkdir()
            config = member_config(
                root, fake_llm, telegram, postgres_url, tmp_path / "shared-workspace"
            )
            config["channels"]["discord"] = {
                "enabled": True,
                "token": "discord-bot-token-secret",
                "allow_from": list(users),
                "api_base": discord.api_base,
                "gateway_url": discord.gateway_url,
            }
            members.append(GatewayProcess(root, config, dict(os.environ)))

        def shown(user: int) -> list[str]:
            return [m.content.rsplit("\n", 1)[-1] for m in discord.sent(dms[user]) if not m.deleted]

        def answered(some: range) -> bool:
            return all(f"one from {user}" in " ".join(shown(user)) for user in some)

        try:
            await members[0].start(ready=READY)
            await asyncio.gather(*(m.start(ready=READY) for m in members[1:]))
            await discord.wait_for_ready(1, seconds=60)
            for user in users[:10]:
                discord.user_message(dms[user], f"one from {user}", user_id=user)
            await discord.wait_until(lambda: answered(users[:10]), 60, "the first ten answered")
            await replies_confirmed(postgres_url)  # a kill before it may send one again
            # discord.py says it is ready up to 2 s after Discord's READY, when it has given
            # up waiting for guilds: the first replies may come before.
            leader = await first_to_log(members, "discord connected as")
            await leader.kill()
            for user in users[10:]:  # nobody holds the connection: no event carries these
                discord.user_message(dms[user], f"one from {user}", user_id=user)
            await discord.wait_for_ready(2, seconds=LEASE_WAIT)
            await discord.wait_until(lambda: answered(users), 60, "every chat answered")
            await asyncio.sleep(1)  # anything doubled would have arrived by now
            for user in users:
                assert shown(user) == [f"one from {user}"]
            assert sum("discord connected as" in m.log() for m in members) == 2
        finally:
            for member in members:
                if member.process is not None and member.process.returncode is None:
                    await member.stop(signal.SIGKILL)
