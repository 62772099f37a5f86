"""End to end: gateways on one PostgreSQL database must share their config and workspace.

A second `nanobot gateway` whose config differs from the running one's is refused (exit 2,
one line naming the parts and the running member, no value); one that agrees but has
another workspace starts and warns; `nanobot status` lists both, with their workspaces,
the sessions each holds, and the warning.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import GatewayProcess
from tests.test_cluster_gateways import READY, Cluster, member_config

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=DEFAULT_TOKEN, webhook_retry=0.5) as fake:
        yield fake


@pytest.fixture
async def first(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, postgres_url: str
) -> AsyncIterator[GatewayProcess]:
    root = tmp_path / "first"
    root.mkdir()
    config = member_config(root, fake_llm, telegram, postgres_url, tmp_path / "shared")
    # The load balancer sends every update to the first gateway.
    process = GatewayProcess(root, config, dict(os.environ))
    try:
        await Cluster([process], telegram).start()
        yield process
    finally:
        await process.stop(signal.SIGKILL)


def member(
    tmp_path: Path, name: str, llm: FakeLLM, telegram: FakeTelegram, url: str, *, workspace: Path
) -> GatewayProcess:
    root = tmp_path / name
    root.mkdir()
    config = member_config(root, llm, telegram, url, workspace)
    return GatewayProcess(root, config, dict(os.environ))


async def status(process: GatewayProcess) -> str:
    run = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nanobot",
        "status",
        env=process.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await run.communicate()
    assert run.returncode == 0, err.decode()
    return out.decode()


async def test_a_gateway_with_another_config_on_the_same_database_is_refused(
    tmp_path: Path,
    first: GatewayProcess,
    fake_llm: FakeLLM,
    telegram: FakeTelegram,
    postgres_url: str,
) -> None:
    other = member(
        tmp_path, "other", fake_llm, telegram, postgres_url, workspace=tmp_path / "shared"
    )
    other.config["channels"]["telegram"]["allow_from"] = ["1234"]  # type: ignore[index]
    other.config["tools"]["approval"]["exec"] = "ask"  # type: ignore[index]
    other.config_path.write_text(yaml.safe_dump(other.config), encoding="utf-8")
    await other.start(ready="nanobot: this gateway's config differs")
    assert other.process is not None
    async with asyncio.timeout(30):
        assert await other.process.wait() == 2
    [line] = [line for line in other.lines if line.startswith("nanobot: ")]
    assert "config differs in approvals, telegram from that of the gateway running on the " in line
    assert "same database (pid " in line and "Running several gateways" in line
    assert "1234" not in line and "ask" not in line.split(":")[1]
    assert READY not in other.log()
    rows = [row for row in (await status(first)).splitlines() if row.startswith("gateway")]
    assert len(rows) == 1 and f"pid {first.process.pid} " in rows[0]  # type: ignore[union-attr]


async def test_another_workspace_is_warned_about_and_status_shows_each(
    tmp_path: Path,
    first: GatewayProcess,
    fake_llm: FakeLLM,
    telegram: FakeTelegram,
    postgres_url: str,
) -> None:
    second = member(
        tmp_path, "second", fake_llm, telegram, postgres_url, workspace=tmp_path / "local"
    )
    await second.start(ready=READY)
    try:
        await second.wait_log("must share one workspace")
        [warning] = [line for line in second.lines if "must share one workspace" in line]
        assert f"workspace is {tmp_path / 'local'} but pid {first.process.pid} " in warning  # type: ignore[union-attr]
        assert f"uses {tmp_path / 'shared'}" in warning

        telegram.user_message(77, "hello", user_id=77)
        await telegram.wait_for(lambda: len(telegram.sent(77)) == 1, seconds=30)
        shown = await status(first)
    finally:
        await second.stop()
    rows = [row for row in shown.splitlines() if row.startswith(("gateway", "workspace"))]
    gateways = [row for row in rows if row.startswith("gateway")]
    assert len(gateways) == 2
    assert sum(", holds 1 session," in row for row in gateways) == 1
    assert any(f", workspace {tmp_path / 'local'};" in row for row in gateways)
    assert any(f", workspace {tmp_path / 'shared'};" in row for row in gateways)
    [warning] = [row for row in rows if "WARNING" in row]
    assert warning.split(None, 1)[1].startswith(
        "WARNING: the running gateways use different workspaces"
    )
