"""The fake MCP server does what tests/fakes/mcp_server.py says, as the SDK's own client sees
it: over stdio and Streamable HTTP, in both protocol eras (the `initialize` handshake,
mode="legacy"; 2026-07-28, the client's default "auto" against this server).

A fake's start costs about a second (the SDK's import), so the tests that change nothing in a
server share one connection per transport and era (`shared`); the others start their own."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import mcp_types as types
import pytest
import pytest_asyncio
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.session import IncomingMessage
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.subscriptions import ToolsListChanged
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, REQUEST_TIMEOUT

from tests.fakes.mcp_http import SCRIPT, serve_http
from tests.fakes.mcp_server import BIG_RESOURCE, HELLO, PNG_BASE64

pytestmark = pytest.mark.asyncio(loop_scope="module")

Transport = Literal["stdio", "http"]
Mode = Literal["auto", "legacy"]
MODES: tuple[Mode, ...] = ("auto", "legacy")
TOOLS = {
    "echo", "add", "image", "links", "fail", "crash", "hang", "cancelled", "big", "garbage",
    "close_output", "grow", "progress", "delete_all", "probe", "environ", "whoami",
}  # fmt: skip


def stdio(*options: str, **params: Any) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(SCRIPT), *options], **params)


class _Held:
    """Clients held open by tasks of their own: an SDK client must be left by the task that
    entered it, and pytest-asyncio sets a fixture up and tears it down in different tasks."""

    def __init__(self) -> None:
        self._leave = asyncio.Event()
        self._entered: list[asyncio.Future[None]] = []
        self._holders: list[asyncio.Task[None]] = []

    def hold(self, client: Client) -> Client:
        """Start connecting `client` (see `entered`)."""
        entered = asyncio.get_running_loop().create_future()

        async def held() -> None:
            try:
                async with client:
                    entered.set_result(None)
                    await self._leave.wait()
            except Exception as error:
                if entered.done():
                    raise
                entered.set_exception(error)

        self._entered.append(entered)
        self._holders.append(asyncio.create_task(held(), name="held MCP client"))
        return client

    async def entered(self) -> None:
        """Once every client is connected; raises the first that could not connect."""
        await asyncio.gather(*self._entered)

    async def leave(self) -> None:
        self._leave.set()
        await asyncio.gather(*self._holders)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def connections() -> AsyncIterator[dict[str, Client]]:
    """A connected client per transport and era, for the tests that change nothing in a
    server: two stdio servers and one HTTP server, all started at once."""
    held = _Held()
    clients = {f"stdio-{mode}": held.hold(Client(stdio(), mode=mode)) for mode in MODES}
    try:
        async with serve_http() as url:
            clients |= {f"http-{mode}": held.hold(Client(url, mode=mode)) for mode in MODES}
            try:
                await held.entered()
                yield clients
            finally:
                await held.leave()
    finally:
        await held.leave()


# With `--dist loadgroup` the tests that share the connections run on one worker, which starts
# them once (each worker would otherwise start its own).
ON_ONE_WORKER = pytest.mark.xdist_group("mcp-fake-connections")


@pytest.fixture(params=["stdio-auto", "stdio-legacy", "http-auto", "http-legacy"])
def shared(request: pytest.FixtureRequest, connections: dict[str, Client]) -> Client:
    return connections[request.param]


@asynccontextmanager
async def fresh(
    transport: Transport, *options: str, mode: Mode = "auto", **client: Any
) -> AsyncIterator[Client]:
    """A connected SDK client to a fake of its own, started with `options`."""
    if transport == "stdio":
        async with Client(stdio(*options), mode=mode, **client) as connected:
            yield connected
    else:
        async with serve_http(*options) as url, Client(url, mode=mode, **client) as connected:
            yield connected


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> Transport:
    return request.param  # type: ignore[no-any-return]


def text(result: types.CallToolResult) -> str:
    assert isinstance(result.content[0], types.TextContent)
    return result.content[0].text


def running(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie awaiting its parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


async def exits_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` ends within `seconds` (its pidfd turns readable when it does)."""
    pidfd = os.pidfd_open(pid)
    try:
        with anyio.move_on_after(seconds):
            await anyio.wait_readable(pidfd)
            return True
        return False
    finally:
        os.close(pidfd)


