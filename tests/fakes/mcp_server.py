"""A fake MCP server for the tests, built on the official SDK (`mcp` 2.3, its `MCPServer`).

A script: run it by path with the project's python, from any directory; it imports nothing of
nanobot (the sandboxed MCP client starts it like any third-party server)::

    python tests/fakes/mcp_server.py                                  # stdio
    python tests/fakes/mcp_server.py --transport http --port 0 --url-file URL
    python tests/fakes/mcp_server.py --transport sse --port 0 --url-file URL

`http` serves Streamable HTTP at `/mcp` (both protocol eras: the `initialize` handshake and
2026-07-28); `sse` serves only the old HTTP+SSE transport at `/sse` (messages at
`/messages/`), so a client's fallback is exercised. Both listen on 127.0.0.1; `--port 0` takes
a free port; `--url-file` receives the URL and a newline once the port listens (atomically for
a regular file; a pipe, such as `/dev/fd/N`, is written straight).

Options: `--name` (default "fake"); `--slow-start S` sleeps before serving (stdio reads
nothing, http/sse bind only after); `--fork-child PIDFILE` forks a detached child (its own
session, stdio on /dev/null, every other descriptor closed) that sleeps forever, writes the
child's pid to PIDFILE (as seen in the server's PID namespace) and serves on;
`--exit-after-fork` exits right after instead; `--auth TOKEN` (http/sse):
401 without `Authorization: Bearer TOKEN` (the SDK's bearer middleware); `--fail-status CODE`
(http/sse): every request gets CODE; `--resources` offers `note://hello` ("hello world") and
`note://big` (100 KB of text).

Tools: echo, add, image, links, fail, crash, hang, cancelled, big, garbage, close_output, grow
(adds `late`), progress, delete_all, probe, environ, whoami; each says what it does below.
`garbage` and `close_output` aim at the stdio wire; over http/sse they hit a stdout nobody reads.
"""

import argparse
import base64
import contextlib
import os
import socket
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import anyio
import uvicorn
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resources import TextResource
from mcp_types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from starlette.types import ASGIApp


def _png() -> bytes:
    """A valid 1x1 PNG (one opaque red pixel), made here so its checksums are right."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte 0, then one RGB pixel
    signature = b"\x89PNG\r\n\x1a\n"
    return signature + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


PNG_BASE64 = base64.b64encode(_png()).decode()
GARBAGE = b"this line is not JSON-RPC {\n"
HELLO = "hello world"
BIG_RESOURCE = "0123456789" * 10_240  # 100 KB


class Sum(TypedDict):
    sum: int


class Who(TypedDict):
    cwd: str
    home: str
    pid: int
    uid: int


@dataclass
class _State:
    """What the tools share. `wire`: a duplicate of stdout as it was at start (the SDK's stdio
    transport points fd 1 at stderr while it serves, so stray prints miss the wire; the faults
    below mean to hit it)."""

    wire: int
    cancelled_hangs: int = 0
    hang_watchers: list[anyio.Event] = field(default_factory=list)

    def hang_cancelled(self) -> None:
        self.cancelled_hangs += 1
        for watcher in self.hang_watchers:
            watcher.set()
        self.hang_watchers.clear()

    async def cancelled_at_least(self, count: int) -> int:
        while self.cancelled_hangs < count:
            watcher = anyio.Event()
            self.hang_watchers.append(watcher)
            await watcher.wait()
        return self.cancelled_hangs


class _OneToken:
    """A `TokenVerifier` that knows one token."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def verify_token(self, token: str) -> AccessToken | None:
        if token != self._token:
            return None
        return AccessToken(token=token, client_id="test", scopes=[])


def build(
    name: str, *, state: _State, auth: str | None = None, resources: bool = False
) -> MCPServer:
    """The server with every tool (and the two resources if `resources`)."""
    if auth is None:
        server = MCPServer(name, log_level="WARNING")
    else:
        settings = AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None)
        server = MCPServer(name, token_verifier=_OneToken(auth), auth=settings, log_level="WARNING")
    _content_tools(server)
    _fault_tools(server, state)
    _change_tools(server)
    _containment_tools(server)
    if resources:
        server.add_resource(TextResource(uri="note://hello", name="hello", text=HELLO))
        server.add_resource(TextResource(uri="note://big", name="big", text=BIG_RESOURCE))
    return server


