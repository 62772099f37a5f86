"""`nanobot status --check` (the image's HEALTHCHECK) and the gateways `nanobot status` lists,
as a user runs them: real subprocesses, rows written through the store, and one real gateway."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from nanobot.cluster.timings import ALONE
from nanobot.manage import GATEWAY_LOCK
from nanobot.store import Database
from nanobot.store.leases import Leases
from nanobot.store.members import Member, Members
from tests.conftest import Home
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import GatewayProcess
from tests.test_cli import nanobot
from tests.test_gateway_telegram import gateway_config

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

BERLIN = "timezone: Europe/Berlin\n"


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=DEFAULT_TOKEN) as fake:
        yield fake


async def register(home: Home, *, beat_at: datetime, pid: int = 42) -> Member:
    member = Member.new(beat_at, host="box", pid=pid, version="0.0.9", lifetime=ALONE)
    async with await Database.open(home.data_dir / "state.db") as db:
        await Members(db).register(member)
    return member


@contextmanager
def holding(home: Home, member: Member | None, pid: int = 42) -> Iterator[None]:
    """The data dir's gateway lock held as a running gateway holds it (`nanobot.launch`),
    naming its pid and `member` (none yet: it starts)."""
    home.data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(home.data_dir / GATEWAY_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{pid} {member.id if member else ''}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


async def test_a_fresh_data_dir_has_no_gateway_and_is_left_as_it_was(home: Home) -> None:
    result = await nanobot(home, "status", "--check")
    assert result.code == 1, result.stderr
    db = home.data_dir / "state.db"
    assert result.stdout == f"no gateway has run on this data dir yet ({db} does not exist)\n"
    assert result.stderr == ""
    assert not home.data_dir.exists()


async def test_a_database_without_members_has_no_gateway_running(home: Home) -> None:
    async with await Database.open(home.data_dir / "state.db"):
        pass
    result = await nanobot(home, "status", "--check")
    lock = home.data_dir / GATEWAY_LOCK
    assert (result.code, result.stdout) == (
        1,
        f"no gateway is running on this data dir (nothing holds {lock})\n",
    )


async def test_a_fresh_beat_is_healthy(home: Home) -> None:
    member = await register(home, beat_at=datetime.now(UTC))
    with holding(home, member):
        result = await nanobot(home, "status", "--check")
    assert result.code == 0, result.stdout + result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("gateway alive: pid 42 on host box, last beat ")
    assert line.endswith(f" s ago (allowed: {ALONE.seconds} s)")
    help_text = (await nanobot(home, "status", "--help")).stdout
    assert f"three beats old: {ALONE.seconds} s alone" in " ".join(help_text.split())


async def test_a_stale_beat_says_since_when_and_which_process_in_the_configured_zone(
    home: Home,
) -> None:
    home.write_config(home.config.read_text(encoding="utf-8") + BERLIN)
    member = await register(home, beat_at=datetime(2026, 1, 15, 8, 30, 5, tzinfo=UTC), pid=7)
    with holding(home, member, pid=7):  # it hangs: the lock is held, its beats stopped
        result = await nanobot(home, "status", "--check")
    assert result.code == 1
    assert result.stdout == (
        f"no gateway has beaten since 2026-01-15 09:30:05 CET (pid 7 on host box, member "
        f"{member.id}); a running one beats every 15 s and counts as down after 45 s\n"
    )


async def test_a_beat_just_older_than_allowed_is_stale(home: Home) -> None:
    member = await register(home, beat_at=datetime.now(UTC) - ALONE - timedelta(seconds=1))
    with holding(home, member):
        result = await nanobot(home, "status", "--check")
    assert result.code == 1
    assert result.stdout.startswith("no gateway has beaten since ")


async def test_another_members_beat_does_not_make_this_gateway_alive(home: Home) -> None:
    """Two members of a cluster on one database: this data dir's is dead (its lock free) or
    hung (its beats stopped) while the other beats on."""
    await register(home, beat_at=datetime.now(UTC), pid=8)  # the other member, alive
    mine = await register(home, beat_at=datetime.now(UTC) - ALONE, pid=9)
    result = await nanobot(home, "status", "--check")
    assert (result.code, result.stdout.split(" (")[0]) == (
        1,
        "no gateway is running on this data dir",
    )
    with holding(home, mine, pid=9):
        result = await nanobot(home, "status", "--check")
    assert result.code == 1
    assert result.stdout.startswith("no gateway has beaten since ")
    assert f"(pid 9 on host box, member {mine.id})" in result.stdout


async def test_a_gateway_starting_or_without_its_row_is_not_healthy(home: Home) -> None:
    async with await Database.open(home.data_dir / "state.db"):
        pass
    with holding(home, None, pid=5):
        result = await nanobot(home, "status", "--check")
    assert (result.code, result.stdout) == (
        1,
        "gateway pid 5 is starting: not registered as a member yet\n",
    )
    gone = Member.new(datetime.now(UTC), pid=5, lifetime=ALONE)  # never written, or removed
    with holding(home, gone, pid=5):
        result = await nanobot(home, "status", "--check")
    assert result.code == 1
    assert result.stdout == (
        f"gateway pid 5 holds this data dir, but its member {gone.id} is not in the state "
        "database (removed by hand, or its beats cannot be written)\n"
    )


async def test_status_lists_the_gateways_alive_and_gone(home: Home) -> None:
    home.write_config(home.config.read_text(encoding="utf-8") + BERLIN)
    await register(home, beat_at=datetime(2026, 1, 15, 8, 30, 5, tzinfo=UTC), pid=7)
    await register(home, beat_at=datetime.now(UTC), pid=8)
    result = await nanobot(home, "status")
    assert result.code == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("gateway ")]
    assert len(rows) == 2
    alive, gone = rows
    assert "pid 8 on host box, version 0.0.9, up since " in alive
    assert alive.endswith(" s ago") and "; last beat " in alive
    assert gone.endswith(
        "pid 7 on host box, version 0.0.9, up since 2026-01-15 09:30:05 CET; "
        "GONE: no beat since 2026-01-15 09:30:05 CET"
    )


async def test_status_names_the_roles_each_gateway_plays(home: Home) -> None:
    leader = await register(home, beat_at=datetime.now(UTC), pid=8)
    standby = await register(home, beat_at=datetime.now(UTC), pid=9)
    async with await Database.open(home.data_dir / "state.db") as db:
        leases = Leases(db)
        for role in ("schedule", "intake:telegram"):
            assert await leases.acquire(role, leader.id, timedelta(minutes=1))
        assert await leases.acquire("intake:discord", standby.id, timedelta(seconds=-1))
    result = await nanobot(home, "status")
    assert result.code == 0, result.stderr
    rows = {line.split()[2]: line for line in result.stdout.splitlines() if " pid " in line}
    assert ", plays intake:telegram, schedule; last beat " in rows["8"]
    assert "plays" not in rows["9"]  # its lease lapsed


async def test_status_says_when_no_gateway_runs(home: Home) -> None:
    async with await Database.open(home.data_dir / "state.db"):
        pass
    result = await nanobot(home, "status")
    assert result.code == 0, result.stderr
    assert [line.split() for line in result.stdout.splitlines() if line.startswith("gateway")] == [
        ["gateway", "none", "running"]
    ]


async def test_the_check_imports_no_heavy_library(home: Home) -> None:
    probe = (
        "import json, sys\n"
        "from nanobot.cli import app\n"
        "try:\n"
        "    app(['status', '--check'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 1, exc.code\n"
        "heavy = ('litellm', 'telegram', 'discord', 'openai', 'aiohttp', 'nanobot.app')\n"
        "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        probe,
        env=home.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, stderr.decode()
    assert json.loads(stdout.decode().strip().splitlines()[-1]) == []


async def test_a_running_gateway_is_healthy_and_after_a_clean_stop_none_runs(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    process = GatewayProcess(
        tmp_path, gateway_config(tmp_path, fake_llm, telegram), dict(os.environ)
    )
    home = Home(tmp_path, process.config_path, process.data_dir, process.env)
    await process.start(ready="telegram connected")
    assert process.process is not None
    check = await nanobot(home, "status", "--check")
    assert check.code == 0, check.stdout + check.stderr
    assert f"gateway alive: pid {process.process.pid} on host " in check.stdout
    assert await process.stop(signal.SIGTERM) == 0
    check = await nanobot(home, "status", "--check")
    assert (check.code, check.stdout) == (
        1,
        f"no gateway is running on this data dir (nothing holds {home.data_dir / GATEWAY_LOCK})\n",
    )


async def test_a_channel_that_never_connects_is_shown_down_and_fails_the_check_in_time(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram
) -> None:
    config = gateway_config(tmp_path, fake_llm, telegram)
    config["channels"]["telegram"]["api_base"] = "http://127.0.0.1:9"  # nothing listens
    process = GatewayProcess(tmp_path, config, dict(os.environ))
    home = Home(tmp_path, process.config_path, process.data_dir, process.env)
    await process.start(ready="telegram cannot reach its platform")
    try:
        await process.wait_log(
            "telegram cannot reach its platform", after=process.log().count("\n") + 1
        )
        shown = await nanobot(home, "status")
        [row] = [line for line in shown.stdout.splitlines() if line.startswith("telegram")]
        assert "enabled, 2 allowed; down since " in row
        assert "the Bot API at http://127.0.0.1:9 did not answer" in row
        assert (await nanobot(home, "status", "--check")).code == 0  # not down for 5 min yet
        changed = {**process.config, "gateway": {"channel_down_limit": "1s"}}
        process.config_path.write_text(yaml.safe_dump(changed), encoding="utf-8")
        check = await nanobot(home, "status", "--check")
        assert check.code == 1, check.stdout + check.stderr
        assert ", but telegram is down since " in check.stdout
        assert "(longer than gateway.channel_down_limit, 1s)" in check.stdout
        # Routine offline: one warning a try, no traceback, no error.
        assert "Traceback" not in process.log()
        assert " | ERROR " not in process.log()
    finally:
        await process.stop(signal.SIGKILL)
