"""What one exec command may take (`nanobot.tools.limits`): how each limit is enforced here,
and that a command reaching it, in the real bubblewrap sandbox, ends with a result naming the
limit and its key while nothing else is affected. And the disk reserve, on a small volume of
its own: a command filling the data volume is stopped and the store still writes.

Limits are small so that each case takes a moment. The process and memory limits hold for a
command as a whole only in a cgroup (root on this cgroup v1 host, or a delegated v2 subtree);
cases that need one say so in one line and are skipped where there is none.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from nanobot.errors import StoreError
from nanobot.reserve import DiskReserve
from nanobot.store.sqlite import SqliteDatabase
from nanobot.tools import _cgroups
from nanobot.tools.base import ToolError
from nanobot.tools.bubblewrap import Bubblewrap
from nanobot.tools.limit_scope import Scope
from nanobot.tools.limits import Enforcement, Limits, enforce, log_enforcement
from nanobot.tools.sandbox import Confinement, Unconfined, probe
from nanobot.tools.shell import ExecParams, ExecTool
from tests.test_tools_shell import marker, sleepers

MB = 1024**2
SMALL = Limits(
    processes=256,
    memory=128 * MB,
    cpu_time=timedelta(seconds=1),
    open_files=64,
    file_size=8 * MB,
    tmp_size=16 * MB,
)
IN_A_CGROUP = pytest.mark.skipif(
    _cgroups.find() is None,
    reason="no cgroup to make command groups in (not root, no delegated cgroup v2)",
)


def exec_tool(ws: Path, limits: Limits = SMALL, reserve: DiskReserve | None = None) -> ExecTool:
    sandbox = probe("bwrap", Confinement(ws, network="none", tmp_size=limits.tmp_size))
    return ExecTool(
        ws,
        sandbox=sandbox,
        timeout=30,
        limits=enforce(limits, confined=True),
        reserve=reserve,
    )


async def run(tool: ExecTool, command: str) -> tuple[bool, str]:
    """(whether the call failed, what it said)."""
    try:
        result = await tool.run(ExecParams(command=command))
    except ToolError as exc:
        return True, str(exc)
    if not isinstance(result, str):  # output carrying taint (a command that fetched)
        return result.is_error, result.content
    return False, result


def no_groups_left(tool: ExecTool) -> bool:
    """Whether, once `tool`'s limits are closed (at shutdown), none of its groups is left."""
    tool.limits.close()
    tree = _cgroups.find()
    if tree is None:
        return True
    prefix = "exec-" if tree.version == 2 else "nanobot-exec-"
    return not any(tree.memory.glob(f"{prefix}{os.getpid()}-*"))


# --- how each limit is enforced -------------------------------------------------------------


V1 = _cgroups.Tree(1, Path("/sys/fs/cgroup/memory/x"), Path("/sys/fs/cgroup/pids/x"))


@pytest.mark.parametrize(
    ("tree", "prlimit", "confined", "root", "processes", "memory"),
    [
        (V1, "/usr/bin/prlimit", True, True, "cgroup v1", "cgroup v1"),
        (None, "/usr/bin/prlimit", True, False, "user namespace", "rlimit, per process"),
        (None, "/usr/bin/prlimit", True, True, "root is exempt", "rlimit, per process"),
        (None, "/usr/bin/prlimit", False, False, "no sandbox", "rlimit, per process"),
        # In bubblewrap the gateway sets the rlimits itself; without it, prlimit does.
        (None, None, True, False, "user namespace", "rlimit, per process"),
        (None, None, False, False, "not enforced", "prlimit is missing"),
    ],
)
def test_what_is_enforced_and_how(
    *,
    tree: _cgroups.Tree | None,
    prlimit: str | None,
    confined: bool,
    root: bool,
    processes: str,
    memory: str,
) -> None:
    enforcement = Enforcement(SMALL, tree, prlimit, confined, root)
    said = enforcement.enforced()
    assert processes in said["processes"]
    assert memory in said["memory"]
    assert enforcement.incomplete == (tree is None)
    line = enforcement.describe()
    assert "processes 256" in line and "memory 128 MB" in line and "tmp_size 16 MB" in line


# --- each limit reached, in the real sandbox ----------------------------------------------


