"""The spawn tool: hand a long task to a subagent that works in the background."""

from __future__ import annotations

from typing import Protocol

from pydantic import Field

from nanobot.errors import NanobotError
from nanobot.tools.base import Tool, ToolContext, ToolError, ToolParams, tool_context


class Spawner(Protocol):
    """What starts subagents (`agent/subagents.py`)."""

    async def spawn(self, task: str, origin: ToolContext, label: str | None = None) -> str:
        """Start `task` in the background for the conversation of `origin`; returns its id.
        What `origin`'s run has read from outside so far passes on to the subagent: its calls
        ask for approval as that run's would.

        Raises `NanobotError` with a message for the model when it cannot start now (too
        many running, shutting down, storage failure).
        """
        ...


class LateSpawner:
    """The `Spawner` the spawn tool is built with, before the subagents exist: the tool is in
    the registry the turns' runner is built on, and the subagents are built on that runner
    (registry → runner → loop → subagents). So the registry is built complete with this port,
    and the subagents are bound to it once, as soon as they are built; a call before then
    (none: no turn runs before the gateway is built) is refused like a full house."""

    def __init__(self) -> None:
        self._target: Spawner | None = None

    def bind(self, target: Spawner) -> None:
        """Start subagents through `target` from now on. Raises `RuntimeError` when bound
        already: there is one set of subagents per process."""
        if self._target is not None:
            raise RuntimeError("the spawn tool is bound to its subagents already")
        self._target = target

    async def spawn(self, task: str, origin: ToolContext, label: str | None = None) -> str:
        if self._target is None:
            raise NanobotError("background tasks are not running yet")
        return await self._target.spawn(task, origin, label)


class SpawnParams(ToolParams):
    task: str = Field(
        min_length=1,
        description=(
            "Everything the background task needs to know, self-contained: it does not see "
            "this conversation. Say what to do, where, and what the result should contain."
        ),
    )
    label: str | None = Field(
        None, max_length=60, description="A short name for the task, shown to the user."
    )


class SpawnTool(Tool[SpawnParams]):
    """Starts a subagent for the conversation of the current turn."""

    name = "spawn"
    description = (
        "Start a background task that works on its own while you go on talking with the user: "
        "for long work such as research or many steps with files, not for quick things. It "
        "cannot ask questions, message the user or start more tasks. When it ends, its result "
        "comes to you as a note and you tell the user; do not wait or check on it."
    )
    params = SpawnParams

    def __init__(self, spawner: Spawner) -> None:
        self._spawner = spawner

    async def run(self, args: SpawnParams) -> str:
        context = tool_context()
        label = args.label.strip() if args.label else None
        try:
            task_id = await self._spawner.spawn(args.task, context, label or None)
        except NanobotError as exc:
            raise ToolError(f"the background task was not started: {exc}") from exc
        name = f" ({label})" if label else ""
        return (
            f"Started background task {task_id}{name}. You'll get its result as a note when it "
            "finishes; meanwhile, carry on with the user."
        )
