"""The one duration syntax, shared by the config file and `nanobot cron add --every`."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from nanobot.config import load
from nanobot.cron import ScheduleError, parse_every
from nanobot.durations import DurationError, parse_duration
from nanobot.errors import ConfigError

ACCEPTED = [
    ("30s", timedelta(seconds=30)),
    ("10m", timedelta(minutes=10)),
    ("2h", timedelta(hours=2)),
    ("1d", timedelta(days=1)),
    ("1h30m", timedelta(minutes=90)),
    ("1h 30m", timedelta(minutes=90)),
    ("1d2h3m4s", timedelta(days=1, hours=2, minutes=3, seconds=4)),
    ("1.5h", timedelta(minutes=90)),
    ("0.5m", timedelta(seconds=30)),
    ("  10m ", timedelta(minutes=10)),
]
REFUSED = ["", "   ", "10", "m", "10x", "10M", "-5m", "1m1h", "10m10m", "1h30", "every 10m", "infs"]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED)
def test_accepted(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", REFUSED)
def test_refused_with_the_syntax(text: str) -> None:
    with pytest.raises(DurationError, match="is not a duration: use a number and a unit") as caught:
        parse_duration(text)
    assert repr(text) in str(caught.value)


def test_too_long() -> None:
    with pytest.raises(DurationError, match="too long"):
        parse_duration(f"{10**12}d")


def write(tmp_path: Path, window: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"cron: {{catch_up_window: '{window}'}}\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(("text", "expected"), ACCEPTED)
def test_config_and_cron_read_the_same(tmp_path: Path, text: str, expected: timedelta) -> None:
    assert load(write(tmp_path, text)).cron.catch_up_window == expected
    assert parse_every(text).seconds == expected.total_seconds()


@pytest.mark.parametrize("text", [t for t in REFUSED if t.strip() and not t.isdigit()])
def test_config_and_cron_refuse_the_same(tmp_path: Path, text: str) -> None:
    message = f"{text!r} is not a duration: use a number and a unit"
    with pytest.raises(ConfigError, match="catch_up_window") as config_error:
        load(write(tmp_path, text))
    assert message in str(config_error.value)
    with pytest.raises(ScheduleError) as cron_error:
        parse_every(text)
    assert message in str(cron_error.value)
