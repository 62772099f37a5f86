"""The egress proxy: the only way out of the sandbox's network namespace.

It serves HTTP CONNECT (https, or any TCP) and absolute-URI plain HTTP requests on a
listening socket that lives inside the namespace (see `netns.py`), from the gateway's own
event loop. For each request it resolves the name itself, checks EVERY address with the
table web_fetch uses (`addresses.address_kind`), and connects to a checked address (no second
lookup: no DNS rebinding). A refusal is an HTTP 403 whose body says why. Redirects are the
client's: each hop is a new request, checked again.

Attribution: each exec call gets its own credentials, put in the proxy URL of its
environment (`http://call-<token>@127.0.0.1:<port>`); requests without the credentials of a
running call are refused (407). The call's `EgressRecord` lists what it asked for, allowed
or not, for whoever judges what the command's output is (see `record.used`,
`record.hosts`). When a call ends its tunnels are closed.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import ipaddress
import secrets
import socket
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from loguru import logger

from nanobot.allowed_hosts import AllowedHost
from nanobot.tools.addresses import (
    METADATA_HOSTS,
    IPAddress,
    Resolver,
    address_kind,
    host_key,
    system_resolver,
)

HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT = 10.0
# Connections the proxy holds at once, all calls together, and tunnels one call may hold:
# each is a descriptor of the gateway's, which a command must not exhaust.
MAX_CONNECTIONS = 256
MAX_TUNNELS_PER_CALL = 64
CONNECT_TIMEOUT = 10.0
MAX_CONTACTS = 1000  # per call; a loop of requests must not grow the gateway's memory
_CHUNK = 64 * 1024
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Connector = Callable[[IPAddress, int], Awaitable[Streams]]
"""Opens a TCP connection to an address that was checked (tests point it elsewhere)."""
_HOP_HEADERS = frozenset({"proxy-authorization", "proxy-connection", "connection", "keep-alive"})


class Refused(Exception):
    """The proxy will not make this connection: `status` and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Contact:
    """One connection a call asked the proxy for; `refused` says why not, when it was not."""

    host: str
    port: int
    refused: str | None = None


@dataclass(slots=True, eq=False)
class EgressRecord:
    """What one exec call asked of the network. Filled while the command runs (on the
    event loop); read after. `contacts` keeps the first MAX_CONTACTS, `more` counts the rest
    (and `used` stays true once a connection was made, whether kept or counted)."""

    token: str
    contacts: list[Contact] = field(default_factory=list)
    more: int = 0
    _connected: bool = False
    _tunnels: set[asyncio.Task[None]] = field(default_factory=set)

    def add(self, contact: Contact) -> None:
        self._connected = self._connected or contact.refused is None
        if len(self.contacts) < MAX_CONTACTS:
            self.contacts.append(contact)
        else:
            self.more += 1

    @property
    def used(self) -> bool:
        """Whether the command reached anything outside (a connection was made)."""
        return self._connected

    @property
    def hosts(self) -> frozenset[str]:
        """The hosts it connected to (`host:port`)."""
        return frozenset(f"{c.host}:{c.port}" for c in self.contacts if c.refused is None)


