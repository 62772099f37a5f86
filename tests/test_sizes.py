"""The size syntax of the config file (`nanobot.sizes`), and the limits' keys that use it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanobot.config import load
from nanobot.errors import ConfigError
from nanobot.sizes import SizeError, format_size, parse_size

ACCEPTED = [
    ("512MB", 512 << 20),
    ("1GB", 1 << 30),
    ("1 GB", 1 << 30),
    ("1.5GB", 3 << 29),
    ("64KiB", 64 << 10),
    ("2mib", 2 << 20),
    ("1g", 1 << 30),
    ("1T", 1 << 40),
    ("100B", 100),
    ("  256MB ", 256 << 20),
]
REFUSED = ["", "10", "MB", "1XB", "-1MB", "1e9GB", "10bb", "1 G B", "ten MB"]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED)
def test_accepted(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", REFUSED)
def test_refused_with_the_syntax(text: str) -> None:
    with pytest.raises(SizeError, match="is not a size: use a number and a unit") as caught:
        parse_size(text)
    assert repr(text) in str(caught.value)


def test_too_large() -> None:
    with pytest.raises(SizeError, match="too large"):
        parse_size("9000000000TB")


@pytest.mark.parametrize("size", [100, 1536, 200 << 20, 1 << 30, 3 << 29, 1 << 40])
def test_formatted_sizes_read_back(size: int) -> None:
    assert parse_size(format_size(size).replace(" ", "")) == size


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("memory: 512", "tools.exec.limits.memory"),
        ("memory: lots", "'lots' is not a size"),
        ("tmp_size: 512", "512 has no unit"),
        ("cpu_time: 0.5s", "must be at least 1 second"),
        ("cpu_time: soon", "is not a duration"),
        ("open_files: 3", "must be at least 32"),
        ("processes: 0", "tools.exec.limits.processes"),
        ("disk_reserve: -1MB", "tools.exec.limits.disk_reserve"),
        ("swap: 1GB", "swap"),
    ],
)
def test_a_bad_limit_stops_start_up_naming_it(tmp_path: Path, line: str, said: str) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(f"tools:\n  exec:\n    limits:\n      {line}\n")
    with pytest.raises(ConfigError, match=r"config\.yaml") as caught:
        load(file)
    assert said in str(caught.value)


def test_limits_as_written(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    written = "{memory: 2GB, cpu_time: 90, tmp_size: 64MB, file_size: null}"
    file.write_text(f"tools:\n  exec:\n    limits: {written}\n")
    limits = load(file).tools.exec.limits
    assert (limits.memory, limits.tmp_size, limits.file_size) == (2 << 30, 64 << 20, None)
    assert limits.cpu_time is not None and limits.cpu_time.total_seconds() == 90
    assert limits.processes == 256 and limits.disk_reserve == 200 << 20
