"""`nanobot gateway` as a real subprocess, configured to talk to the local fakes.

Every process is audited after its test (conftest calls `audit_logs`): no secret it was
given, in its config or its environment, may appear on its stderr or in a log file under
its data dir, as written or URL-encoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import yaml

# Config keys and environment variable suffixes that hold secrets (as nanobot.log sees them).
SECRET_KEYS = ("api_key", "token", "secret", "password")
SECRET_ENV_SUFFIXES = ("_API_KEY", "_TOKEN", "_SECRET", "_SECRET_KEY", "_PASSWORD")
# The transport of every nanobot process a test starts with an `agent.api_base` and no
# transport of its own: the tests about routes and litellm name theirs (`auto`, `litellm`).
TEST_TRANSPORT = "direct"
WEBHOOK_LISTENING = "telegram webhook: taking updates on "
_created: list[GatewayProcess] = []
_started: list[int] = []  # the pid of every gateway process started in this test session


class GatewayProcess:
    """Starts, watches and stops one gateway process; collects its log lines. Its model
    calls go by `TEST_TRANSPORT` unless `config` names a transport."""

    def __init__(self, root: Path, config: dict[str, object], env: dict[str, str]) -> None:
        self.root = root
        config = with_shared_people(with_test_transport(config))
        self.config_path = root / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.config_path.chmod(0o600)  # it holds secrets: as `nanobot onboard` writes it
        self.env = {k: v for k, v in env.items() if not k.startswith("NANOBOT_")}
        self.env.update(
            NANOBOT_CONFIG=str(self.config_path),
            HOME=str(root),
            LITELLM_LOCAL_MODEL_COST_MAP="True",
        )
        self.process: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self.stderr: list[str] = []  # every line of every run, for the audit
        self.config = config
        self.data_dir = Path(str(config.get("data_dir", root / ".nanobot")))
        self._changed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        _created.append(self)

    async def start(self, *, ready: str = "gateway started") -> None:
        self.lines = []
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "nanobot",
            "gateway",
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _started.append(self.process.pid)
        self._reader = asyncio.create_task(self._read())
        await self.wait_log(ready, seconds=90)

    async def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        async for raw in self.process.stderr:
            line = raw.decode("utf-8", errors="replace").rstrip()
            self.lines.append(line)
            self.stderr.append(line)
            self._changed.set()
        self._changed.set()

    def log(self) -> str:
        return "\n".join(self.lines)

    async def wait_log(self, text: str, *, seconds: float = 30, after: int = 0) -> int:
        """Wait for a log line containing `text` (from line `after` on); returns its index."""
        try:
            async with asyncio.timeout(seconds):
                while True:
                    for index in range(after, len(self.lines)):
                        if text in self.lines[index]:
                            return index
                    if self.process is not None and self.process.returncode is not None:
                        message = f"gateway exited before logging {text!r}:\n{self.log()}"
                        raise AssertionError(message)
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            tail = "\n".join(self.lines[-40:])
            raise TimeoutError(
                f"no {text!r} logged in {seconds} s; the last lines:\n{tail}"
            ) from None

    def webhook_port(self) -> int:
        """The port the Telegram webhook listens on, as its last start logged it (the one
        the system picked for `listen: host:0`)."""
        for line in reversed(self.lines):
            if (port := webhook_port_in(line)) is not None:
                return port
        raise AssertionError(f"no {WEBHOOK_LISTENING!r} logged:\n{self.log()}")

    async def stop(self, sig: int = signal.SIGTERM, *, seconds: float = 30) -> int:
        """Send `sig` and wait for the exit code."""
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(sig)
        async with asyncio.timeout(seconds):
            code = await self.process.wait()
        if self._reader is not None:
            await self._reader
        return code

    async def kill(self) -> None:
        """kill -9: no clean-up of any kind."""
        assert self.process is not None
        if self.process.returncode is None:
            os.kill(self.process.pid, signal.SIGKILL)
        await self.process.wait()
        if self._reader is not None:
            await self._reader

    def secrets(self) -> dict[str, str]:
        """What this process must never log, by where it came from: the config's keys and
        tokens, and the environment's variables named like secrets (values of 8+ chars)."""
        found = dict(_config_secrets(self.config))
        for name, value in self.env.items():
            if name.upper().endswith(SECRET_ENV_SUFFIXES) and len(value) >= 8:
                found[f"${name}"] = value
        return found

    def leaks(self) -> list[str]:
        """Where a secret of this process shows, as `file:line: names: line` (each secret in
        the line replaced by its name): on stderr and in every log file under the data dir."""
        forms = {form: name for name, secret in self.secrets().items() for form in _forms(secret)}
        longest_first = sorted(forms, key=len, reverse=True)
        sources: list[tuple[str, list[str]]] = [("stderr", self.stderr)]
        files = sorted(self.data_dir.rglob("*.log*")) if self.data_dir.is_dir() else []
        for path in files:
            if path.is_file():
                text = path.read_text(encoding="utf-8", errors="replace")
                sources.append((str(path), text.splitlines()))
        found: list[str] = []
        for source, lines in sources:
            for number, line in enumerate(lines, 1):
                names, shown = set(), line
                for form in longest_first:
                    if form in shown:
                        names.add(forms[form])
                        shown = shown.replace(form, f"<{forms[form]}>")
                if names:
                    found.append(f"{source}:{number}: {', '.join(sorted(names))}: {shown}")
        return found


