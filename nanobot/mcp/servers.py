"""The configured MCP servers as one source of tools for the registry, with their approval
rules and their states.

`McpServers.start` begins every enabled server at once, in the background: the channels and
a turn that uses no MCP tool never wait for one. The tools of a server are offered while it
runs; the model's next call sees a change (a server that started, died or said its tools
changed). Each call's arguments are checked against the tool's input schema before anything
is sent. The states are kept in `mcp.json` in the data dir for `nanobot mcp list` and
`nanobot status` to read from another process: written whole (by a rename) after each change,
in a thread, so a slow disk never holds up the event loop; one write at a time, in the order
of the changes, the newest state last (changes that come while one is written are written
together, as the newest).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from loguru import logger

from nanobot.agent.approvals import Policy, ToolRule
from nanobot.mcp.connection import RESTART, CallFailed, Connection, RemoteTool, State, Status
from nanobot.mcp.results import resource_result, resources_result, tool_result
from nanobot.mcp.settings import ServerSettings
from nanobot.outage import Backoff
from nanobot.tasks import TaskSet
from nanobot.tools.base import ToolResult
from nanobot.tools.sandbox import Sandbox

FILE: Final = "mcp.json"
"""The file in the data dir that holds the running gateway's MCP server states."""


class McpServers:
    """The configured `servers` (the enabled ones run, the others are listed as disabled).
    `hiding`: folders of the workspace that sandboxed servers do not see (`launch`)."""

    def __init__(
        self,
        servers: Sequence[ServerSettings],
        *,
        workspace: Path,
        sandbox: Sandbox | None,
        hiding: Sequence[Path] = (),
        other: Policy = "ask",
        state_file: Path | None = None,
        restart: Backoff = RESTART,
    ) -> None:
        self._servers = {server.name: server for server in servers}
        self._other = other
        self._connections = {
            server.name: Connection(
                server.name,
                server,
                workspace=workspace,
                sandbox=sandbox,
                hiding=hiding,
                changed=self._changed,
                restart=restart,
            )
            for server in servers
            if server.enabled
        }
        self._tasks = TaskSet("mcp")
        self._validators: dict[str, tuple[dict[str, Any], Any]] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        self._offered: dict[str, RemoteTool] = {}
        self._change = asyncio.Event()
        self._states = None if state_file is None else _StateFile(state_file)
        self._writes = TaskSet("mcp-state")
        self._writer: asyncio.Task[None] | None = None

    def __bool__(self) -> bool:
        return bool(self._servers)

    def start(self) -> None:
        """Begin every enabled server (returns at once)."""
        for name, connection in self._connections.items():
            self._tasks.spawn(connection.run(), name=f"mcp-{name}")
        self._changed()

    async def settled(self) -> None:
        """Return once no server is starting any more: each runs, or has failed for now.
        Bounded by the servers' `startup_timeout` (a start that takes longer fails)."""
        while any(c.status.state is State.STARTING for c in self._connections.values()):
            self._change.clear()
            await self._change.wait()

    async def close(self) -> None:
        """Stop every server, each within the SDK's bounded steps (its input closed, then
        terminated, then killed): all at once, so one slow server does not delay the rest.
        Returns once the stopped states are written."""
        await self._tasks.close()
        self._changed()
        await self._writes.close(grace=None)

    # -- the registry's source ---------------------------------------------------------------

    def offered(self) -> Mapping[str, dict[str, Any]]:
        """The OpenAI function schema of each tool offered now, by name."""
        return self._schemas

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult | None:
        """The result of the MCP tool `name` (None: no such tool now). Invalid arguments
        are an error result, never a call; so is a server that is not running."""
        tool = self._offered.get(name)
        if tool is None:
            return None
        problem = self._invalid(tool, arguments)
        if problem is not None:
            return ToolResult(f"Error: invalid arguments for {name}: {problem}", True)
        connection = self._connections[tool.server]
        try:
            if tool.kind == "list_resources":
                return resources_result(name, tool.server, await connection.list_resources())
            if tool.kind == "read_resource":
                uri = str(arguments["uri"])
                return resource_result(name, tool.server, await connection.read_resource(uri))
            result = await connection.call(tool, arguments, _progress(name))
        except CallFailed as exc:
            return ToolResult(f"Error: {exc}", True)
        return tool_result(name, tool.server, result)

    # -- approvals ---------------------------------------------------------------------------

    def rule(self, name: str) -> ToolRule | None:
        """The approval rule of the MCP tool `name` (None: not one)."""
        tool = self._offered.get(name)
        return None if tool is None else self.rule_of(tool)

    def rule_of(self, tool: RemoteTool) -> ToolRule:
        """The approval rule of `tool` (see `tool_rule`)."""
        return tool_rule(tool, self._servers[tool.server], self._other)

    # -- states ------------------------------------------------------------------------------

    def statuses(self) -> dict[str, Status]:
        """Every configured server's status, disabled ones included."""
        found = {
            name: Status(State.DISABLED, f"mcp.servers.{name}.enabled: false")
            for name in self._servers
        }
        found.update({name: c.status for name, c in self._connections.items()})
        return found

    def _changed(self) -> None:
        self._change.set()
        offered: dict[str, RemoteTool] = {}
        for connection in self._connections.values():
            offered.update(connection.tools)
        self._offered = offered
        self._schemas = {name: _schema(tool) for name, tool in offered.items()}
        self._validators = {
            name: held for name, held in self._validators.items() if name in offered
        }
        if self._states is not None:
            # The record is taken now, on the loop, so each write is one moment's states.
            self._states.pending = self._record()
            # A flush that ended is done at once (its set forgets it only later).
            if self._writer is None or self._writer.done():
                self._writer = self._writes.spawn(self._states.flush(), name="mcp-state-write")

    def _invalid(self, tool: RemoteTool, arguments: dict[str, Any]) -> str | None:
        import jsonschema

        held = self._validators.get(tool.name)
        if held is None or held[0] is not tool.schema:
            try:
                kind = jsonschema.validators.validator_for(tool.schema)
                kind.check_schema(tool.schema)
                held = (tool.schema, kind(tool.schema))
            except jsonschema.SchemaError as exc:
                return f"the server's schema for it is invalid ({exc.message[:200]})"
            self._validators[tool.name] = held
        errors = sorted(held[1].iter_errors(arguments), key=lambda e: list(e.path))
        if not errors:
            return None
        described = []
        for error in errors[:5]:
            where = ".".join(str(p) for p in error.path) or "arguments"
            described.append(f"{where}: {error.message[:200]}")
        return "; ".join(described)

    def _record(self) -> dict[str, Any]:
        return {
            name: {
                "transport": self._servers[name].transport,
                "state": status.state.value,
                "reason": status.reason,
                "since": status.since,
                "tools": {
                    t.name: {
                        "remote": t.remote,
                        "policy": self.rule_of(t).policy,
                        "hints": t.hints(),
                    }
                    for t in status.tools.values()
                },
            }
            for name, status in self.statuses().items()
        }