def _content_tools(server: MCPServer) -> None:
    @server.tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=False)
    def echo(text: str) -> str:
        """Answer with the text given."""
        return text

    @server.tool()
    def add(a: int, b: int) -> Sum:
        """Add two integers; structured content {"sum": a + b}, and the same as JSON text."""
        return {"sum": a + b}

    @server.tool()
    def image() -> list[ImageContent | TextContent]:
        """A tiny PNG and the text "an image"."""
        png = ImageContent(type="image", data=PNG_BASE64, mime_type="image/png")
        return [png, TextContent(type="text", text="an image")]

    @server.tool()
    def links() -> list[EmbeddedResource | ResourceLink]:
        """An embedded text resource (note://hello) and a link to another (note://big)."""
        contents = TextResourceContents(uri="note://hello", text=HELLO, mime_type="text/plain")
        link = ResourceLink(
            type="resource_link", uri="note://big", name="big", mime_type="text/plain"
        )
        return [EmbeddedResource(type="resource", resource=contents), link]

    @server.tool(structured_output=False)
    def big(size: int) -> str:
        """A text of `size` characters."""
        return "x" * size

    @server.tool(
        annotations=ToolAnnotations(destructive_hint=True, read_only_hint=False),
        structured_output=False,
    )
    def delete_all() -> str:
        """Say it deleted everything (it does nothing): the kind of tool that must ask first."""
        return "deleted"


def _fault_tools(server: MCPServer, state: _State) -> None:
    @server.tool()
    def fail(message: str) -> CallToolResult:
        """A result with isError true and the message as its text."""
        return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)

    @server.tool(structured_output=False)
    def crash() -> str:
        """Exit the process (status 3) mid-call, without an answer."""
        os._exit(3)

    @server.tool(structured_output=False)
    async def hang() -> str:
        """Never answer; a cancelled call is counted (see `cancelled`)."""
        try:
            await anyio.sleep_forever()
        finally:
            state.hang_cancelled()
        return "unreachable"

    @server.tool(structured_output=False)
    async def cancelled(at_least: int = 0) -> int:
        """How many `hang` calls have been cancelled so far (by notifications/cancelled, or
        over HTTP by a closed request stream); first waits until there are `at_least`."""
        return await state.cancelled_at_least(at_least)

    @server.tool(structured_output=False)
    def garbage() -> str:
        """Write a line of non-JSON to stdout (the stdio wire), then answer normally. The line
        is shorter than PIPE_BUF, so it cannot tear a message written at the same moment."""
        os.write(state.wire, GARBAGE)
        return "garbage sent"

    @server.tool(structured_output=False)
    def close_output() -> str:
        """Close stdout (every descriptor of this process on the stdout pipe) and keep running:
        the client reads EOF while the process lives on. /dev/null takes the descriptors'
        places, so the SDK's writer keeps writing, to nowhere, instead of failing."""
        target = os.fstat(state.wire)
        null = os.open(os.devnull, os.O_WRONLY)
        for entry in Path("/proc/self/fd").iterdir():
            with contextlib.suppress(OSError, ValueError):
                info = os.fstat(int(entry.name))
                if (info.st_dev, info.st_ino) == (target.st_dev, target.st_ino):
                    os.dup2(null, int(entry.name))
        os.close(null)
        return "closed"


def _change_tools(server: MCPServer) -> None:
    def late(x: str) -> str:
        """A tool that exists only after `grow`; answers "late " + x."""
        return f"late {x}"

    @server.tool(structured_output=False)
    async def grow(ctx: Context[Any, Any]) -> str:
        """Add the tool `late(x)` and announce the change to both eras of client."""
        if all(tool.name != "late" for tool in await server.list_tools()):
            server.add_tool(late, structured_output=False)
        # A handshake-era session hears notifications/tools/list_changed; a 2026-07-28 client
        # hears it on its subscriptions/listen stream. Each call reaches only its own era.
        await ctx.session.send_tool_list_changed()
        await ctx.notify_tools_changed()
        return "grown"

    @server.tool(structured_output=False)
    async def progress(steps: int, ctx: Context[Any, Any]) -> str:
        """Report `steps` progress notifications 0.05 s apart, then answer "done"."""
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"step {step}")
            await anyio.sleep(0.05)
        return "done"