class EgressProxy:
    """Serves the egress proxy on `listener` (already listening) until `close()`."""

    def __init__(
        self,
        listener: socket.socket,
        *,
        allow_hosts: Collection[AllowedHost] = (),
        resolver: Resolver = system_resolver,
        connector: Connector | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self._listener = listener
        self.port: int = listener.getsockname()[1]
        self._allow = tuple(allow_hosts)
        self.allowed: tuple[str, ...] = tuple(a.text for a in self._allow)
        # Named hosts go through the proxy (a loopback one is the host's, not the sandbox's).
        self.direct: tuple[str, ...] = tuple(
            h for h in ("localhost", "127.0.0.1", "::1") if all(a.host != h for a in self._allow)
        )
        self._resolve = resolver
        self._connect = connector or _open_connection
        self._connect_timeout = connect_timeout
        self._calls: dict[str, EgressRecord] = {}
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, sock=self._listener, limit=HEAD_LIMIT
        )

    async def close(self) -> None:
        """Stop listening, close every connection in flight and wait for their handlers."""
        if self._server is not None:
            self._server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def open_call(self) -> EgressRecord:
        """A new call's record; its credentials are valid until `end_call`."""
        record = EgressRecord(secrets.token_hex(12))
        self._calls[record.token] = record
        return record

    def end_call(self, record: EgressRecord) -> None:
        """Invalidate the call's credentials and close its tunnels (the record stays)."""
        self._calls.pop(record.token, None)
        for task in record._tunnels:
            task.cancel()

    def url(self, record: EgressRecord) -> str:
        # A password too: git and pip ask for one (and fail, having no terminal) without.
        return f"http://call-{record.token}:sandbox@127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._handlers) >= MAX_CONNECTIONS:
            writer.close()  # before reading anything: the gateway's descriptors come first
            return
        self._handlers.add(task)
        record: EgressRecord | None = None
        try:
            async with asyncio.timeout(HEAD_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
            request = _parse_head(head)
            record = self._call_of(request.headers)
            if len(record._tunnels) >= MAX_TUNNELS_PER_CALL:
                raise Refused(
                    429, f"nanobot: a command may hold {MAX_TUNNELS_PER_CALL} connections at once"
                )
            record._tunnels.add(task)
            await self._serve(request, record, reader, writer)
        except Refused as exc:
            await _answer(writer, exc.status, str(exc))
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, TimeoutError):
            await _answer(writer, 400, "nanobot: incomplete or oversized request head")
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            # Closed by `end_call` or `close`, its only cancellers; asyncio's server would
            # log a handler that ended cancelled as an error.
            pass
        except Exception:  # noqa: BLE001 - a task boundary: one bad request must not stop the proxy
            logger.exception("egress proxy: a request failed")
        finally:
            if record is not None:
                record._tunnels.discard(task)
            self._handlers.discard(task)
            writer.close()

    def _call_of(self, headers: dict[str, str]) -> EgressRecord:
        scheme, _, value = headers.get("proxy-authorization", "").partition(" ")
        user = ""
        if scheme.lower() == "basic":
            with contextlib.suppress(binascii.Error, UnicodeDecodeError):
                user = base64.b64decode(value.strip(), validate=True).decode().partition(":")[0]
        record = self._calls.get(user.removeprefix("call-")) if user.startswith("call-") else None
        if record is None:
            raise Refused(407, "nanobot: this proxy serves only the sandbox's running commands")
        return record

    async def _serve(
        self,
        request: _Request,
        record: EgressRecord,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        method, target, headers = request.method, request.target, request.headers
        if method == "CONNECT":
            host, port = _authority(target, default_port=None)
            upstream = await self._open(record, host, port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await _splice(reader, writer, *upstream)
            return
        url = urlsplit(target)
        if url.scheme != "http" or not url.netloc:
            raise Refused(
                400,
                "nanobot: send plain-HTTP requests with an absolute http:// URL, and https "
                "through CONNECT",
            )
        host, port = _authority(url.netloc.rpartition("@")[2], default_port=80)
        up_reader, up_writer = await self._open(record, host, port)
        path = url.path or "/"
        if url.query:
            path += f"?{url.query}"
        lines = [f"{method} {path} HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k not in _HOP_HEADERS]
        lines.append("Connection: close")
        up_writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await _splice(reader, writer, up_reader, up_writer)

    async def _open(self, record: EgressRecord, host: str, port: int) -> Streams:
        """Connect to a checked address of `host`, recording the attempt."""
        try:
            addresses = await self._checked(host, port)
        except Refused as exc:
            record.add(Contact(host, port, str(exc)))
            raise
        record.add(Contact(host, port))
        failure: OSError | TimeoutError | None = None
        for address in addresses:
            try:
                async with asyncio.timeout(self._connect_timeout):
                    return await self._connect(address, port)
            except (OSError, TimeoutError) as exc:
                failure = exc
        raise Refused(
            502, f"nanobot: could not connect to {host}:{port}: {failure or 'no address'}"
        )

    async def _checked(self, host: str, port: int) -> Sequence[IPAddress]:
        named = any(a.matches(host, port) for a in self._allow)
        if host in METADATA_HOSTS and not named:
            raise Refused(403, f"nanobot: {host} is a cloud metadata service")
        try:
            addresses: Sequence[IPAddress] = [ipaddress.ip_address(host)]
            literal = True
        except ValueError:
            literal = False
            try:
                addresses = await self._resolve(host, port)
            except OSError as exc:
                raise Refused(502, f"nanobot: could not resolve {host}: {exc}") from None
        if not addresses:
            raise Refused(502, f"nanobot: could not resolve {host}: no addresses")
        for address in addresses:
            kind = address_kind(address)
            if kind is None or named or any(a.matches(str(address), port) for a in self._allow):
                continue
            subject = f"{address} is" if literal else f"{host} has the address {address}, which is"
            raise Refused(
                403,
                f"nanobot: {subject} a {kind} address; the sandbox reaches only the public "
                "internet (tools.exec.allow_hosts lists exceptions)",
            )
        return addresses


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    target: str
    headers: dict[str, str]


async def _open_connection(address: IPAddress, port: int) -> Streams:
    return await asyncio.open_connection(str(address), port, limit=_CHUNK)


def _parse_head(head: bytes) -> _Request:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refused(400, "nanobot: not an HTTP/1.x request")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise Refused(400, f"nanobot: malformed header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return _Request(parts[0].upper(), parts[1], headers)


def _authority(text: str, *, default_port: int | None) -> tuple[str, int]:
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    elif ":" in text:
        host, _, port = text.rpartition(":")
    if not port and default_port is not None:
        port = str(default_port)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise Refused(400, f"nanobot: {text!r} is not host:port")
    return host_key(host), int(port)


async def _answer(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    reason = {
        400: "Bad Request",
        403: "Forbidden",
        407: "Proxy Authentication Required",
        429: "Too Many Requests",
    }
    body = (message + "\n").encode()
    extra = 'Proxy-Authenticate: Basic realm="nanobot"\r\n' if status == 407 else ""
    writer.write(
        f"HTTP/1.1 {status} {reason.get(status, 'Bad Gateway')}\r\nContent-Type: text/plain; "
        f"charset=utf-8\r\nContent-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(ConnectionError, OSError):
        await writer.drain()


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Copy both ways until both sides have finished; then close the upstream."""
    try:
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
    finally:
        up_writer.close()


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (ConnectionError, OSError):
        sink.close()
