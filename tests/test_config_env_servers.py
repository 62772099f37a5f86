"""MCP servers set through the environment: names below a server keep their case."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanobot.config import exposed, load
from nanobot.errors import ConfigError


@pytest.fixture
def file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "mcp:\n"
        "  servers:\n"
        "    GitHub: {command: github-mcp, env: {GITHUB_HOST: github.com}}\n"
        "    home-assistant: {url: 'https://ha.example/mcp', timeout: 10}\n",
        encoding="utf-8",
    )
    path.chmod(0o644)  # readable by others: any secret counted as the file's would warn
    return path


def test_a_servers_env_variable_keeps_its_case_beside_the_files(
    file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANOBOT_MCP__SERVERS__GITHUB__ENV__GITHUB_TOKEN", "ghp_secret")
    config = load(file)
    env = config.mcp.servers["GitHub"].env
    assert {name: value.get_secret_value() for name, value in env.items()} == {
        "GITHUB_HOST": "github.com",
        "GITHUB_TOKEN": "ghp_secret",
    }
    assert exposed(config) is None, "a secret from the environment is not the file's"


def test_a_header_and_a_key_reach_a_server_whose_name_has_a_dash(
    file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANOBOT_MCP__SERVERS__HOME_ASSISTANT__HEADERS__Authorization", "Bearer t")
    monkeypatch.setenv("NANOBOT_MCP__SERVERS__HOME_ASSISTANT__TIMEOUT", "25")
    server = load(file).mcp.servers["home-assistant"]
    assert server.headers["Authorization"].get_secret_value() == "Bearer t"
    assert server.timeout == 25
    assert server.url == "https://ha.example/mcp"


def test_a_whole_server_from_the_environment_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANOBOT_MCP__SERVERS__TIME", '{"command": "uvx"}')
    monkeypatch.setenv("NANOBOT_MCP__SERVERS__TIME__ARGS", '["mcp-server-time"]')
    monkeypatch.setenv("NANOBOT_MCP__SERVERS__TIME__APPROVAL_TOOLS__get_current_time", "allow")
    monkeypatch.setenv("NANOBOT_MCP", '{"servers": {"notes": {"command": "notes-mcp"}}}')
    empty = tmp_path / "config.yaml"
    empty.write_text("{}\n", encoding="utf-8")
    servers = load(empty).mcp.servers
    assert sorted(servers) == ["notes", "time"]
    assert servers["time"].args == ["mcp-server-time"]
    assert servers["time"].approval_tools == {"get_current_time": "allow"}


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("NANOBOT_MCP__SERVERS__GITHUB__COMAND", "x", "unknown key"),
        ("NANOBOT_MCP__SERVERS__GITHUB__ENV__A__B", "x", "unknown key"),
        ("NANOBOT_MCP__SERVERS__GITHUB__TIMEOUT__X", "1", "timeout has no entries"),
        ("NANOBOT_MCP__SERVERS__GITHUB__ARGS", "--stdio", "not valid JSON"),
        ("NANOBOT_MCP__SERVERS__GITHUB__ENV", '["A"]', "must be a JSON object"),
        ("NANOBOT_MCP__SERVERS", "{", "not valid JSON"),
    ],
)
def test_a_bad_variable_is_named_with_what_it_must_be(
    file: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load(file)
    assert str(caught.value).startswith(f"environment variable {name}: "), caught.value
    assert says in str(caught.value)


def test_a_bad_value_is_reported_at_its_key_and_variable(
    file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANOBOT_MCP__SERVERS__GITHUB__ENV__GITHUB_TOKEN", "t")
    monkeypatch.setenv("NANOBOT_MCP__SERVERS__GITHUB__TIMEOUT", "-1")
    with pytest.raises(ConfigError) as caught:
        load(file)
    assert "mcp.servers.GitHub.timeout" in str(caught.value)


def test_two_servers_answering_to_one_variable_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("mcp: {servers: {a-b: {command: x}, A_B: {command: y}}}\n", encoding="utf-8")
    monkeypatch.setenv("NANOBOT_MCP__SERVERS__a_B__ENV__K", "v")
    with pytest.raises(ConfigError, match="a-b and A_B both answer to this name"):
        load(path)
