"""Channel states (channels/health.py): transitions, the file another process reads, and
what a failing disk or a damaged file does."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nanobot.channels.health import FILE, ChannelHealth, ChannelState, read_states
from nanobot.log import redact
from tests._clock import Clock

T0 = datetime(2026, 6, 15, 9, 0, tzinfo=UTC)
TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"


def test_a_channel_is_down_from_the_start_until_it_connects(tmp_path: Path) -> None:
    clock = Clock(T0)
    health = ChannelHealth(["telegram", "discord"], tmp_path / FILE, clock)
    assert read_states(tmp_path / FILE) == [
        ChannelState("telegram", up=False, since=T0),
        ChannelState("discord", up=False, since=T0),
    ]
    clock.time += timedelta(seconds=3)
    health.failed("telegram", "connection refused")
    clock.time += timedelta(seconds=3)
    health.failed("telegram", "timed out")  # still down since the start: the latest reason
    health.connected("discord")
    telegram, discord = read_states(tmp_path / FILE) or []
    assert telegram == ChannelState("telegram", up=False, since=T0, reason="timed out")
    assert telegram.down_for(T0 + timedelta(minutes=5)) == timedelta(minutes=5)
    assert discord == ChannelState("discord", up=True, since=T0 + timedelta(seconds=6))
    assert discord.down_for(T0 + timedelta(days=1)) == timedelta(0)
    clock.time += timedelta(seconds=4)
    health.connected("discord")  # connected again (a restart): up since the first time
    health.failed("discord", "stopped by itself")  # down from now
    [_, discord] = health.states()
    assert (discord.up, discord.since) == (False, T0 + timedelta(seconds=10))


def test_a_reason_is_redacted_and_on_one_line(tmp_path: Path) -> None:
    health = ChannelHealth(["telegram"], tmp_path / FILE, Clock(T0), redact)
    health.failed("telegram", f"GET https://api.telegram.org/bot{TOKEN}/getMe\nfailed " + "x" * 400)
    [state] = read_states(tmp_path / FILE) or []
    assert TOKEN not in state.reason and "/bot***/getMe failed x" in state.reason
    assert len(state.reason) == 300 and state.reason.endswith("…")
    assert TOKEN not in (tmp_path / FILE).read_text(encoding="utf-8")


def test_refused_for_good_is_said(tmp_path: Path) -> None:
    health = ChannelHealth(["discord"], tmp_path / FILE, Clock(T0))
    health.failed("discord", "the token was rejected", for_good=True)
    [state] = health.states()
    assert state.describe(lambda at: at.strftime("%H:%M")) == (
        "stopped for good since 09:00: the token was rejected"
    )
    assert ChannelState("t", up=True, since=T0).describe(str).startswith("connected since 2026")
    assert ChannelState("t", up=False, since=T0).describe(str).startswith("connecting since")


def test_a_write_that_fails_is_said_once_and_the_states_go_on(
    tmp_path: Path, warnings: list[str]
) -> None:
    target = tmp_path / "gone" / FILE  # its directory does not exist: every write fails
    health = ChannelHealth(["telegram"], target, Clock(T0))
    health.failed("telegram", "refused")
    health.connected("telegram")
    assert health.states()[0].up
    [said] = [line for line in warnings if "could not record the channels' states" in line]
    assert str(target) in said
    target.parent.mkdir()
    health.failed("telegram", "down again")
    assert read_states(target) == health.states()
    assert list(target.parent.iterdir()) == [target]  # no temporary file left behind


def test_no_file_or_a_damaged_one_reads_as_no_states(tmp_path: Path) -> None:
    assert read_states(tmp_path / FILE) is None
    (tmp_path / FILE).write_text('[{"name": "telegram"', encoding="utf-8")
    assert read_states(tmp_path / FILE) is None
    (tmp_path / FILE).write_text(json.dumps([{"up": True}]), encoding="utf-8")
    assert read_states(tmp_path / FILE) is None
