"""The composition root's own work: the data dir is private to its owner; the sandbox exec
runs in is opened, said and closed."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from nanobot.app import describe_sandbox, open_sandbox, private_dir
from nanobot.app._channels import check_channels
from nanobot.config import Config, load
from nanobot.errors import ConfigError
from nanobot.tools.bubblewrap import Bubblewrap
from nanobot.tools.sandbox import Unavailable


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_data_dir_is_made_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        private_dir(tmp_path / "data" / "nested")
    finally:
        os.umask(old)
    assert mode(tmp_path / "data" / "nested") == 0o700


@pytest.mark.parametrize(("before", "after"), [(0o755, 0o700), (0o777, 0o700), (0o500, 0o500)])
def test_an_existing_data_dir_loses_group_and_others_access(
    tmp_path: Path, before: int, after: int
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(before)
    private_dir(data)
    assert mode(data) == after


# --- The sandbox as the gateway opens it (issue 25 §1) -----------------------------------


def _config(tmp_path: Path, exec_settings: str) -> Config:
    path = tmp_path / "config.yaml"
    tmp_path.mkdir(exist_ok=True)
    path.write_text(f"data_dir: {tmp_path / 'data'}\ntools:\n  exec: {exec_settings}\n")
    config = load(path)
    config.workspace_path.mkdir(parents=True)
    return config


@pytest.fixture
def infos() -> Iterator[list[str]]:
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="INFO", format="{message}")
    yield messages
    logger.remove(sink)


async def test_public_runs_a_namespace_and_a_proxy_for_as_long_as_the_sandbox_is_open(
    tmp_path: Path, infos: list[str]
) -> None:
    config = _config(tmp_path, "{allow_hosts: ['127.0.0.1:11434']}")
    async with open_sandbox(config) as sandbox:
        assert isinstance(sandbox, Bubblewrap)
        with sandbox.call() as call:
            assert call.egress is not None
            proxy_url = call.env["HTTP_PROXY"]
            argv = sandbox.command(["true"], call=call)
        joined = next(a for a in argv if a.startswith("--net="))  # --net=/proc/<us>/fd/<n>
        namespace = str(Path(joined.split("=", 1)[1]).readlink())
        port = int(proxy_url.rsplit(":", 1)[1])
        assert namespace.startswith("net:[") and _in(namespace)
    assert not _in(namespace)  # its holder is gone, and with it the namespace
    with pytest.raises(OSError):  # the proxy's socket is gone with its namespace
        socket.create_connection(("127.0.0.1", port), timeout=1)
    started = [m for m in infos if m.startswith("exec sandbox:")]
    assert len(started) == 1
    assert (
        "network: public (a namespace of its own; out only through the egress proxy" in (started[0])
    )
    assert "and 127.0.0.1:11434" in started[0]


def _in(namespace: str) -> bool:
    """Whether any process is in `namespace` ("net:[inode]")."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str((entry / "ns" / "net").readlink()) == namespace:
                return True
        except OSError:
            continue
    return False


@pytest.mark.parametrize(("given", "means"), [("true", "public"), ("false", "none")])
async def test_the_old_boolean_is_said_once_at_start(
    tmp_path: Path, infos: list[str], given: str, means: str
) -> None:
    async with open_sandbox(_config(tmp_path, f"{{network: {given}}}")):
        pass
    said = [m.strip() for m in infos if "is the old form" in m]
    assert said == [
        f"tools.exec.network: {given} is the old form; it now means {means} "
        + (
            "(public: a network of its own, out only through nanobot's proxy to public "
            "addresses; none; host)"
        )
    ]


async def test_host_is_warned_about_at_every_start(tmp_path: Path, warnings: list[str]) -> None:
    config = _config(tmp_path, "{network: host}")
    for _ in range(2):
        async with open_sandbox(config) as sandbox:
            assert sandbox is not None and "network: host" in sandbox.description
    assert sum("tools.exec.network is host" in m for m in warnings) == 2


async def test_without_a_namespace_public_refuses_exec_or_stops_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("nanobot.tools.netns._nsenter", lambda: None)
    async with open_sandbox(_config(tmp_path, "{}")) as sandbox:
        assert isinstance(sandbox, Unavailable)
        assert "tools.exec.network is public, but nsenter (util-linux) is not installed" in (
            sandbox.reason
        )
        assert "tools.exec.network: none" in sandbox.reason
    with pytest.raises(ConfigError, match=r"network: none .* or host"):
        async with open_sandbox(_config(tmp_path / "b", "{sandbox: bwrap}")):
            pass
    assert "nsenter (util-linux) is not installed" in describe_sandbox(
        _config(tmp_path / "c", "{}")
    )


def test_status_describes_the_network(tmp_path: Path) -> None:
    assert "network: public" in describe_sandbox(_config(tmp_path, "{}"))
    assert "network: none" in describe_sandbox(_config(tmp_path / "b", "{network: none}"))


def test_spoken_replies_without_a_speech_model_stop_the_gateway(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "channels: {telegram: {enabled: true, token: '1:x', voice_replies: when_spoken}}\n"
    )
    with pytest.raises(ConfigError) as caught:
        check_channels(load(path), terminal=False)
    assert str(caught.value) == (
        f"{path}: channels.telegram.voice_replies is when_spoken, but no tts.model is set to "
        "speak with: set tts.model (e.g. openai/tts-1), or voice_replies: off"
    )
    path.write_text(path.read_text() + "tts: {model: openai/tts-1}\n")
    check_channels(load(path), terminal=False)