def broken() -> pytest.RaisesGroup[Exception]:
    """How the SDK's client says the server went away, inside its exception groups: an
    MCPError CONNECTION_CLOSED (stdio; legacy Streamable HTTP, "SSE stream ended without a
    response"), or the raw httpx2 error of the POST (2026-07-28 Streamable HTTP)."""
    return pytest.RaisesGroup(
        pytest.RaisesExc((MCPError, httpx2.TransportError), check=_closed),
        flatten_subgroups=True,
    )


def _closed(error: Exception) -> bool:
    return not isinstance(error, MCPError) or error.code == CONNECTION_CLOSED


@ON_ONE_WORKER
async def test_every_tool_is_listed_with_its_schema_and_hints(shared: Client) -> None:
    tools = {tool.name: tool for tool in (await shared.list_tools()).tools}
    assert set(tools) >= TOOLS  # and `late`, once a test has grown the server
    assert all(tool.description for tool in tools.values())
    assert tools["add"].input_schema["properties"].keys() == {"a", "b"}
    assert tools["add"].input_schema["properties"]["a"]["type"] == "integer"
    assert tools["add"].input_schema["required"] == ["a", "b"]
    assert tools["probe"].input_schema["properties"]["paths"]["type"] == "array"
    assert tools["add"].output_schema is not None
    assert tools["echo"].annotations == types.ToolAnnotations(read_only_hint=True)
    delete_all = tools["delete_all"].annotations
    assert delete_all is not None
    assert (delete_all.destructive_hint, delete_all.read_only_hint) == (True, False)


@ON_ONE_WORKER
async def test_the_content_tools_answer(shared: Client) -> None:
    echo = await shared.call_tool("echo", {"text": "hi there"})
    added = await shared.call_tool("add", {"a": 2, "b": 3})
    image = await shared.call_tool("image")
    links = await shared.call_tool("links")
    failed = await shared.call_tool("fail", {"message": "it broke"})
    big = await shared.call_tool("big", {"size": 1_000_000})
    assert (text(echo), echo.is_error) == ("hi there", False)
    assert added.structured_content == {"sum": 5}
    assert '"sum": 5' in text(added)
    picture, caption = image.content
    assert isinstance(picture, types.ImageContent)
    assert (picture.mime_type, picture.data) == ("image/png", PNG_BASE64)
    assert base64.b64decode(picture.data).startswith(b"\x89PNG\r\n\x1a\n")
    assert caption == types.TextContent(type="text", text="an image")
    embedded, link = links.content
    assert isinstance(embedded, types.EmbeddedResource)
    assert isinstance(embedded.resource, types.TextResourceContents)
    assert (embedded.resource.uri, embedded.resource.text) == ("note://hello", HELLO)
    assert isinstance(link, types.ResourceLink)
    assert link.uri == "note://big"
    assert (failed.is_error, text(failed)) == (True, "it broke")
    assert text(big) == "x" * 1_000_000


@ON_ONE_WORKER
async def test_progress_reaches_the_calls_callback(shared: Client) -> None:
    seen: list[tuple[float, float | None, str | None]] = []
    all_seen = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))
        if len(seen) == 3:
            all_seen.set()

    result = await shared.call_tool("progress", {"steps": 3}, progress_callback=on_progress)
    # The SDK runs each callback as a task of its own: the last may end after the result.
    with anyio.fail_after(5):
        await all_seen.wait()
    assert text(result) == "done"
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