@IN_A_CGROUP
async def test_400_background_processes_stop_at_the_process_limit(tmp_path: Path) -> None:
    tool, mark = exec_tool(tmp_path), marker()
    failed, said = await run(tool, f"for i in $(seq 400); do sleep {mark} & done; wait")
    assert failed, said
    assert "the process limit (256, tools.exec.limits.processes)" in said
    assert not sleepers(mark)
    # Nothing else is affected: the host forks, and the next command runs as usual.
    assert await (await asyncio.create_subprocess_exec("true")).wait() == 0
    assert await run(tool, "echo next") == (False, "exit code 0\nnext\n")
    assert no_groups_left(tool)


@IN_A_CGROUP
async def test_a_fork_bomb_is_held_at_the_process_limit(tmp_path: Path) -> None:
    tool = ExecTool(
        tmp_path,
        sandbox=probe("bwrap", Confinement(tmp_path, network="none")),
        timeout=3,
        limits=enforce(replace(SMALL, processes=64), confined=True),
    )
    _, said = await run(tool, "b() { b | b & wait; }; b")  # past the deny pattern
    # However the bomb collapses (shells that cannot fork give up), the limit is named.
    assert "the process limit (64, tools.exec.limits.processes)" in said, said
    assert no_groups_left(tool)


async def test_memory_beyond_the_limit_ends_the_command(tmp_path: Path) -> None:
    tool = exec_tool(tmp_path)
    touch = "python3 -c 'b = bytearray(1536 * 1024 * 1024); print(len(b))'"
    failed, said = await run(tool, touch)
    assert "the memory limit (128 MB, tools.exec.limits.memory)" in said, said
    assert failed == (tool.limits.tree is not None)  # an OOM kill; else a MemoryError it met
    assert await run(tool, "python3 -c 'print(len(bytearray(16 * 1024 * 1024)))'") == (
        False,
        f"exit code 0\n{16 * MB}\n",
    )


async def test_filling_tmp_says_tmp_size(tmp_path: Path) -> None:
    tool = exec_tool(tmp_path, replace(SMALL, file_size=None))
    failed, said = await run(tool, "head -c 1G /dev/zero > /tmp/big")
    assert not failed
    assert "the size of its /tmp (16 MB, tools.exec.limits.tmp_size)" in said, said
    assert "No space left on device" in said
    assert not (tmp_path / "big").exists()


async def test_a_file_past_file_size_is_cut_and_said(tmp_path: Path) -> None:
    tool = exec_tool(tmp_path)
    failed, said = await run(tool, "head -c 20M /dev/zero > big; echo written")
    assert "the file size limit (8 MB, tools.exec.limits.file_size)" in said, said
    assert not failed  # the shell went on after its child was stopped
    assert (tmp_path / "big").stat().st_size == 8 * MB
    # Python ignores SIGXFSZ: its write fails with EFBIG instead.
    failed, said = await run(tool, 'python3 -c \'open("big2", "wb").write(bytes(9 << 20))\'')
    assert not failed and "File too large" in said
    assert said.startswith("exit code 1 (it reports having met the file size limit (8 MB"), said
    failed, said = await run(tool, "exec dd if=/dev/zero of=big3 bs=1M count=9 2>/dev/null")
    assert failed and "ended at the file size limit (8 MB" in said, said


async def test_cpu_time_ends_a_busy_loop(tmp_path: Path) -> None:
    failed, said = await run(exec_tool(tmp_path), "exec python3 -c 'while True: pass'")
    assert failed
    assert "ended at the CPU time limit (1 s, tools.exec.limits.cpu_time)" in said, said


async def test_too_many_open_files_is_said(tmp_path: Path) -> None:
    opens = "python3 -c 'files = [open(\"/dev/null\") for _ in range(100)]'"
    failed, said = await run(exec_tool(tmp_path), opens)
    assert not failed
    assert said.startswith("exit code 1 (it reports having met the open files limit (64, ")
    assert "Too many open files" in said