def _containment_tools(server: MCPServer) -> None:
    @server.tool()
    def probe(paths: list[str]) -> dict[str, str]:
        """What a malicious server would try: read each path (globs allowed, e.g.
        /proc/*/environ) and report its first 200 characters or the error."""
        found: dict[str, str] = {}
        for pattern in paths:
            matches = _expand(pattern)
            if not matches:
                found[pattern] = "error: no match"
            for path in matches:
                try:
                    with path.open("rb") as file:
                        found[str(path)] = file.read(800).decode(errors="replace")[:200]
                except OSError as error:
                    found[str(path)] = f"error: {error}"
        return found

    @server.tool()
    def environ() -> dict[str, str]:
        """The server's whole environment."""
        return dict(os.environ)

    @server.tool()
    def whoami() -> Who:
        """The server's working directory, home (as ~ expands), pid and uid."""
        home = str(Path("~").expanduser())
        return {"cwd": str(Path.cwd()), "home": home, "pid": os.getpid(), "uid": os.getuid()}


def _expand(pattern: str) -> list[Path]:
    path = Path(pattern)
    if not any(char in pattern for char in "*?["):
        return [path]
    root = Path(path.anchor or ".")
    return sorted(root.glob(str(path.relative_to(root)) if path.anchor else pattern))


def _failing(status: int) -> Starlette:
    """An app that answers every request with `status`."""
    return Starlette(routes=[Mount("/", app=PlainTextResponse(f"fake fault {status}", status))])


def _write_line(target: Path, line: str) -> None:
    if target.exists() and not target.is_file():  # a pipe: its reader wants it now, whole
        target.write_text(line + "\n")
        return
    partial = target.with_name(target.name + ".partial")
    partial.write_text(line + "\n")
    partial.replace(target)


async def _serve_http(app: ASGIApp, path: str, url_file: Path | None, port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    # Listening from here on: a client connecting before uvicorn accepts waits in the backlog.
    sock.listen(128)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}{path}"
    if url_file is not None:
        _write_line(url_file, url)
    # An open SSE stream would hold a graceful shutdown forever; SIGTERM gives them 1 s.
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
    await uvicorn.Server(config).serve(sockets=[sock])


def _fork_child(pidfile: Path) -> None:
    """Fork a child that leaves this session and sleeps forever; PIDFILE gets its pid (written
    here, before serving, so it is there as soon as the server answers)."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        # Held pipes would keep the parent's readers (stdout, a --url-file pipe) from EOF.
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        while True:
            time.sleep(3600)
    _write_line(pidfile, str(pid))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=("stdio", "http", "sse"), default="stdio")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--url-file", type=Path)
    parser.add_argument("--name", default="fake")
    parser.add_argument("--slow-start", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--fork-child", type=Path, metavar="PIDFILE")
    parser.add_argument("--exit-after-fork", action="store_true")
    parser.add_argument("--auth", metavar="TOKEN")
    parser.add_argument("--fail-status", type=int, metavar="CODE")
    parser.add_argument("--resources", action="store_true")
    args = parser.parse_args(argv)
    if args.transport == "stdio" and (args.auth or args.fail_status):
        parser.error("--auth and --fail-status are for --transport http or sse")
    if args.exit_after_fork and not args.fork_child:
        parser.error("--exit-after-fork needs --fork-child")
    return args


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    if args.fork_child is not None:
        _fork_child(args.fork_child)
        if args.exit_after_fork:
            return
    time.sleep(args.slow_start)
    state = _State(wire=os.dup(1))
    server = build(args.name, state=state, auth=args.auth, resources=args.resources)
    if args.transport == "stdio":
        anyio.run(server.run_stdio_async)
        return
    app: ASGIApp
    if args.fail_status is not None:
        app = _failing(args.fail_status)
    elif args.transport == "http":
        app = server.streamable_http_app()
    else:
        app = server.sse_app()
    path = "/mcp" if args.transport == "http" else "/sse"
    anyio.run(_serve_http, app, path, args.url_file, args.port)


if __name__ == "__main__":
    main()
