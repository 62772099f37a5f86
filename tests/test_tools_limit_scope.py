"""One command under the limits (`nanobot.tools.limit_scope`), without running one: the
rlimits it gets and how `prlimit` sets them, how a held sandbox joins its group, and the limit
its exit status names. Commands that reach each limit in the real sandbox are in
test_tools_limits.py."""

from __future__ import annotations

import os
import resource
from dataclasses import replace
from pathlib import Path

import pytest

from nanobot.tools import _cgroups
from nanobot.tools.limit_scope import Scope
from nanobot.tools.limits import Enforcement
from tests.test_tools_limits import MB, SMALL, V1


def test_a_null_limit_is_neither_set_nor_described() -> None:
    limits = replace(SMALL, cpu_time=None, open_files=None)
    scope = Scope(Enforcement(limits, None, "/usr/bin/prlimit", True, False), None, None)
    assert {kind for kind, _, _ in scope.rlimits()} == {
        resource.RLIMIT_FSIZE,
        resource.RLIMIT_DATA,
        resource.RLIMIT_NPROC,
    }
    argv = scope.inner(["/bin/sh", "-c", "true"])
    assert argv[:1] == ["/usr/bin/prlimit"] and argv[-3:] == ["/bin/sh", "-c", "true"]
    assert not any(a.startswith(("--cpu", "--nofile")) for a in argv)
    assert {"--fsize=8388608:8388608", f"--data={128 * MB}:{128 * MB}", "--nproc=256:256"} <= set(
        argv
    )
    assert "cpu_time" not in scope.enforcement.describe()


@pytest.mark.parametrize(
    ("code", "limit"),
    [(-24, "CPU time limit (1 s"), (152, "CPU time limit"), (-25, "file size limit (8 MB")],
)
def test_the_exit_status_names_the_limit(code: int, limit: str) -> None:
    scope = Scope(Enforcement(SMALL, None, "/usr/bin/prlimit", True, False), None, None)
    ended, _ = scope.verdict(code, "")
    assert ended is not None and limit in ended and "tools.exec.limits." in ended


def test_on_cgroup_v2_the_held_sandbox_is_moved_into_its_group(tmp_path: Path) -> None:
    # v2 moves whole processes, so no thread of the gateway may join: the sandbox's init
    # is written into the group at its gate. On v1 the launcher's thread starts it inside.
    v2 = _cgroups.Group(_cgroups.Tree(2, tmp_path, tmp_path), tmp_path / "g", tmp_path / "g")
    v1 = _cgroups.Group(V1, tmp_path / "m", tmp_path / "p")
    (tmp_path / "g").mkdir()
    limits = replace(SMALL, cpu_time=None, open_files=None, file_size=None)
    only_groups = Enforcement(limits, None, None, True, False)
    held = Scope(only_groups, v2, None)
    assert held.held and not Scope(only_groups, v1, None).held
    held.hold(os.getpid())
    assert (tmp_path / "g" / "cgroup.procs").read_text() == f"{os.getpid()}\n"
    assert v2.by_thread is False and v1.by_thread is True
