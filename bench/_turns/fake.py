"""The fake model server (tests/fakes/llm.py), in its own process or in this one."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any, Protocol

import aiohttp

from bench._common import REPO_ROOT, BenchError
from bench._turns.scenario import KEEP_REQUESTS
from tests.fakes.llm import Call, Echo, FakeLLM, Text, ToolCalls
from tests.fakes.llm import Reply as FakeReply


class Fake(Protocol):
    @property
    def base_url(self) -> str: ...

    async def script(self, *replies: dict[str, Any]) -> None:
        """Queue replies (tests/fakes/llm.py JSON form) for the next requests."""
        ...

    async def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of every request received so far."""
        ...


class ProcessFake:
    """tests/fakes/llm.py in its own process: its CPU stays off the measured event loop."""

    def __init__(self, base_url: str, http: aiohttp.ClientSession) -> None:
        self._base_url = base_url
        self._root = base_url.removesuffix("/v1")
        self._http = http

    @property
    def base_url(self) -> str:
        return self._base_url

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls) -> AsyncIterator[ProcessFake]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.fakes.llm",
            "--port",
            "0",
            # Bounded: keeping every long transcript grew the fake by hundreds of MiB, and
            # serving a long request from fresh memory cost it ~0.13 ms more than a short one.
            "--keep-requests",
            str(KEEP_REQUESTS),
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stdout is not None
            async with asyncio.timeout(60):
                line = (await process.stdout.readline()).decode().strip()
            if not line.startswith("http://"):
                raise BenchError(f"the fake model server printed {line!r}, not its URL")
            async with aiohttp.ClientSession() as http:
                yield cls(line, http)
        finally:
            if process.returncode is None:
                process.terminate()
            await process.wait()

    async def script(self, *replies: dict[str, Any]) -> None:
        url = f"{self._root}/_fake/script"
        async with self._http.post(url, json={"replies": list(replies)}) as response:
            response.raise_for_status()

    async def bodies(self) -> list[dict[str, Any]]:
        async with self._http.get(f"{self._root}/_fake/requests") as response:
            response.raise_for_status()
            return [request["body"] for request in await response.json()]


class LocalFake:
    """tests/fakes/llm.py serving in this process's event loop."""

    def __init__(self, fake: FakeLLM) -> None:
        self._fake = fake

    @property
    def base_url(self) -> str:
        return self._fake.base_url

    async def script(self, *replies: dict[str, Any]) -> None:
        self._fake.script(*(_reply(r) for r in replies))

    async def bodies(self) -> list[dict[str, Any]]:
        return [request.body for request in self._fake.requests]


def _reply(data: dict[str, Any]) -> FakeReply:
    if data["type"] == "ToolCalls":
        return ToolCalls([Call(**c) for c in data["calls"]])
    if data["type"] == "Text":
        return Text(data["content"])
    if data["type"] == "Echo":
        return Echo()
    raise ValueError(data)
