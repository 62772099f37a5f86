"""One MCP server, kept connected: started (or reached), its tools listed, watched, started
again with a growing delay when it fails or dies, and stopped within the shutdown deadline.

The SDK's client lives in the supervisor task (`run`), which enters and leaves it: its
transports are anyio context managers that must end in the task that began them. Calls come
from the turns' own tasks; one that hangs holds up only its own turn (each has `timeout`),
never the supervisor, another server or shutdown.

A server says its tools changed in the way of its protocol era: a
`notifications/tools/list_changed` in the handshake era (2025-11-25 and before), a
`subscriptions/listen` stream in 2026-07-28's, which the supervisor keeps open. A remote
server is checked between calls too: a ping in the handshake era, which 2026-07-28 dropped,
so there its tools are listed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from loguru import logger

from nanobot.log import printable, redact
from nanobot.mcp.launch import NotStartable, launch
from nanobot.mcp.names import offered_names
from nanobot.mcp.settings import ServerSettings
from nanobot.outage import Backoff
from nanobot.tools.sandbox import Sandbox, SandboxCall

if TYPE_CHECKING:
    import mcp_types
    from mcp import Client
    from mcp.shared.dispatcher import ProgressFnT

# Starts again after a failure: quickly at first, then at most once a minute.
RESTART = Backoff((1.0, 2.0, 5.0, 15.0, 30.0, 60.0))
PING_EVERY = 30.0  # seconds: a remote server that went away is noticed between calls too
LISTEN_AGAIN = 1.0  # seconds before a change stream that ended is opened again
# Between why a server failed to start and the last line it wrote to its stderr.
LAST_WORDS = "; its last line on stderr: "
STDERR_LINES = 20  # of a server's stderr logged per minute; the rest is counted
RESOURCE_TOOLS = ("list_resources", "read_resource")
# One SSE event of Streamable HTTP holds one whole message: the SDK's 1 MiB would fail a
# large result (a 10 MB one is cut to the tools' limit after it arrived, not refused).
MAX_EVENT_BYTES = 32 * 1024 * 1024

T = TypeVar("T")


class State(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    FAILED = "failed"
    DISABLED = "disabled"
    STOPPED = "stopped"


class CallFailed(Exception):
    """A call that got no answer from the server; the message says why, for the model."""


@dataclass(frozen=True, slots=True)
class RemoteTool:
    """A tool as the server lists it, under the name the model sees (`name`)."""

    name: str
    server: str
    remote: str
    description: str
    schema: dict[str, Any]
    read_only: bool | None = None
    destructive: bool | None = None
    # "tool": the server's own; the other two nanobot makes for a server's resources.
    kind: Literal["tool", "list_resources", "read_resource"] = "tool"

    def hints(self) -> str:
        """The server's own word on what the tool does, for an approval card ("" if none)."""
        said = []
        if self.read_only:
            said.append("read-only")
        if self.destructive:
            said.append("destructive")
        elif self.destructive is False:
            said.append("not destructive")
        return ", ".join(said)


@dataclass(slots=True)
class Status:
    """What `nanobot mcp list` and `status` show of a server."""

    state: State = State.STARTING
    reason: str = ""  # why it failed, or why it is not started
    since: float = field(default_factory=time.time)
    tools: dict[str, RemoteTool] = field(default_factory=dict)


