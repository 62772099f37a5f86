"""`nanobot gateway` as a real subprocess, configured to talk to the local fakes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import yaml


class GatewayProcess:
    """Starts, watches and stops one gateway process; collects its log lines."""

    def __init__(self, root: Path, config: dict[str, object], env: dict[str, str]) -> None:
        self.root = root
        self.config_path = root / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.env = {k: v for k, v in env.items() if not k.startswith("NANOBOT_")}
        self.env.update(
            NANOBOT_CONFIG=str(self.config_path),
            HOME=str(root),
            LITELLM_LOCAL_MODEL_COST_MAP="True",
        )
        self.process: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self._changed = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

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
        self._reader = asyncio.create_task(self._read())
        await self.wait_log(ready, seconds=90)

    async def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        async for raw in self.process.stderr:
            self.lines.append(raw.decode("utf-8", errors="replace").rstrip())
            self._changed.set()
        self._changed.set()

    def log(self) -> str:
        return "\n".join(self.lines)

    async def wait_log(self, text: str, *, seconds: float = 30, after: int = 0) -> int:
        """Wait for a log line containing `text` (from line `after` on); returns its index."""
        async with asyncio.timeout(seconds):
            while True:
                for index in range(after, len(self.lines)):
                    if text in self.lines[index]:
                        return index
                if self.process is not None and self.process.returncode is not None:
                    raise AssertionError(f"gateway exited before logging {text!r}:\n{self.log()}")
                self._changed.clear()
                await self._changed.wait()

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
