"""`nanobot mcp list`, `nanobot mcp test NAME` and the MCP lines of `nanobot status` with no
gateway running, and mistakes in `mcp.servers` as a user meets them (issue 28 §1, §4): the
CLI as a subprocess, the SDK-built fake as the server it starts. What a running gateway
reports is tests/test_gateway_mcp.py's.

The subprocesses of a test run side by side: each is mostly Python starting.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
import yaml

from nanobot.config import load
from nanobot.errors import ConfigError
from tests.conftest import Home
from tests.fakes.mcp_http import SCRIPT, serve_http
from tests.test_cli import Result, nanobot

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

TOKEN = "cli-bearer-token-5e1f9a7c"  # a remote's header: shown nowhere
ENV_VALUE = "cli-env-value-8d2b6e4f"  # a stdio server's env: shown nowhere
URL_KEY = "cli-url-key-3c7a1d9e"  # in a remote's URL: not shown by mcp list or status
NOT_RUNNING = "not running: no gateway runs on this data dir (nanobot mcp test NAME starts it once)"


def fake(home: Home, *options: str, **settings: Any) -> dict[str, Any]:
    """The fake, its script in the workspace (the sandbox shows that, not tests/)."""
    workspace = home.data_dir / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPT, workspace / SCRIPT.name)
    return {"command": sys.executable, "args": [str(workspace / SCRIPT.name), *options], **settings}


def with_servers(home: Home, servers: dict[Any, Any], name: str = "mcp.yaml") -> Path:
    """A config of `home`'s with these `mcp.servers` (at `name` beside it); its path."""
    base = yaml.safe_load(home.config.read_text())
    path = home.root / name
    text = yaml.safe_dump({**base, "mcp": {"servers": servers}}, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)
    return path


def run(home: Home, config: Path, *args: str, **env: str) -> Coroutine[Any, Any, Result]:
    """`nanobot *args` with `config` and `env` besides the home's (to be awaited)."""
    return nanobot(home, *args, env={**home.env, "NANOBOT_CONFIG": str(config), **env})


