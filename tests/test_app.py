"""The composition root's own file work: the data dir is private to its owner."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nanobot.app import private_dir


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
