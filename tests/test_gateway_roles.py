"""End to end: leader roles between real `nanobot gateway` processes on one state.

Two gateways, each with its own data dir, share one SQLite file (`store.url`): only one of
them polls the fake Telegram (a second poller would end the first one's long poll with 409,
which the fake counts); after a kill -9 of the poller, the other takes polling over within
the lease and answers a message sent meanwhile exactly once. And a gateway restarted on its
data dir after a kill -9 takes its roles back at once, without waiting for the lease.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from loguru import logger

from nanobot.config import load
from nanobot.errors import NanobotError
from nanobot.launch import _gateway_lock
from tests.fakes.llm import FakeLLM, Text
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import GatewayProcess
from tests.test_gateway_telegram import ALICE, BOB, gateway_config, replies

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

LEASE = 2  # seconds: cluster.lease_seconds, short for the takeover
STANDBY = "another gateway plays the role intake:telegram"


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=DEFAULT_TOKEN) as fake:
        yield fake


def member(root: Path, llm: FakeLLM, telegram: FakeTelegram, state: Path) -> GatewayProcess:
    config: dict[str, Any] = gateway_config(root, llm, telegram)
    config["store"] = {"url": f"sqlite:///{state}"}
    config["cluster"] = {"lease_seconds": LEASE}
    return GatewayProcess(root, config, dict(os.environ))


async def test_one_of_two_gateways_polls_and_the_other_takes_over_after_a_kill_9(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    state = tmp_path / "shared" / "state.db"
    state.parent.mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = member(tmp_path / "a", fake_llm, telegram, state)
    second = member(tmp_path / "b", fake_llm, telegram, state)
    await first.start(ready="telegram connected")
    await telegram.wait_for(lambda: telegram.polling)
    await second.start(ready=STANDBY)  # it found the first one polling
    assert STANDBY not in first.log()

    fake_llm.script(Text("From the poller."))
    telegram.user_message(ALICE, "who answers?", user_id=ALICE)
    assert await replies(telegram, ALICE, 1) == ["From the poller."]
    polls = len(telegram.calls("getUpdates"))
    assert polls >= 2 and telegram.conflicts == 0  # one poller, never two at once

    await first.kill()
    fake_llm.default_reply = Text("From the one that took over.")
    telegram.user_message(BOB, "anyone there?", user_id=BOB)
    await second.wait_log("took the role intake:telegram", seconds=LEASE + 10)
    assert await replies(telegram, BOB, 1) == ["From the one that took over."]
    await second.wait_log("took the role schedule")  # cron and the heartbeat moved too
    await asyncio.sleep(1.5)  # nothing more comes
    assert len(telegram.sent(BOB)) == 1 and len(telegram.sent(ALICE)) == 1
    assert telegram.conflicts == 0
    assert await second.stop() == 0


async def test_a_restart_after_a_kill_9_takes_its_roles_back_at_once(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    config = gateway_config(tmp_path, fake_llm, telegram)
    config["cluster"] = {"lease_seconds": 300}  # a restart that waited would show
    process = GatewayProcess(tmp_path, config, dict(os.environ))
    await process.start(ready="telegram connected")
    await telegram.wait_for(lambda: telegram.polling)
    await process.kill()

    fake_llm.default_reply = Text("Back at once.")
    await process.start(ready="telegram connected")
    telegram.user_message(ALICE, "back?", user_id=ALICE)
    assert await replies(telegram, ALICE, 1, seconds=20) == ["Back at once."]
    assert "another gateway plays the role" not in process.log()
    assert await process.stop() == 0


async def test_a_restart_after_a_kill_9_with_a_changed_config_starts_at_once(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    # The dead gateway's member row still looks alive; on SQLite the data dir's lock says
    # no other gateway can be running, so its config is nobody's to agree with.
    process = GatewayProcess(tmp_path, gateway_config(tmp_path, fake_llm, telegram), {**os.environ})
    await process.start(ready="telegram connected")
    await process.kill()
    process.config["tools"]["approval"]["timeout"] = "2m"  # type: ignore[index]
    process.config_path.write_text(yaml.safe_dump(process.config), encoding="utf-8")
    fake_llm.default_reply = Text("New config, at once.")
    await process.start(ready="telegram connected")
    await process.kill()  # and again, before its first beat
    process.config["tools"]["approval"]["timeout"] = "3m"  # type: ignore[index]
    process.config_path.write_text(yaml.safe_dump(process.config), encoding="utf-8")
    await process.start(ready="telegram connected")
    telegram.user_message(ALICE, "there?", user_id=ALICE)
    assert await replies(telegram, ALICE, 1, seconds=20) == ["New config, at once."]
    assert "config differs" not in process.log()
    assert await process.stop() == 0


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_the_data_dirs_lock_names_the_gateway_it_replaces(tmp_path: Path, store: str) -> None:
    data: dict[str, Any] = {"data_dir": str(tmp_path / "data")}
    if store == "postgresql":  # never connected to here
        data["store"] = {"url": "postgresql://nanobot@127.0.0.1:5432/nanobot"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    config = load(tmp_path / "config.yaml")
    config.data_dir.mkdir()
    said: list[str] = []
    sink = logger.add(said.append, level="INFO", format="{message}")
    try:
        with _gateway_lock(config) as first:
            assert first.predecessor is None
            first.record("0123abcd")
            if store == "sqlite":
                with (
                    pytest.raises(NanobotError, match=rf"another gateway .* \(pid {os.getpid()}\)"),
                    _gateway_lock(config),
                ):
                    pass
            else:  # a second member of the cluster shares the data dir, without the lock
                with _gateway_lock(config) as second:
                    assert (second.fd, second.predecessor) == (None, None)
                assert any("runs without the data dir's lock" in line for line in said)
        with _gateway_lock(config) as restarted:  # the first one is gone
            assert restarted.predecessor == "0123abcd"
    finally:
        logger.remove(sink)
