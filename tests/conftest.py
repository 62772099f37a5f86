"""Shared fixtures: a fake LLM server, an isolated nanobot home for subprocess tests, and
the state database on each backend."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _pytest.nodeid import coerce_node_id
from loguru import logger

from nanobot.log import route_libraries
from nanobot.store import Database
from tests import _layers, _stores
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import FakeTelegram
from tests.gateway_process import TEST_TRANSPORT, audit_logs, kill_leftovers

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(autouse=True)
def _no_reserve_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each gateway a test starts keeps a disk reserve of 200 MB beside its state.db
    (tools.exec.limits.disk_reserve): some 30 GB over a suite, and more with the runs pytest
    keeps. Delete them when the test ends; only the tests that are running hold one."""
    # Taken now: at teardown the fixture may be gone. Only for tests that use it anyway.
    root: Path | None = None
    if "tmp_path" in request.fixturenames:
        root = request.getfixturevalue("tmp_path")
    yield
    if root is not None:
        for ballast in root.rglob("state.db.reserve"):
            ballast.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No NANOBOT_* variable of the developer's leaks into a test."""
    for name in list(os.environ):
        if name.startswith("NANOBOT_"):
            monkeypatch.delenv(name)
    yield


def _to_stderr(line: str) -> None:
    sys.stderr.write(line)  # whatever stream pytest has put there by then


def _no_patch(_record: object) -> None:
    pass


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """Every test starts with loguru as a new process has it, but quieter: one stderr sink
    (warnings and worse) and no patcher. (`nanobot.log.setup` installs a process-wide patcher
    that moves tracebacks into a record's `extra`, so a test's own sink after it would see
    no exception; and a test that logged at DEBUG left the libraries' loggers at DEBUG.)"""
    excepthook = sys.excepthook
    yield
    logger.remove()
    logger.configure(patcher=_no_patch)
    logger.add(_to_stderr, level="WARNING")
    route_libraries(logging.WARNING)
    sys.excepthook = excepthook


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    """The messages logged at WARNING or worse during the test."""
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="WARNING", format="{message}")
    yield messages
    logger.remove(sink)


@pytest.fixture
def errors() -> Iterator[list[str]]:
    """The messages logged at ERROR or worse during the test, each with its traceback."""
    lines: list[str] = []
    sink = logger.add(
        lambda m: lines.append(str(m)), level="ERROR", format="{message}\n{exception}"
    )
    yield lines
    logger.remove(sink)


@pytest.fixture(autouse=True)
def _gateway_log_audit() -> Iterator[None]:
    """After every test, no gateway it ran has a configured secret on stderr or in a log
    file (see `tests.gateway_process`); the test fails naming the file and line."""
    yield
    audit_logs()


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


@pytest.fixture
async def fake_telegram() -> AsyncIterator[FakeTelegram]:
    """The fake Bot API; it takes the first well-formed token it sees as the bot's."""
    async with FakeTelegram() as fake:
        yield fake


def pytest_sessionfinish(session: pytest.Session) -> None:
    """No gateway outlives the run, whatever its test did (`kill_leftovers`)."""
    if killed := kill_leftovers():
        sys.stderr.write(f"\nkilled {len(killed)} gateway process(es) left running: {killed}\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _layers.mark(items, _stores.on_postgres)
    _stores.skip_unreachable(items)
    if getattr(config.option, "loadgroup", False):  # set on the workers of --dist loadgroup
        _group(items)


def _group(items: list[pytest.Item]) -> None:
    """What `--dist loadgroup` does to an `xdist_group`'s tests, done where it now works.

    pytest-xdist 3.8 marks a test's group by renaming its node id (`item._nodeid`, a
    suffix `@group`), which pytest 9.2 no longer reads (its id is `item._id`): each test of
    a group then went to any worker, and a group's module fixture (a gateway) started on
    all four (pytest-xdist#1386). The same suffix, on the id pytest reads.
    """
    for item in items:
        names = {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
        if names and not item.nodeid.endswith(f"@{'_'.join(sorted(names))}"):
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(sorted(names))}")


@pytest.fixture(autouse=True)
def _in_its_layer(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test not marked `process` that starts nanobot as a process fails (`_layers`)."""
    if request.node.get_closest_marker(_layers.PROCESS) is not None:
        yield
        return
    with _layers.guard_processes(request.node.nodeid):
        yield


@pytest.fixture(params=_stores.BACKENDS)
async def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Path | str]:
    """A fresh state on each backend in turn (see `tests._stores`): a SQLite file's path (no
    file yet), or a new PostgreSQL database's URL, already migrated (skipped where no
    PostgreSQL answers)."""
    async with _stores.target(request.param, tmp_path) as target:
        yield target


@pytest.fixture
async def db(store_target: Path | str) -> AsyncIterator[Database]:
    """The state database, open, on each backend in turn (a module's own `db` wins)."""
    async with await Database.open(store_target) as database:
        yield database


@pytest.fixture
async def postgres_server() -> None:
    """Only that the PostgreSQL server answers (else the test is skipped, like the other
    PostgreSQL cases); no database is made."""
    conn = await _stores.admin()
    await conn.close()


@pytest.fixture
async def postgres_url() -> AsyncIterator[str]:
    """A new PostgreSQL database's URL, already at this code's schema (a copy of a migrated
    template), dropped after the test (skipped where none answers)."""
    async with _stores.fresh_database() as url:
        yield url


@pytest.fixture
async def empty_postgres_url() -> AsyncIterator[str]:
    """A new, empty PostgreSQL database's URL (never migrated), dropped after the test
    (skipped where none answers)."""
    async with _stores.fresh_database(migrated=False) as url:
        yield url


@dataclass(frozen=True)
class Home:
    """A throwaway nanobot installation: config file, data dir and environment."""

    root: Path
    config: Path
    data_dir: Path
    env: dict[str, str]

    def write_config(self, text: str) -> None:
        self.config.write_text(text, encoding="utf-8")


@pytest.fixture
def home(tmp_path: Path, fake_llm: FakeLLM) -> Home:
    """Config pointing at `fake_llm` on `TEST_TRANSPORT`; `env` is what a nanobot subprocess
    should get."""
    data_dir = tmp_path / "data"
    config = tmp_path / "config.yaml"
    # `agent` last: tests add keys to it by appending lines. One workspace for all, as
    # tests/gateway_process.py's `with_shared_people` makes it.
    config.write_text(
        f"data_dir: {data_dir}\n"
        "people: {isolation: shared}\n"
        "agent:\n"
        "  model: openai/fake-model\n"
        f"  api_base: {fake_llm.base_url}\n"
        f"  transport: {TEST_TRANSPORT}\n"
        "  api_key: sk-test-secret-key-123456\n",
        encoding="utf-8",
    )
    config.chmod(0o600)  # it holds a secret: as `nanobot onboard` writes it
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANOBOT_")}
    env.update(
        HOME=str(tmp_path),
        NANOBOT_CONFIG=str(config),
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return Home(tmp_path, config, data_dir, env)