def running_with(mark: str) -> list[int]:
    """The pids of processes whose command line holds `mark`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_list_and_status_name_each_server_its_transport_and_that_none_runs(
    home: Home,
) -> None:
    config = with_servers(
        home,
        {
            "fake": fake(home, env={"FAKE_API_TOKEN": ENV_VALUE}),
            "bare": {"command": "some-mcp-server", "sandbox": "none"},
            "remote": {  # a key in the URL, as some services hand them out
                "url": f"http://ada:{URL_KEY}@127.0.0.1:9/mcp?key={URL_KEY}#{URL_KEY}",
                "headers": {"Authorization": f"Bearer {TOKEN}"},
            },
            "idle": {"command": "another-mcp-server", "enabled": False},
        },
    )
    listed, status, empty = await asyncio.gather(
        run(home, config, "mcp", "list"),
        run(home, config, "status"),
        run(home, home.config, "mcp", "list"),
    )
    assert (listed.code, listed.stderr) == (0, "")
    expected = {
        "fake": f"stdio ({sys.executable}), in the sandbox; {NOT_RUNNING}",
        "bare": f"stdio (some-mcp-server), WITHOUT the sandbox; {NOT_RUNNING}",
        "remote": f"remote, http://127.0.0.1:9/mcp; {NOT_RUNNING}",
        "idle": "stdio (another-mcp-server), in the sandbox; disabled (enabled: false)",
    }
    assert listed.stdout.splitlines() == [f"{name}: {text}" for name, text in expected.items()]
    assert status.code == 0, status.stderr
    rows = {
        line.split()[1]: line.split(None, 2)[2]
        for line in status.stdout.splitlines()
        if line.startswith("mcp ")
    }
    assert rows == expected, status.stdout
    assert (empty.code, empty.stdout.strip()) == (
        0,
        "no MCP servers are configured (mcp.servers; see docs/tools.md, MCP servers)",
    )
    for result in (listed, status):
        for secret in (TOKEN, ENV_VALUE, URL_KEY):
            assert secret not in result.stdout + result.stderr


async def test_mcp_test_starts_one_server_lists_its_tools_and_stops_it(home: Home) -> None:
    config = with_servers(
        home,
        {
            "fake": fake(home, env={"FAKE_API_TOKEN": ENV_VALUE}, approval_tools={"add": "allow"}),
            "bare": fake(home, sandbox="none"),
            "broken": {  # bare: its failure is the point, and a sandbox costs a second
                "command": sys.executable,
                "args": ["-c", "import sys; sys.exit('cannot reach the database')"],
                "sandbox": "none",
            },
        },
    )
    tested, bare, broken, unknown = await asyncio.gather(
        run(home, config, "mcp", "test", "fake"),
        run(home, config, "mcp", "test", "bare"),
        run(home, config, "mcp", "test", "broken"),
        run(home, config, "mcp", "test", "nosuch"),
    )
    assert tested.code == 0, tested.stderr
    lines = tested.stdout.splitlines()
    assert lines[0] == "fake: running, 17 tools"
    assert "  fake_echo: ask (tools.approval.other); the server says: read-only" in lines
    assert "      Answer with the text given." in lines
    assert "  fake_add: allow (mcp.servers.fake.approval_tools.add)" in lines
    assert "  fake_delete_all: ask (tools.approval.other); the server says: destructive" in lines
    assert running_with(str(home.data_dir / "workspace" / SCRIPT.name)) == []  # stopped

    assert bare.code == 0, bare.stderr
    first = "bare: running, WITHOUT the sandbox (mcp.servers.bare.sandbox: none), 17 tools"
    assert bare.stdout.splitlines()[0] == first

    assert broken.code == 1, broken.stderr
    said = broken.stdout.splitlines()
    assert said[0].startswith("broken: failed: "), broken.stdout
    # The server's own words, without the client's "starting it again" (nothing is).
    assert said[1:] == ["  its last lines on stderr:", "    cannot reach the database"]
    assert broken.stderr == ""

    assert unknown.code == 2
    assert unknown.stderr.strip() == (
        "nanobot: no MCP server is named 'nosuch' in mcp.servers (fake, bare, broken)"
    )
    for result in (tested, bare, broken, unknown):
        assert ENV_VALUE not in result.stdout + result.stderr


BAD: list[tuple[str, dict[Any, Any], str, str]] = [
    # (what is wrong, mcp.servers, the key named, the reason given)
    (
        "both",
        {"x": {"command": "a", "url": "http://127.0.0.1/mcp"}},
        "mcp.servers.x",
        "give either command (a server nanobot starts) or url (a remote server), not both",
    ),
    (
        "neither",
        {"x": {"args": ["a"]}},
        "mcp.servers.x",
        "give command (a server nanobot starts, with args) or url (a remote server)",
    ),
    ("unknown key", {"x": {"command": "a", "comand": "b"}}, "mcp.servers.x.comand", "unknown key"),
    (
        "not http",
        {"x": {"url": "ftp://127.0.0.1/mcp"}},
        "mcp.servers.x.url",
        "must be an http:// or https:// address of an MCP server, not 'ftp://127.0.0.1/mcp'",
    ),
    (
        "names that clash",
        {"git": {"command": "a"}, "git_hub": {"command": "b"}},
        "mcp.servers",
        "servers 'git' and 'git_hub': the tool names of one could pass for the other's (git_…); "
        "rename one",
    ),
    (
        "a built-in's prefix",
        # (not `web`: which of web_fetch and web_search it names changes from run to run)
        {"read": {"command": "a"}},
        "mcp.servers",
        "server name 'read': its tools could pass for the built-in read_file; choose another name",
    ),
    (
        "a bare off",
        {False: {"command": "a"}},
        "mcp.servers",
        "a server named False: YAML reads a bare on, off, yes, no or a number as that value, not "
        "a name; quote it ('off') or choose another",
    ),
]


@pytest.mark.parametrize(
    ("servers", "key", "reason"), [case[1:] for case in BAD], ids=[c[0] for c in BAD]
)
def test_a_bad_server_config_names_the_file_the_key_and_why(
    home: Home, servers: dict[Any, Any], key: str, reason: str
) -> None:
    """In process: each mistake costs no interpreter of its own (the CLI's exit 2 is the
    same for every one, below)."""
    config = with_servers(home, servers, "bad.yaml")
    with pytest.raises(ConfigError) as refused:
        load(config)
    assert str(refused.value).splitlines() == [
        f"{config}: invalid configuration",
        f"  {key}: {reason}",
    ]


async def test_a_bad_server_config_exits_2_with_the_file_the_key_and_why(home: Home) -> None:
    _, servers, key, reason = BAD[4]
    config = with_servers(home, servers, "bad.yaml")
    commands = (["mcp", "list"], ["mcp", "test", "git"])  # tests/test_cli.py has the others
    done = await asyncio.gather(*(run(home, config, *command) for command in commands))
    for command, result in zip(commands, done, strict=True):
        assert result.code == 2, (command, result)
        assert result.stderr.splitlines() == [
            f"nanobot: {config}: invalid configuration",
            f"  {key}: {reason}",
        ], command
        assert result.stdout == ""


async def test_a_header_given_through_the_environment_reaches_the_server(home: Home) -> None:
    async with serve_http("--auth", TOKEN) as url:
        config = with_servers(home, {"remote": {"url": url}})
        name = "NANOBOT_MCP__SERVERS__REMOTE__HEADERS__AUTHORIZATION"
        result = await run(home, config, "mcp", "test", "remote", **{name: f"Bearer {TOKEN}"})
    assert result.code == 0, result.stderr
    assert result.stdout.splitlines()[0] == "remote: running, 17 tools"
    assert TOKEN not in result.stdout + result.stderr


async def test_what_a_bare_server_forks_does_not_outlive_mcp_test(home: Home) -> None:
    pidfile = home.root / "forked.pid"
    config = with_servers(home, {"bare": fake(home, "--fork-child", str(pidfile), sandbox="none")})
    result = await run(home, config, "mcp", "test", "bare")
    assert result.code == 0, result.stderr
    child = int(pidfile.read_text())
    try:
        assert running_with(str(pidfile)) == [], f"the forked child {child} runs on"
    finally:
        if child in running_with(str(pidfile)):  # ours: its command line names the file
            os.kill(child, signal.SIGKILL)