class Connection:
    """One configured server; `run` keeps it connected until cancelled."""

    def __init__(
        self,
        name: str,
        config: ServerSettings,
        *,
        workspace: Path,
        sandbox: Sandbox | None,
        hiding: Sequence[Path] = (),
        changed: Callable[[], None] = lambda: None,
        restart: Backoff = RESTART,
        watch_every: float = PING_EVERY,
    ) -> None:
        self.name, self.config = name, config
        self._workspace, self._sandbox, self._hiding = workspace, sandbox, tuple(hiding)
        self._changed, self._restart = changed, restart
        self._watch_every = watch_every
        self.status = Status()
        self._client: Client | None = None
        self._refresh = asyncio.Event()
        self._ended = asyncio.Event()
        self._stderr = _StderrLog(name)
        self._ran = False  # the last connection got as far as running
        self._missing: list[str] = []  # the tools of `tools` it did not list, as last said

    @property
    def tools(self) -> dict[str, RemoteTool]:
        """The tools offered now, by the model's name (none unless running)."""
        return self.status.tools if self.status.state is State.RUNNING else {}

    async def run(self) -> None:
        """Connect, serve, and connect again after each failure, until cancelled (then the
        server is stopped: the SDK closes its input, then terminates and kills its process
        group, each step bounded)."""
        try:
            await self._keep_running()
        except asyncio.CancelledError:
            # Also when cancelled in the pause between two starts: stopped, not "failed".
            self._set(State.STOPPED)
            raise

    async def _keep_running(self) -> None:
        failures = 0
        # The SDK's import takes a second of CPU: not on the loop the channels run on.
        await asyncio.to_thread(_import_sdk)
        while True:
            self._set(State.STARTING)
            self._ran = False
            try:
                await self._connect_and_serve()
                reason = "the server closed the connection"
            except NotStartable as exc:
                self._set(State.FAILED, str(exc))
                logger.error("MCP server {}: not started: {}", self.name, exc)
                return  # nothing changes until the config does
            except Exception as exc:  # noqa: BLE001 - every failure of a server is its own
                reason = describe(exc)
                if not self._ran and self._stderr.last:  # it failed to start: why, it said
                    reason += f"{LAST_WORDS}{self._stderr.last}"
            failures = 1 if self._ran else failures + 1  # a run that worked starts anew
            pause = self._restart.pause(failures)
            self._set(State.FAILED, reason)
            log = logger.warning if failures == 1 else logger.debug
            log(
                "MCP server {}: {}; its tools are absent; starting it again in {:g} s",
                self.name,
                reason,
                pause,
            )
            await asyncio.sleep(pause)

    async def call(
        self,
        tool: RemoteTool,
        arguments: dict[str, Any],
        progress: ProgressFnT | None = None,
    ) -> mcp_types.CallToolResult:
        """The server's result of `tool` with `arguments`.

        Raises:
            CallFailed: the server is not running, died during the call, or gave no answer
                within the server's `timeout` (the call is then cancelled with the
                protocol's cancellation).
        """
        return await self._ask(
            lambda client: client.call_tool(tool.remote, arguments, progress_callback=progress)
        )

    async def list_resources(self) -> list[mcp_types.Resource]:
        """Every resource the server lists (all pages). Raises CallFailed as `call`."""

        async def every(client: Client) -> list[mcp_types.Resource]:
            found: list[mcp_types.Resource] = []
            cursor: str | None = None
            while True:
                page = await client.list_resources(cursor=cursor)
                found += page.resources
                cursor = page.next_cursor
                if not cursor or len(found) > 1000:
                    return found

        return await self._ask(every)

    async def read_resource(self, uri: str) -> mcp_types.ReadResourceResult:
        """The resource at `uri`. Raises CallFailed as `call`."""
        return await self._ask(lambda client: client.read_resource(uri))

    async def _ask(self, request: Callable[[Client], Awaitable[T]]) -> T:
        """`request` of the running client, within the server's `timeout`; each way it can
        fail a CallFailed saying which (cancelling it cancels the request, which the SDK
        tells the server)."""
        client = self._running()
        import anyio
        import httpx2
        from mcp import MCPError

        try:
            async with asyncio.timeout(self.config.timeout):
                return await request(client)
        except TimeoutError:
            raise CallFailed(
                f"the MCP server {self.name} did not answer within {self.config.timeout:g} "
                "seconds; the call was cancelled"
            ) from None
        except MCPError as exc:
            raise CallFailed(self._call_error(exc)) from None
        except (httpx2.TransportError, anyio.ClosedResourceError, anyio.BrokenResourceError):
            # The connection itself failed under the call: 2026-07-28 over HTTP sends each
            # request on its own, and the SDK passes the transport's error on as it is.
            raise CallFailed(self._stopped()) from None

    def _running(self) -> Client:
        if self._client is None or self.status.state is not State.RUNNING:
            why = f": {self.status.reason}" if self.status.reason else ""
            raise CallFailed(f"the MCP server {self.name} is {self.status.state.value}{why}")
        return self._client

    def _call_error(self, exc: Exception) -> str:
        from mcp_types import CONNECTION_CLOSED

        if getattr(exc, "code", None) == CONNECTION_CLOSED or self._ended.is_set():
            return self._stopped()
        return f"the MCP server {self.name} answered with an error: {redact(str(exc))[:500]}"

    def _stopped(self) -> str:
        return (
            f"the MCP server {self.name} stopped during the call; it is being started "
            "again, so the call may have been carried out or not"
        )

    def _set(
        self, state: State, reason: str = "", tools: dict[str, RemoteTool] | None = None
    ) -> None:
        self.status = Status(state, redact(reason), time.time(), tools or {})
        self._changed()

    async def _connect_and_serve(self) -> None:
        from mcp import Client

        self._ended.clear()
        self._refresh.clear()
        async with AsyncExitStack() as stack:
            client = Client(
                self._transport(),
                message_handler=self._on_message,
                client_info=_client_info(),
                cache=None,  # a tool list is read again when the server says it changed
            )
            async with asyncio.timeout(self.config.startup_timeout):
                await stack.enter_async_context(client)
                tools = await self._list(client)
            self._client, self._ran = client, True
            try:
                self._set(State.RUNNING, tools=tools)
                logger.info("MCP server {}: running, {} tools", self.name, len(tools))
                await self._serve(client)
            finally:
                self._client = None

    async def _serve(self, client: Client) -> None:
        """Until the connection ends: list the tools again when the server says they
        changed, and check a remote server now and then (see the module docstring)."""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
        listening: asyncio.Task[None] | None = None
        if modern:
            listening = asyncio.create_task(self._listen(client), name=f"mcp-listen-{self.name}")
        try:
            while not self._ended.is_set():
                refresh = asyncio.ensure_future(self._refresh.wait())
                ended = asyncio.ensure_future(self._ended.wait())
                waits: set[asyncio.Future[Any]] = {refresh, ended}
                if listening is not None:
                    waits.add(listening)
                try:
                    await asyncio.wait(
                        waits, timeout=self._watch_every, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    refresh.cancel()
                    ended.cancel()
                if self._ended.is_set():
                    return
                if listening is not None and listening.done():
                    listening.result()  # raises what ended it for good: the connection
                    listening = None
                if self._refresh.is_set():
                    self._refresh.clear()
                    async with _answers_within(self.config.startup_timeout, "list its tools"):
                        tools = await self._list(client)
                    self._set(State.RUNNING, tools=tools)
                    logger.info("MCP server {}: its tools changed; {} now", self.name, len(tools))
                elif self.config.transport == "http":
                    await self._check(client, modern=modern)
        finally:
            if listening is not None:
                listening.cancel()
                # What ended the stream no longer matters once the connection has ended
                # (a stdio server that exited fails the stream too).
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await listening

    async def _check(self, client: Client, *, modern: bool) -> None:
        """Whether the server still answers (raises if not); in 2026-07-28 by listing its
        tools, which also catches a change it did not announce."""
        async with _answers_within(self.config.timeout, "answer a check"):
            if not modern:
                await client.session.send_ping()
                return
            tools = await self._list(client)
        if tools != self.status.tools:
            self._set(State.RUNNING, tools=tools)
            logger.info("MCP server {}: its tools changed; {} now", self.name, len(tools))

    async def _listen(self, client: Client) -> None:
        """Set `_refresh` at each change the server announces on its `subscriptions/listen`
        stream (2026-07-28), and open the stream again when it ends (what changed meanwhile
        is not replayed: the tools are listed again). Returns where the server offers no
        such stream; raises when it cannot be opened again (the connection is lost)."""
        from mcp import MCPError
        from mcp.client.subscriptions import SubscriptionLost

        again = False
        while True:
            try:
                async with client.listen(tools_list_changed=True) as changes:
                    if not changes.honored.tools_list_changed:
                        logger.debug("MCP server {}: it does not announce changes", self.name)
                        return
                    if again:
                        self._refresh.set()
                    async for _ in changes:
                        self._refresh.set()
            except MCPError as exc:
                if again:
                    raise
                logger.debug("MCP server {}: no change stream: {}", self.name, describe(exc))
                return
            except SubscriptionLost as exc:
                logger.debug("MCP server {}: its change stream dropped: {}", self.name, exc)
            again = True
            await asyncio.sleep(LISTEN_AGAIN)

    async def _list(self, client: Client) -> dict[str, RemoteTool]:
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            listed += page.tools
            cursor = page.next_cursor
            if not cursor or len(listed) > 1000:
                break
        wanted = self.config.tools
        chosen = [t for t in listed if wanted is None or t.name in wanted]
        if wanted is not None:
            missing = sorted(set(wanted) - {t.name for t in listed})
            # Said once, not at each listing (a remote server's are listed every check).
            if missing and missing != self._missing:
                logger.warning(
                    "MCP server {}: mcp.servers.{}.tools names tools it does not list: {}",
                    self.name,
                    self.name,
                    ", ".join(missing),
                )
            self._missing = missing
        by_name = {t.name: t for t in chosen}
        extra = (
            [n for n in RESOURCE_TOOLS if n not in by_name] if await _has_resources(client) else []
        )
        names = offered_names(self.name, [*by_name, *extra])
        tools: dict[str, RemoteTool] = {}
        for offered, remote in names.items():
            listing = by_name.get(remote)
            if listing is None:
                tools[offered] = _resource_tool(self.name, offered, remote)
                continue
            hints = listing.annotations
            tools[offered] = RemoteTool(
                offered,
                self.name,
                remote,
                listing.description or listing.title or "",
                dict(listing.input_schema),
                hints.read_only_hint if hints is not None else None,
                hints.destructive_hint if hints is not None else None,
            )
        return tools

    async def _on_message(self, message: Any) -> None:
        from mcp_types import ToolListChangedNotification

        if isinstance(message, Exception):
            logger.debug("MCP server {}: transport error: {}", self.name, describe(message))
        elif isinstance(message, ToolListChangedNotification):
            self._refresh.set()

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        """The transport's context (what `Client` takes), its end watched."""
        if self.config.command is not None:
            async with self._stdio() as streams:
                yield streams
            return
        async with _remote(self.name, self.config, self._ended) as streams:
            yield streams

    @asynccontextmanager
    async def _stdio(self) -> AsyncIterator[Any]:
        from mcp.client.stdio import StdioServerParameters, stdio_client

        sandbox = self._sandbox
        if sandbox is not None and self.config.sandbox == "auto" and not sandbox.ready:
            await asyncio.to_thread(sandbox.wait_ready)
        with contextlib.ExitStack() as held:
            call: SandboxCall | None = None
            if sandbox is not None and self.config.sandbox == "auto" and sandbox.confined:
                call = held.enter_context(sandbox.call())
            started = launch(
                self.name, self.config, self._workspace, sandbox, call, hiding=self._hiding
            )
            if started.bare:
                logger.warning(
                    "MCP server {} runs WITHOUT the sandbox (mcp.servers.{}.sandbox: none): "
                    "it has nanobot's own rights, its files and network",
                    self.name,
                    self.name,
                )
            params = StdioServerParameters(
                command=started.argv[0],
                args=list(started.argv[1:]),
                env=started.env,
                cwd=started.cwd,
                encoding_error_handler="replace",
            )
            async with self._stderr.pipe() as errlog, stdio_client(params, errlog) as streams:
                yield _watch(streams, self._ended)


async def _has_resources(client: Client) -> bool:
    """Whether the server offers any resource (an SDK server may claim the capability and
    have none: then the two tools would only cost the model's attention)."""
    from mcp import MCPError

    capabilities = client.server_capabilities
    if capabilities is None or not capabilities.resources:
        return False
    try:
        return bool((await client.list_resources()).resources)
    except MCPError:  # claimed, but not answered: as good as none
        return False


def _resource_tool(server: str, offered: str, which: str) -> RemoteTool:
    if which == "list_resources":
        return RemoteTool(
            offered,
            server,
            which,
            f"List the resources the MCP server {server} offers (their URIs, names and types).",
            {"type": "object", "properties": {}, "additionalProperties": False},
            read_only=True,
            kind="list_resources",
        )
    return RemoteTool(
        offered,
        server,
        which,
        f"Read one resource of the MCP server {server} by its URI.",
        {
            "type": "object",
            "properties": {"uri": {"type": "string", "description": "the resource's URI"}},
            "required": ["uri"],
            "additionalProperties": False,
        },
        read_only=True,
        kind="read_resource",
    )


def describe(exc: BaseException) -> str:
    """What went wrong, in one redacted line: the SDK's errors come wrapped in groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return "it did not start and list its tools in time (startup_timeout)"
    import httpx2
    from mcp_types import CONNECTION_CLOSED

    text = str(exc) or type(exc).__name__
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if getattr(exc, "code", None) == CONNECTION_CLOSED:
        text = "the server closed the connection"
    elif status is not None:
        text = _answered(status)
    elif isinstance(exc, httpx2.ConnectError | httpx2.ConnectTimeout):
        text = f"the server cannot be reached ({text})"
    elif isinstance(exc, httpx2.TransportError):
        text = f"the connection to the server failed ({text})"
    if isinstance(exc, FileNotFoundError | PermissionError):
        text = f"its command could not be started: {exc}"
    return redact(printable(text))[:500]


def _answered(status: int) -> str:
    try:
        phrase = f" ({http.HTTPStatus(status).phrase})"
    except ValueError:
        phrase = ""
    return f"the server answered HTTP {status}{phrase}"


class Silent(Exception):
    """A running server did not answer nanobot's own request in time."""


@asynccontextmanager
async def _answers_within(seconds: float, what: str) -> AsyncIterator[None]:
    """`asyncio.timeout`, saying what the server did not do (a bare TimeoutError would
    read as a start that took too long)."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise Silent(f"it did not {what} within {seconds:g} seconds") from None


class Refused(Exception):
    """A remote server answered nanobot's first request with an HTTP error."""

    def __init__(self, name: str, status: int) -> None:
        hint = f": check mcp.servers.{name}.headers" if status in (401, 403) else ""
        super().__init__(f"{_answered(status)}{hint}")


_IMPORTING = threading.Lock()


def _import_sdk() -> None:
    # One thread at a time: servers start together, and imports racing in threads can
    # deadlock on the modules' import locks.
    with _IMPORTING:
        import httpx2  # noqa: F401
        from mcp import Client  # noqa: F401
        from mcp.client.sse import sse_client  # noqa: F401
        from mcp.client.stdio import stdio_client  # noqa: F401
        from mcp.client.streamable_http import streamable_http_client  # noqa: F401
        from mcp.client.subscriptions import SubscriptionLost  # noqa: F401


def _client_info() -> mcp_types.Implementation:
    from mcp_types import Implementation

    from nanobot import __version__

    return Implementation(name="nanobot", version=__version__)


class _Watched:
    """A transport's read stream that sets `ended` when it ends (the server closed its
    output, died, or the connection dropped): the SDK itself only fails the next call."""

    def __init__(self, stream: Any, ended: asyncio.Event) -> None:
        self._stream, self._ended = stream, ended

    async def receive(self) -> Any:
        import anyio

        try:
            return await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._ended.set()
            raise

    async def aclose(self) -> None:
        await self._stream.aclose()

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _watch(streams: tuple[Any, Any], ended: asyncio.Event) -> tuple[Any, Any]:
    read, write = streams
    return _Watched(read, ended), write


@asynccontextmanager
async def _remote(name: str, config: ServerSettings, ended: asyncio.Event) -> AsyncIterator[Any]:
    """Streamable HTTP at `config.url`, or the older HTTP+SSE transport where the server
    answers the first only with 400, 404 or 405 (the fallback the specification gives)."""
    import httpx2
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client

    assert config.url is not None
    headers = dict(config.headers)
    if await _probe(name, config.url, headers, config.startup_timeout) == "sse":
        logger.info(
            "MCP server {}: the older HTTP+SSE transport (it does not speak Streamable HTTP)", name
        )
        async with sse_client(
            config.url, headers=headers, timeout=config.startup_timeout
        ) as streams:
            yield _watch(streams, ended)
        return
    timeout = httpx2.Timeout(config.timeout, read=max(config.timeout, 300.0))
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as client,
        streamable_http_client(
            config.url, http_client=client, max_sse_event_size=MAX_EVENT_BYTES
        ) as streams,
    ):
        yield _watch(streams, ended)


