"""The tool registry: schemas for the model, and the one place tool failures become results."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from loguru import logger
from pydantic import ValidationError

from nanobot.tools.base import Tool, ToolError, ToolResult, current_context

MAX_RESULT_CHARS = 16_000


class ToolSource(Protocol):
    """Tools that come and go while nanobot runs (the MCP servers'), after the built-in ones."""

    def offered(self) -> Mapping[str, dict[str, Any]]:
        """The OpenAI function schema of each tool offered now, by name."""
        ...

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult | None:
        """The result of `name` with `arguments` (None: no such tool now). Validates the
        arguments itself; never raises for a tool's failure."""
        ...


class ToolRegistry:
    """Holds the available tools by name and runs calls to them: `tools`, in that order,
    fixed once built, then what `source` offers at the moment. Raises `ValueError` when two
    of `tools` have one name."""

    def __init__(self, tools: Iterable[Tool[Any]] = (), source: ToolSource | None = None) -> None:
        self._source = source
        self._tools: dict[str, Tool[Any]] = {}
        # Built once: generating a JSON Schema from a pydantic model costs about 0.25 ms,
        # which every turn would otherwise pay for every tool.
        self._schemas: dict[str, dict[str, Any]] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"a tool named {tool.name!r} is already registered")
            self._tools[tool.name] = tool
            self._schemas[tool.name] = tool.schema()

    @property
    def names(self) -> list[str]:
        """The built-in tools' names, then those `source` offers now."""
        return [*self._tools, *self._offered()]

    @property
    def built_in(self) -> list[str]:
        return list(self._tools)

    @property
    def from_source(self) -> list[str] | None:
        """The names `source` offers now; None when there is no source."""
        return None if self._source is None else list(self._offered())

    def __contains__(self, name: object) -> bool:
        return name in self._tools or name in self._offered()

    def schemas(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Schemas of the tools in `names` (all when None), in registration order (the
        source's after the built-in ones)."""
        allowed = None if names is None else set(names)
        every = [*self._schemas.items(), *self._offered().items()]
        return [s for n, s in every if allowed is None or n in allowed]

    def _offered(self) -> Mapping[str, dict[str, Any]]:
        return self._source.offered() if self._source is not None else {}

    async def execute(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run `name` with `arguments` and return what the model should see.

        Never raises for a tool's failure: unknown tools, invalid arguments, `ToolError` and
        unexpected exceptions all become `ToolResult(is_error=True)` with a clear message.
        Results are cut to MAX_RESULT_CHARS with a note of how much was cut. A result's
        `taint` is added to the turn's (`ToolContext.taint`) before it is returned, so the
        next call of the turn knows it. Cancellation propagates (the caller decides what an
        aborted call records).
        """
        tool = self._tools.get(name)
        if tool is None:
            found = await self._source.call(name, arguments) if self._source else None
            if found is not None:
                return self._taken(found)
            known = ", ".join(sorted(self.names)) or "none"
            return ToolResult(f"Error: unknown tool {name!r}. Available tools: {known}.", True)
        try:
            args = tool.params.model_validate(arguments)
        except ValidationError as exc:
            return ToolResult(f"Error: invalid arguments for {name}: {_describe(exc)}", True)
        try:
            result = await tool.run(args)
        except ToolError as exc:
            return ToolResult(f"Error: {exc}", True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the boundary where tool bugs become results
            logger.exception("tool {} failed", name)
            detail = f"{type(exc).__name__}: {exc}"
            return ToolResult(f"Error: {name} failed unexpectedly: {detail}", True)
        return self._taken(ToolResult(result) if isinstance(result, str) else result)

    def _taken(self, result: ToolResult) -> ToolResult:
        """`result` as the turn takes it in: its taint added to the turn's, cut to size."""
        context = current_context.get()
        if result.taint and context is not None:
            context.taint.add(result.taint)
        return truncate(result)


def truncate(result: ToolResult, limit: int = MAX_RESULT_CHARS) -> ToolResult:
    """Cut `result` to `limit` characters, saying how many were left out."""
    if len(result.content) <= limit:
        return result
    cut = len(result.content) - limit
    note = f"\n\n[... {cut} more characters cut; the result was {len(result.content)} long]"
    return replace(result, content=result.content[:limit] + note)


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "arguments"
        reason = "unknown argument" if error["type"] == "extra_forbidden" else error["msg"]
        parts.append(f"{field}: {reason}")
    return "; ".join(parts)
