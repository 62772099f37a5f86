"""Tools for tests of the runner and the loop: one that answers at once, one that blocks
(and one that sleeps, for the tests about a slow tool being cancelled).

`BlockTool` replaces "a tool that sleeps long enough": a test waits on `started` to know the
tool is running, does what it wants to happen meanwhile, then sets `release` (or never does,
to test aborts and limits). Nothing depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pydantic import Field

from nanobot.tools.base import Tool, ToolParams


class EchoParams(ToolParams):
    text: str = Field(description="What to echo.")


class EchoTool(Tool[EchoParams]):
    """`echo`: returns "echoed <text>" and records the text; `on_call(text)` runs first."""

    name = "echo"
    description = "Echo the text."
    params = EchoParams

    def __init__(self, on_call: Callable[[str], None] | None = None) -> None:
        self.calls: list[str] = []
        self.on_call = on_call

    async def run(self, args: EchoParams) -> str:
        if self.on_call is not None:
            self.on_call(args.text)
        self.calls.append(args.text)
        return f"echoed {args.text}"


class NoParams(ToolParams):
    pass


class BlockTool(Tool[NoParams]):
    """`block`: sets `started`, waits for `release`, returns "released".

    `finished` counts calls that returned, `cancelled` calls that were cancelled while waiting.
    """

    name = "block"
    description = "Wait until released."
    params = NoParams

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = 0
        self.cancelled = 0

    async def run(self, args: NoParams) -> str:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        return "released"


class SleepParams(ToolParams):
    seconds: float


class SleepTool(Tool[SleepParams]):
    """`sleep`: a tool that takes `seconds` of real time (for tests that are about a slow tool
    being cancelled; to wait for a tool to be running, await `started`)."""

    name = "sleep"
    description = "Sleep."
    params = SleepParams

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finished = 0

    async def run(self, args: SleepParams) -> str:
        self.started.set()
        await asyncio.sleep(args.seconds)
        self.finished += 1
        return "slept"