async def test_the_sandbox_is_held_until_its_limits_are_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No prlimit on the machine, no shell in front: the gateway sets the rlimits on the
    # sandbox's init at its gate, and the command sees them from its first instruction.
    monkeypatch.setattr("shutil.which", lambda name, **_: None)
    tool = exec_tool(tmp_path)
    failed, said = await run(tool, "ulimit -n; ulimit -t; ulimit -f")
    assert not failed, said
    assert said.splitlines()[1:] == ["64", "1", str(8 * MB // 512)], said


async def test_a_limit_that_cannot_be_set_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(self: Scope, pid: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(Scope, "hold", refused)
    failed, said = await run(exec_tool(tmp_path), "touch ran")
    assert failed
    assert said.startswith("could not set up the command's limits: "), said
    assert not (tmp_path / "ran").exists()


async def test_a_sandbox_that_fails_to_start_says_why_not_the_limits(tmp_path: Path) -> None:
    # bubblewrap gives up in its setup, before its gate: the call says bubblewrap's reason,
    # whether or not its init was still there to be put under the limits.
    tool = exec_tool(tmp_path)
    assert isinstance(tool.sandbox, Bubblewrap)
    tool.sandbox._tail = [*tool.sandbox._tail, "--ro-bind", "/nonexistent-source", "/x"]
    for _ in range(3):
        failed, said = await run(tool, "touch ran")
        assert not failed and "bwrap: Can't find source path /nonexistent-source" in said, said
    assert not (tmp_path / "ran").exists()


@IN_A_CGROUP
async def test_without_a_sandbox_the_command_starts_in_its_group(tmp_path: Path) -> None:
    tool = ExecTool(tmp_path, sandbox=Unconfined(tmp_path), limits=enforce(SMALL, confined=False))
    failed, said = await run(tool, "cat /proc/self/cgroup")
    assert not failed, said
    tree = _cgroups.find()
    assert tree is not None
    if tree.version == 1:  # started inside by the launcher's thread
        lines = [line for line in said.splitlines() if ":memory:" in line or ":pids:" in line]
        assert len(lines) == 2 and all("/nanobot-exec-" in line for line in lines), said
    else:  # joined by a shell in front
        assert "/exec-" in said.splitlines()[0], said


async def test_node_python_git_and_pip_run_under_the_defaults(tmp_path: Path) -> None:
    tool = exec_tool(tmp_path, Limits())
    tools = "git --version && pip --version && python3 -c 'import ssl'"
    failed, said = await run(tool, f"node -e 'console.log(6*7)' && ({tools}) >/dev/null && echo ok")
    assert (failed, said) == (False, "exit code 0\n42\nok\n")


# --- the disk reserve -----------------------------------------------------------------------


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A 20 MB file system of its own, for the data dir and the workspace."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small volume needs root")
    folder = tmp_path / "volume"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
async def store(volume: Path) -> AsyncIterator[tuple[SqliteDatabase, DiskReserve]]:
    reserve = DiskReserve(volume / "state.db", 4 * MB)
    assert reserve.restore() and reserve.in_place
    db = await SqliteDatabase.connect(volume / "state.db", reserve=reserve)
    await db.execute("CREATE TABLE notes (body BLOB)")
    try:
        yield db, reserve
    finally:
        await db.close()


async def test_a_command_filling_the_data_volume_is_stopped_and_the_store_writes(
    volume: Path, store: tuple[SqliteDatabase, DiskReserve], warnings: list[str]
) -> None:
    db, reserve = store
    ws = volume / "workspace"
    ws.mkdir()
    tool = exec_tool(ws, replace(SMALL, file_size=None), reserve)
    failed, said = await run(tool, "head -c 100M /dev/zero > fill; sleep 5")
    assert failed
    assert said.startswith("the command was stopped, no space left: only "), said
    assert f"free on the volume of nanobot's data ({volume}), where 4 MB is kept for " in said
    assert "nanobot's store (tools.exec.limits.disk_reserve)" in said
    assert reserve.in_place  # the command met a full disk; the reserve was still there
    # The store meets the full disk, releases the reserve and writes.
    await db.execute("INSERT INTO notes VALUES (?)", (os.urandom(512 * 1024),))
    assert not reserve.in_place
    assert any("reserve was released" in w for w in warnings)
    assert [tuple(r) for r in await db.fetchall("SELECT length(body) FROM notes")] == [(512 << 10,)]
    # Short of the reserve, the next command does not even start.
    failed, said = await run(tool, "touch ran")
    assert failed and said.startswith("no space left: only ") and not (ws / "ran").exists()
    # Space back: commands run again, and the reserve is made again.
    (ws / "fill").unlink()
    assert await run(tool, "echo again") == (False, "exit code 0\nagain\n")
    assert reserve.in_place


async def test_a_full_disk_is_a_clear_error_then_the_store_goes_on(
    volume: Path, store: tuple[SqliteDatabase, DiskReserve]
) -> None:
    db, reserve = store
    assert reserve.release()
    filler = volume / "fill"
    with filler.open("wb") as out, pytest.raises(OSError, match="No space left"):
        while True:
            out.write(bytes(MB))
    with pytest.raises(
        StoreError, match=r"disk full while writing .*state\.db; the write was not saved"
    ):
        await db.execute("INSERT INTO notes VALUES (?)", (os.urandom(2 * MB),))
    filler.unlink()
    await db.execute("INSERT INTO notes VALUES (?)", (b"back",))
    assert [tuple(r) for r in await db.fetchall("SELECT body FROM notes")] == [(b"back",)]


def test_no_room_for_the_reserve_is_said_once(volume: Path, warnings: list[str]) -> None:
    reserve = DiskReserve(volume / "state.db", 12 * MB)  # twice that is more than 20 MB
    assert not reserve.restore() and not reserve.restore()
    assert not reserve.ballast.exists()
    said = [w for w in warnings if "disk reserve" in w]
    assert len(said) == 1 and "tools.exec.limits.disk_reserve (12 MB)" in said[0]
    short = reserve.short()
    assert short is None  # 20 MB free: more than the 12 MB that must stay free


def test_status_shows_the_limits_in_force(tmp_path: Path) -> None:
    from nanobot.app import describe_limits
    from nanobot.config import load

    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        f"data_dir: {tmp_path / 'data'}\n"
        "tools:\n  exec:\n    limits: {memory: 512MB, cpu_time: 90s, open_files: null}\n"
    )
    config = load(config_file)
    line = describe_limits(config)
    assert "memory 512 MB" in line and "cpu_time 90 s" in line and "open_files" not in line
    assert "disk_reserve 200 MB (made at the first start)" in line
    (tmp_path / "data").mkdir()
    assert DiskReserve(config.state_db_path, 200 * MB).restore()
    assert f"disk_reserve 200 MB (kept at {tmp_path / 'data' / 'state.db.reserve'})" in (
        describe_limits(config)
    )


def test_start_up_says_once_what_is_not_enforced(warnings: list[str]) -> None:
    log_enforcement(Enforcement(SMALL, None, "/usr/bin/prlimit", True, True))
    assert len(warnings) == 1
    assert "processes 256 (not enforced (no cgroup to use, and root is exempt" in warnings[0]
    assert (
        "memory 128 MB, cpu_time 1 s, open_files 64, file_size 8 MB (rlimit, per process)"
        in (warnings[0])
    )
    assert "Delegate=" in warnings[0]


async def test_a_transaction_rolled_back_by_the_full_disk_succeeds_when_run_again(
    volume: Path, store: tuple[SqliteDatabase, DiskReserve]
) -> None:
    db, reserve = store
    filler = volume / "fill"
    with filler.open("wb") as out, pytest.raises(OSError, match="No space left"):
        while True:
            out.write(bytes(256 << 10))

    async def write() -> None:
        async with db.transaction():
            for _ in range(3):
                await db.execute("INSERT INTO notes VALUES (?)", (os.urandom(MB),))

    # SQLite rolls the whole transaction back: the block fails, clearly, and frees the room
    # its next attempt (the outage policy's) has.
    with pytest.raises(StoreError, match="disk full while writing"):
        await write()
    assert not reserve.in_place
    await write()
    rows = await db.fetchall("SELECT length(body) FROM notes")
    assert [tuple(r) for r in rows] == [(MB,)] * 3


# --- finding a cgroup tree (on files laid out as the kernel shows them) ---------------------


def kernel_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cgroup: str, mountinfo: str
) -> None:
    (tmp_path / "cgroup").write_text(cgroup)
    (tmp_path / "mountinfo").write_text(mountinfo)
    monkeypatch.setattr(_cgroups, "_PROC_CGROUP", tmp_path / "cgroup")
    monkeypatch.setattr(_cgroups, "_MOUNTINFO", tmp_path / "mountinfo")