@ON_ONE_WORKER
async def test_a_hung_call_is_cancelled_and_the_server_serves_on(shared: Client) -> None:
    before = int(text(await shared.call_tool("cancelled")))
    with pytest.raises(MCPError) as timed_out:
        await shared.call_tool("hang", read_timeout_seconds=0.2)
    assert timed_out.value.code == REQUEST_TIMEOUT
    with anyio.move_on_after(0.2) as scope:
        await shared.call_tool("hang")
    assert scope.cancelled_caught
    assert text(await shared.call_tool("echo", {"text": "still here"})) == "still here"
    with anyio.fail_after(5):  # both hangs were told, and stopped
        after = await shared.call_tool("cancelled", {"at_least": before + 2})
    assert int(text(after)) == before + 2


async def test_grow_adds_late_and_tells_both_eras(transport: Transport) -> None:
    """Each era on its own server: over stdio a client is a server; over HTTP one serves both."""
    if transport == "stdio":
        async with anyio.create_task_group() as both:
            both.start_soon(_grow_legacy, stdio())
            both.start_soon(_grow_2026, stdio())
        return
    async with serve_http() as url:
        await _grow_legacy(url)
        await _grow_2026(url)


async def _grow_legacy(server: str | StdioServerParameters) -> None:
    heard = anyio.Event()

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            heard.set()

    async with Client(server, mode="legacy", message_handler=on_message) as client:
        assert client.protocol_version == "2025-11-25"
        assert "late" not in {tool.name for tool in (await client.list_tools()).tools}
        assert text(await client.call_tool("grow")) == "grown"
        with anyio.fail_after(5):  # notifications/tools/list_changed
            await heard.wait()
        assert "late" in {tool.name for tool in (await client.list_tools()).tools}
        assert text(await client.call_tool("late", {"x": "bloomer"})) == "late bloomer"


async def _grow_2026(server: str | StdioServerParameters) -> None:
    async with Client(server) as client:
        assert client.protocol_version == "2026-07-28"
        async with client.listen(tools_list_changed=True) as changes:
            assert text(await client.call_tool("grow")) == "grown"
            with anyio.fail_after(5):
                event = await anext(aiter(changes))
        assert isinstance(event, ToolsListChanged)
        assert "late" in {tool.name for tool in (await client.list_tools()).tools}


async def test_crash_ends_the_connection(transport: Transport) -> None:
    with broken():
        async with fresh(transport, read_timeout_seconds=10) as client:
            await client.call_tool("crash")


