"""One MCP server kept connected (`nanobot.mcp.connection.Connection`), against the fakes in
tests/fakes over stdio, Streamable HTTP and the older HTTP+SSE transport: its faults, each with
a clear state and reason, its restarts, its tool list changing, its stderr in the log, and the
secrets of its config nowhere but on its own wire. The sandbox is test_mcp_launch.py's; calls
through the registry's source are test_mcp_servers.py's."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from nanobot import log
from nanobot.mcp.connection import STDERR_LINES, CallFailed, Connection, State
from tests._mcp import (
    LEGACY,
    eventually,
    log_lines,
    processes_with,
    remote,
    running,
    servers_with,
    shell,
    stdio,
)
from tests.fakes.mcp_http import SCRIPT, serve_http

ENV_SECRET = "envvalue-7d1c0e5b9a"
HEADER_SECRET = "hdrvalue-55aa0f3c21"
TOKEN = "tokvalue-a1b2c3d4e5"


def tool(connection: Connection, name: str) -> object:
    return connection.tools[f"{connection.name}_{name}"]


async def text_of(connection: Connection, name: str, arguments: dict[str, object]) -> str:
    result = await connection.call(tool(connection, name), arguments)  # type: ignore[arg-type]
    block = result.content[0]
    assert block.type == "text"
    return block.text


# -- restarts ----------------------------------------------------------------------------------


async def test_a_server_dying_mid_call_is_an_error_saying_so_and_it_comes_back(
    tmp_path: Path,
) -> None:
    """Twice: the process exits (crash), then it lives on but closes its output."""
    mark = str(tmp_path / "dying-mark")
    with log_lines() as lines:
        async with running(stdio("crashy", "--name", mark), tmp_path) as connection:
            assert connection.status.state is State.RUNNING
            before = set(connection.tools)
            for fault in ("crash", "close_output"):
                with pytest.raises(CallFailed) as failed:
                    await connection.call(tool(connection, fault), {})  # type: ignore[arg-type]
                assert str(failed.value) == (
                    "the MCP server crashy stopped during the call; it is being started again, "
                    "so the call may have been carried out or not"
                )
                await eventually(lambda: connection.status.state is State.FAILED)
                assert connection.tools == {}  # absent meanwhile
                assert connection.status.reason == "the server closed the connection"
                await eventually(lambda: connection.status.state is State.RUNNING)
                assert set(connection.tools) == before
                assert len(servers_with(mark)) == 1  # the new one: the mute one was ended
                assert await text_of(connection, "echo", {"text": "back"}) == "back"
    await eventually(lambda: not processes_with(mark))
    said = [line for line in lines if "starting it again" in line]
    # A run that worked starts the count anew: each time the first, shortest pause.
    assert said == 2 * [
        "WARNING MCP server crashy: the server closed the connection; its tools are absent; "
        "starting it again in 0.05 s"
    ]


async def test_a_server_that_never_starts_is_tried_again_ever_more_slowly(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-server"
    config = shell("broken", 'exec "$0"', str(missing))
    with log_lines() as lines:
        async with running(config, tmp_path) as connection:
            await eventually(lambda: sum("starting it again" in line for line in lines) >= 4)
            assert connection.status.state in (State.FAILED, State.STARTING)
    tries = [line for line in lines if "starting it again" in line]
    # Logged once at WARNING, then quietly, each pause longer until the last repeats.
    assert tries[0].startswith("WARNING MCP server broken: ")
    assert all(line.startswith("DEBUG ") for line in tries[1:])
    assert [line.rsplit(" in ", 1)[1] for line in tries[:4]] == [
        "0.05 s",
        "0.1 s",
        "0.2 s",
        "0.2 s",
    ]


async def test_a_server_that_exits_at_start_is_failed_with_its_last_words(tmp_path: Path) -> None:
    config = shell(
        "db", 'echo "connecting to db" >&2; echo "key sk-abcdefghijklmnop refused" >&2; exit 3'
    )
    async with running(config, tmp_path) as connection:
        await eventually(lambda: connection.status.state is State.FAILED)
        assert connection.status.reason == (
            "the server closed the connection; its last line on stderr: key *** refused"
        )


async def test_a_start_beyond_startup_timeout_fails_with_why_and_is_retried(
    tmp_path: Path,
) -> None:
    """The first start swallows its input and never answers; the next one is the fake."""
    first = tmp_path / "started-once"
    script = 'if [ -e "$0" ]; then exec "$@"; fi; : > "$0"; while read -r line; do :; done'
    config = shell("sleepy", script, str(first), sys.executable, str(SCRIPT), startup_timeout=5.0)
    async with running(config, tmp_path, settled=False) as connection:
        await eventually(lambda: connection.status.state is State.FAILED, within=30)
        assert connection.status.reason == (
            "it did not start and list its tools in time (startup_timeout)"
        )
        assert connection.tools == {}
        await eventually(lambda: connection.status.state is not State.FAILED, within=30)
        await eventually(lambda: connection.status.state is State.RUNNING, within=60)
    assert first.exists()


# -- tool lists that change ----------------------------------------------------------------------


@pytest.mark.parametrize("era", ["2026-07-28", "2025-11-25"])
async def test_stdio_a_changed_tool_list_is_seen_by_the_next_offer(
    tmp_path: Path, era: str
) -> None:
    config = stdio("grower", script=LEGACY if era == "2025-11-25" else SCRIPT)
    async with running(config, tmp_path) as connection:
        assert "grower_late" not in connection.tools
        assert await text_of(connection, "grow", {}) == "grown"
        await eventually(lambda: "grower_late" in connection.tools)
        assert await text_of(connection, "late", {"x": "bloomer"}) == "late bloomer"
        assert connection.status.state is State.RUNNING


async def test_http_a_changed_tool_list_is_seen_by_the_next_offer(tmp_path: Path) -> None:
    async with serve_http() as url, running(remote("grown", url), tmp_path) as connection:
        assert "grown_late" not in connection.tools
        assert await text_of(connection, "grow", {}) == "grown"
        await eventually(lambda: "grown_late" in connection.tools)
        assert await text_of(connection, "late", {"x": "comer"}) == "late comer"


async def test_http_a_connection_stays_up_across_its_liveness_checks(tmp_path: Path) -> None:
    """The 2026-07-28 protocol has no ping: the check must use what the era has (there, a
    listing, whose missing tools are said once, not at every check)."""
    with log_lines() as lines:
        async with serve_http() as url:
            config = remote("steady", url, tools=("echo", "nope"))
            async with running(config, tmp_path, watch_every=0.1) as connection:
                since = connection.status.since
                for _ in range(5):
                    assert await text_of(connection, "echo", {"text": "up"}) == "up"
                    await asyncio.sleep(0.1)
                state = (connection.status.state, connection.status.since)
                assert state == (State.RUNNING, since)
                assert set(connection.tools) == {"steady_echo"}
    said = [line for line in lines if "names tools it does not list" in line]
    assert said == [
        "WARNING MCP server steady: mcp.servers.steady.tools names tools it does not list: nope"
    ]


# -- remote servers ------------------------------------------------------------------------------


async def test_http_a_refused_token_is_a_clear_failure_without_the_headers_value(
    tmp_path: Path,
) -> None:
    headers = {"Authorization": f"Bearer {HEADER_SECRET}", "X-Api-Key": HEADER_SECRET}
    with log_lines() as lines:
        async with serve_http("--auth", TOKEN) as url:
            async with running(remote("locked", url, headers=headers), tmp_path) as connection:
                assert connection.status.state is State.FAILED
                assert connection.status.reason == (
                    "the server answered HTTP 401 (Unauthorized): check mcp.servers.locked.headers"
                )
            good = {"Authorization": f"Bearer {TOKEN}"}
            async with running(remote("opened", url, headers=good), tmp_path) as connection:
                assert await text_of(connection, "echo", {"text": "in"}) == "in"
    assert lines
    assert not [line for line in lines if HEADER_SECRET in line or TOKEN in line]


async def test_remote_a_500_is_a_clear_failure(tmp_path: Path) -> None:
    async with (
        serve_http("--fail-status", "500") as url,
        running(remote("broken", url), tmp_path) as connection,
    ):
        assert connection.status.state is State.FAILED
        assert connection.status.reason == "the server answered HTTP 500 (Internal Server Error)"


async def test_remote_a_server_that_goes_away_fails_the_call_and_the_state(
    tmp_path: Path,
) -> None:
    async with serve_http() as url, running(remote("gone", url), tmp_path) as connection:
        with pytest.raises(CallFailed) as failed:
            await connection.call(tool(connection, "crash"), {})  # type: ignore[arg-type]
        assert str(failed.value).startswith("the MCP server gone ")
        await eventually(lambda: connection.status.state is State.FAILED)
        assert connection.tools == {}
        # Tried again, it is not there at all.
        await eventually(
            lambda: connection.status.reason.startswith("the server cannot be reached (")
        )


# -- what reaches the log ------------------------------------------------------------------------


async def test_stderr_reaches_the_log_redacted_and_rate_limited(tmp_path: Path) -> None:
    """The secrets of the config (as the app's logging knows them) and those of a known
    shape are hidden; past STDERR_LINES a minute lines are counted, and the count is said."""
    log.setup(level="DEBUG", secrets=[ENV_SECRET])
    extra = 7
    script = (
        'i=0; while [ $i -lt "$0" ]; do echo "line $i key sk-abcdefghijklmnop $MY_TOKEN" >&2; '
        'i=$((i+1)); done; exec "$@"'
    )
    count = str(STDERR_LINES + extra)
    config = shell(
        "chatty", script, count, sys.executable, str(SCRIPT), env={"MY_TOKEN": ENV_SECRET}
    )
    with log_lines() as lines:
        async with running(config, tmp_path) as connection:
            assert connection.status.state is State.RUNNING
    logged = [line for line in lines if line.startswith("INFO MCP server chatty stderr: line")]
    assert logged == [
        f"INFO MCP server chatty stderr: line {i} key *** ***" for i in range(STDERR_LINES)
    ]
    assert f"INFO MCP server chatty stderr: {extra} more lines not logged" in lines
    assert not [line for line in lines if ENV_SECRET in line or "sk-abc" in line]


async def test_env_values_are_in_no_log_line_status_or_command_line(tmp_path: Path) -> None:
    env = {"SERVICE_TOKEN": ENV_SECRET, "PLAIN": "visible"}
    with log_lines() as lines:
        async with running(stdio("keeper", env=env), tmp_path) as connection:
            who = (await connection.call(tool(connection, "whoami"), {})).structured_content  # type: ignore[arg-type]
            assert who is not None
            cmdline = Path(f"/proc/{who['pid']}/cmdline").read_bytes()
            environ = Path(f"/proc/{who['pid']}/environ").read_bytes()
            status = connection.status
    assert ENV_SECRET.encode() not in cmdline
    assert f"SERVICE_TOKEN={ENV_SECRET}".encode() in environ  # where it belongs, only
    assert ENV_SECRET not in repr(connection.config) + json.dumps(status.reason)
    assert ENV_SECRET not in json.dumps([str(t) for t in status.tools.values()])
    assert lines
    assert not [line for line in lines if ENV_SECRET in line]