def test_a_delegated_cgroup_v2_subtree_is_claimed_and_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = tmp_path / "fs"
    own = mount / "system.slice" / "nanobot.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu io memory pids\n")
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (own / "cgroup.subtree_control").write_text("")
    kernel_view(
        tmp_path,
        monkeypatch,
        "0::/system.slice/nanobot.service\n",
        f"41 31 0:38 / {mount} rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    tree = _cgroups.find()
    assert tree == _cgroups.Tree(2, own, own)
    _cgroups.claim(tree)
    # No internal processes: nanobot moved into a leaf, then the controllers were enabled.
    assert (own / "gateway" / "cgroup.procs").read_text() == str(os.getpid())
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids"
    group = _cgroups.make(tree, memory=64 * MB, processes=32)
    assert group.memory == group.pids and group.memory.parent == own
    assert (group.memory / "memory.max").read_text() == str(64 * MB)
    assert (group.memory / "memory.swap.max").read_text() == "0"
    assert (group.memory / "pids.max").read_text() == "32"
    assert group.joins == (group.memory / "cgroup.procs",)  # v2 moves processes only
    (group.memory / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (group.memory / "pids.events").write_text("max 0\n")
    assert group.events() == (0, 1)


def test_without_controllers_v2_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = tmp_path / "fs"
    (mount / "user.slice").mkdir(parents=True)
    (mount / "user.slice" / "cgroup.controllers").write_text("cpu io\n")
    kernel_view(
        tmp_path,
        monkeypatch,
        "0::/user.slice\n",
        f"41 31 0:38 / {mount} rw,relatime - cgroup2 cgroup2 rw\n",
    )
    assert _cgroups.find() is None


@pytest.mark.parametrize(
    ("root", "own", "found"),
    [("/", "/a/b", "a/b"), ("/docker/c1", "/docker/c1", ""), ("/docker/c1", "/elsewhere", None)],
)
def test_a_v1_hierarchy_mounted_from_a_subfolder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: str, own: str, found: str | None
) -> None:
    memory, pids = tmp_path / "memory", tmp_path / "pids"
    kernel_view(
        tmp_path,
        monkeypatch,
        f"8:pids:{own}\n4:memory:{own}\n0::/\n",
        f"35 31 0:32 {root} {memory} rw - cgroup cgroup rw,memory\n"
        f"39 31 0:36 {root} {pids} rw - cgroup cgroup rw,pids\n",
    )
    if found is not None:
        (memory / found).mkdir(parents=True, exist_ok=True)
        (pids / found).mkdir(parents=True, exist_ok=True)
    tree = _cgroups.find()
    if found is None:
        assert tree is None
    else:
        assert tree == _cgroups.Tree(1, memory / found, pids / found)


async def test_without_a_cgroup_memory_is_bounded_per_process(tmp_path: Path) -> None:
    tool = exec_tool(tmp_path)
    tool.limits = replace(tool.limits, tree=None)  # as where no cgroup can be used
    failed, said = await run(tool, "python3 -c 'b = bytearray(1536 * 1024 * 1024)'")
    assert not failed and "MemoryError" in said
    assert said.startswith("exit code 1 (it reports having met the memory limit (128 MB, ")


def test_a_smaller_reserve_cuts_the_file_down(tmp_path: Path) -> None:
    assert DiskReserve(tmp_path / "state.db", 8 * MB).restore()
    smaller = DiskReserve(tmp_path / "state.db", 2 * MB)
    assert smaller.restore() and smaller.in_place
    assert smaller.ballast.stat().st_size == 2 * MB


def test_a_reserve_that_cannot_be_made_is_said_once(tmp_path: Path, warnings: list[str]) -> None:
    reserve = DiskReserve(tmp_path / "missing" / "state.db", MB)
    assert not reserve.restore() and not reserve.restore()
    said = [w for w in warnings if "disk reserve" in w]
    assert len(said) == 1 and "No such file or directory" in said[0], said