def webhook_port_in(line: str) -> int | None:
    """The port a log line says the Telegram webhook listens on, if it says so."""
    if WEBHOOK_LISTENING not in line:
        return None
    address = line.split(WEBHOOK_LISTENING, 1)[1].split(maxsplit=1)[0]
    return int(address.rsplit(":", 1)[1])


def with_test_transport(config: dict[str, object]) -> dict[str, object]:
    """`config` with `agent.transport: TEST_TRANSPORT` where it has an `agent.api_base`
    and no transport (a copy; `config` itself is left as it is)."""
    agent = config.get("agent")
    if not isinstance(agent, dict) or not agent.get("api_base") or "transport" in agent:
        return config
    return {**config, "agent": {**agent, "transport": TEST_TRANSPORT}}


def with_shared_people(config: dict[str, object]) -> dict[str, object]:
    """`config` with `people.isolation: shared` where it names no isolation (a copy).

    A new install keeps people apart, each in a folder of their own; the tests of the other
    features were written where the workspace is one, and read their files there. The
    tests of people kept apart name `person` (tests/test_gateway_people.py).
    """
    people = config.get("people")
    if isinstance(people, dict) and "isolation" in people:
        return config
    return {
        **config,
        "people": {**(people if isinstance(people, dict) else {}), "isolation": "shared"},
    }


def _config_secrets(config: object, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(config, dict):
        for key, value in config.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(value, str) and str(key).lower().endswith(SECRET_KEYS) and value:
                yield where, value
            else:
                yield from _config_secrets(value, where)
    elif isinstance(config, list):
        for index, value in enumerate(config):
            yield from _config_secrets(value, f"{path}[{index}]")


def _forms(secret: str) -> set[str]:
    """The secret as written and URL-encoded, and a Telegram token's secret half alone."""
    forms = {secret, quote(secret, safe=""), quote_plus(secret)}
    bot_id, colon, rest = secret.partition(":")
    if colon and bot_id.isdigit() and len(rest) >= 20:
        forms.add(rest)
    return forms


def kill_leftovers() -> list[int]:
    """SIGKILL every gateway process this session started that still runs (a test that
    failed before its own clean-up); returns their pids. conftest runs it at the end."""
    killed = []
    for pid in _started:
        if _still_ours(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def _still_ours(pid: int) -> bool:
    """Whether `pid` is still a nanobot child of this process (not a pid used again)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return stat[0] != "Z" and int(stat[1]) == os.getpid() and b"nanobot" in command


def audit_logs() -> None:
    """Fail naming file and line if a GatewayProcess created since the last call wrote a
    secret it was given to stderr or to a log file. conftest runs it after every test."""
    processes = list(_created)
    _created.clear()
    leaks = [leak for process in processes for leak in process.leaks()]
    if leaks:
        more = f"\n(and {len(leaks) - 20} more)" if len(leaks) > 20 else ""
        raise AssertionError("secrets in the gateway's logs:\n" + "\n".join(leaks[:20]) + more)