async def test_stdio_garbage_is_seen_then_close_output_ends_the_stream() -> None:
    stray: list[Exception] = []

    async def on_message(message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            stray.append(message)

    with broken():
        async with Client(stdio(), message_handler=on_message, read_timeout_seconds=10) as client:
            assert text(await client.call_tool("garbage")) == "garbage sent"
            assert text(await client.call_tool("echo", {"text": "after"})) == "after"
            assert len(stray) == 1  # the garbage line, which the SDK could not parse
            who = (await client.call_tool("whoami")).structured_content
            assert who is not None
            try:
                await client.call_tool("close_output")
            finally:
                assert not await exits_within(who["pid"], 0.5)  # it runs on, without output


async def test_fork_child_leaves_a_live_detached_process(tmp_path: Path) -> None:
    """Both ways at once: a server that serves on, and one that exits right after forking."""
    serving, exiting = tmp_path / "serving.pid", tmp_path / "exiting.pid"

    async def serve_on() -> None:
        async with Client(stdio("--fork-child", str(serving))) as client:
            assert text(await client.call_tool("echo", {"text": "x"})) == "x"

    async def exit_at_once() -> None:
        with broken():  # nobody to talk to
            async with Client(stdio("--fork-child", str(exiting), "--exit-after-fork")):
                pass

    try:
        async with anyio.create_task_group() as both:
            both.start_soon(serve_on)
            both.start_soon(exit_at_once)
        for pidfile in (serving, exiting):
            pid = int(pidfile.read_text())
            assert running(pid)  # it outlived the server
            assert os.getsid(pid) == pid  # a session of its own: out of the server's group
    finally:
        for pidfile in (serving, exiting):
            if pidfile.exists():
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


async def test_slow_start_delays_initialize() -> None:
    started = time.monotonic()
    async with Client(stdio("--slow-start", "0.3"), mode="legacy") as client:
        # A lower bound only: the server sleeps 0.3 s after it was spawned, before it reads.
        assert time.monotonic() - started >= 0.3
        assert text(await client.call_tool("echo", {"text": "late"})) == "late"


async def test_resources_and_the_containment_probes(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("s" * 300)
    params = stdio("--resources", cwd=tmp_path, env={"FAKE_MCP_MARK": "marked"})
    async with Client(params) as client:
        listed = {str(r.uri): r.name for r in (await client.list_resources()).resources}
        hello = (await client.read_resource("note://hello")).contents
        big = (await client.read_resource("note://big")).contents
        who = (await client.call_tool("whoami")).structured_content
        environ = (await client.call_tool("environ")).structured_content
        paths = [str(tmp_path / "*.txt"), str(tmp_path / "missing"), "/proc/1"]
        probe = (await client.call_tool("probe", {"paths": paths})).structured_content
    assert listed == {"note://hello": "hello", "note://big": "big"}
    assert isinstance(hello[0], types.TextResourceContents)
    assert hello[0].text == HELLO
    assert isinstance(big[0], types.TextResourceContents)
    assert big[0].text == BIG_RESOURCE
    assert len(BIG_RESOURCE) == 102_400
    assert who is not None
    assert (who["cwd"], who["uid"], who["home"]) == (str(tmp_path), os.getuid(), str(Path.home()))
    assert environ is not None
    assert environ["FAKE_MCP_MARK"] == "marked"
    assert probe is not None
    assert probe[str(tmp_path / "secret.txt")] == "s" * 200
    assert probe[str(tmp_path / "missing")].startswith("error: ")
    assert probe["/proc/1"].startswith("error: ")  # a directory


@pytest.mark.parametrize("kind", ["http", "sse"])
async def test_auth_refuses_requests_without_the_token(kind: Literal["http", "sse"]) -> None:
    async with serve_http("--auth", "s3cret", transport=kind) as url:
        async with httpx2.AsyncClient() as http:
            answer = await http.get(url, headers={"Authorization": "Bearer wrong"})
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"].startswith("Bearer")
        with refused(kind):
            async with _client(kind, url, token=None):
                pass
        async with _client(kind, url, token="s3cret") as client:
            assert text(await client.call_tool("echo", {"text": "in"})) == "in"


async def test_sse_serves_only_the_old_transport() -> None:
    async with serve_http(transport="sse") as url:
        assert url.endswith("/sse")
        async with Client(sse_client(url)) as client:  # "auto": whichever era it settles on
            assert text(await client.call_tool("echo", {"text": "old"})) == "old"
        async with httpx2.AsyncClient() as http:
            assert (await http.post(url.replace("/sse", "/mcp"), json={})).status_code == 404


def refused(kind: Literal["http", "sse"]) -> AbstractContextManager[object]:
    """How the SDK's client fails to connect to a server that refuses it: over Streamable HTTP
    an MCPError INTERNAL_ERROR inside its exception groups (the HTTP status is not kept); over
    SSE the HTTPStatusError of its GET, unwrapped."""
    if kind == "sse":
        return pytest.RaisesExc(httpx2.HTTPStatusError)
    internal = pytest.RaisesExc(MCPError, check=lambda error: error.code == INTERNAL_ERROR)
    return pytest.RaisesGroup(internal, flatten_subgroups=True)


@asynccontextmanager
async def _client(
    kind: Literal["http", "sse"], url: str, token: str | None
) -> AsyncIterator[Client]:
    """A client that sends `Authorization: Bearer <token>` (none if `token` is None)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if kind == "sse":
        async with Client(sse_client(url, headers=headers), mode="legacy") as client:
            yield client
        return
    async with (
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


async def test_fail_status_answers_every_request_with_it() -> None:
    async with serve_http("--fail-status", "500") as url:
        async with httpx2.AsyncClient() as http:
            assert (await http.post(url, json={})).status_code == 500
            assert (await http.get(url.replace("/mcp", "/anything"))).status_code == 500
        with refused("http"):
            async with Client(url):
                pass