class _StateFile:
    """`mcp.json`, written by one task at a time (`flush`), each write in a thread.

    `pending` is the newest record not yet written. `flush` writes until none is pending
    (the owner starts one when none runs). A flush cancelled mid-write leaves its thread
    running; the lock and the records' order keep a later write from being overtaken by it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pending: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._made = 0  # records handed to a thread, in order
        self._written = 0  # the newest of them on disk
        self._failed = False

    async def flush(self) -> None:
        while self.pending is not None:
            record, self.pending = self.pending, None
            self._made += 1
            await asyncio.to_thread(self._write, record, self._made)

    def _write(self, record: dict[str, Any], number: int) -> None:
        with self._lock:
            if number < self._written:
                return
            temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            try:
                temporary.write_text(json.dumps(record, indent=1), encoding="utf-8")
                temporary.replace(self.path)
            except OSError as exc:
                if not self._failed:
                    logger.warning(
                        "could not write the MCP servers' states to {}: {}", self.path, exc
                    )
                self._failed = True
                return
            self._written, self._failed = number, False


def tool_rule(tool: RemoteTool, server: ServerSettings, other: Policy) -> ToolRule:
    """What the calls of `tool` get: its own entry in `approval_tools`, else the server's
    `approval`, else `tools.approval.other`; a read-only tool of a server whose annotations
    are trusted does not ask. The card shows what the server says of the tool."""
    prefix = f"mcp.servers.{tool.server}"
    hints = tool.hints()
    note = ""
    if hints:
        trusted = "trusted" if server.trust_annotations else "not trusted"
        note = f"the server says the tool is {hints} ({trusted}: {prefix}.trust_annotations)"
    if tool.remote in server.approval_tools:
        key = f"{prefix}.approval_tools.{tool.remote}"
        return ToolRule(server.approval_tools[tool.remote], key, note)
    key = f"{prefix}.approval" if server.approval is not None else "tools.approval.other"
    policy = server.approval if server.approval is not None else other
    if policy == "ask" and server.trust_annotations and tool.read_only and not tool.destructive:
        return ToolRule("allow", f"{prefix}.trust_annotations", note)
    return ToolRule(policy, key, note)


def read_states(path: Path) -> dict[str, dict[str, Any]] | None:
    """The states a running gateway wrote to `path`, or None when there are none to read."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _schema(tool: RemoteTool) -> dict[str, Any]:
    parameters = tool.schema if tool.schema.get("type") == "object" else {"type": "object"}
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description[:4000] or f"{tool.remote} (MCP server {tool.server})",
            "parameters": parameters,
        },
    }


def _progress(name: str) -> Any:
    async def said(progress: float, total: float | None, message: str | None) -> None:
        # The chat's "typing…" stays on for the whole turn; the steps go to the debug log.
        of = f"/{total:g}" if total is not None else ""
        logger.debug("{}: progress {:g}{} {}", name, progress, of, message or "")

    return said