async def _probe(
    name: str, url: str, headers: dict[str, str], seconds: float
) -> Literal["http", "sse"]:
    """Which transport `url` speaks: the older HTTP+SSE where a POST is refused with
    400/404/405 while a GET opens an event stream, else Streamable HTTP.

    Raises:
        Refused: the POST was refused for its credentials (401, 403, 407) or failed on the
            server's side (5xx): the SDK would only say "an error response".
    """
    import httpx2

    probe = {**headers, "Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(headers=probe, timeout=seconds) as client:
        ping = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
        answer = await client.post(url, json=ping)
        if answer.status_code in (401, 403, 407) or answer.status_code >= 500:
            raise Refused(name, answer.status_code)
        if answer.status_code not in (400, 404, 405):
            return "http"
        async with client.stream("GET", url, headers={"Accept": "text/event-stream"}) as stream:
            kind = stream.headers.get("content-type", "")
            sse = stream.status_code == 200 and kind.startswith("text/event-stream")
            return "sse" if sse else "http"


class _StderrLog:
    """A server's stderr, into the log line by line, redacted, at most STDERR_LINES a
    minute (a server printing in a loop must not fill the disk); how many were left out is
    said when the minute is over, or when the server's stderr ends."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._window = 0.0
        self._count = 0
        self._dropped = 0
        self.last = ""  # the last line the process wrote, redacted (a failed start's cause)

    @asynccontextmanager
    async def pipe(self) -> AsyncIterator[Any]:
        self.last = ""
        read_fd, write_fd = os.pipe()
        writer = os.fdopen(write_fd, "w")
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 * 1024)
        try:
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb")
            )
        except BaseException:  # cancelled while it connects: the loop closed the read end
            writer.close()
            raise
        task = asyncio.create_task(self._drain(reader), name=f"mcp-stderr-{self._name}")
        try:
            yield writer
        finally:
            writer.close()  # the server's copy ends with it; then the drain sees EOF
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(1):
                    await asyncio.shield(task)
            task.cancel()
            transport.close()
            self._said_dropped()

    async def _drain(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):  # a line past the limit
                line = b"(a line too long to log)\n"
                with contextlib.suppress(Exception):
                    await reader.read(64 * 1024)
            if not line:
                return
            self._log(line.decode("utf-8", errors="replace").rstrip())

    def _log(self, line: str) -> None:
        if line.strip():
            self.last = redact(printable(line.strip()))[:200]
        now = time.monotonic()
        if now - self._window >= 60:
            self._said_dropped()
            self._window, self._count = now, 0
        self._count += 1
        if self._count > STDERR_LINES:
            self._dropped += 1
            return
        logger.info("MCP server {} stderr: {}", self._name, redact(printable(line))[:1000])

    def _said_dropped(self) -> None:
        if self._dropped:
            logger.info("MCP server {} stderr: {} more lines not logged", self._name, self._dropped)
            self._dropped = 0
