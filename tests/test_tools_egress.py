"""The egress proxy on its own: what it connects, what it refuses and says, whom it records.

The proxy serves a listening socket on the host's 127.0.0.1 here (in the gateway it lives in
the sandbox's namespace: see test_tools_sandbox.py); names resolve through a fake resolver,
and the only upstreams are servers the tests open on 127.0.0.1, reached through allow_hosts.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
import time
from collections.abc import AsyncIterator, Sequence

import pytest
from aiohttp import web

from nanobot.allowed_hosts import AllowedHost
from nanobot.tools import addresses
from nanobot.tools.addresses import IPAddress
from nanobot.tools.egress import (
    MAX_CONNECTIONS,
    MAX_CONTACTS,
    MAX_TUNNELS_PER_CALL,
    Contact,
    EgressProxy,
    EgressRecord,
    Streams,
)
from tests.local_http import serving

NAMES = {
    "public.example": ["93.184.216.34"],
    "mixed.example": ["93.184.216.34", "10.0.0.5"],
    "lan.example": ["10.0.0.5"],
    "rebind.example": ["93.184.216.34"],
    "local.example": ["127.0.0.1"],
}


async def fake_dns(host: str, port: int) -> Sequence[IPAddress]:
    if host not in NAMES:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return [ipaddress.ip_address(a) for a in NAMES[host]]


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[int, list[web.Request]]]:
    """An HTTP server on 127.0.0.1 that says what it was asked; (port, the requests)."""
    seen: list[web.Request] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(request)
        auth = request.headers.get("Proxy-Authorization", "none")
        return web.Response(text=f"upstream saw {request.path_qs} auth={auth}")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    async with serving(app) as url:
        yield int(url.rsplit(":", 1)[1]), seen


async def start_proxy(*allow: str) -> EgressProxy:
    listener = socket.create_server(("127.0.0.1", 0))
    proxy = EgressProxy(
        listener, allow_hosts=[AllowedHost.parse(a) for a in allow], resolver=fake_dns
    )
    await proxy.start()
    return proxy


def auth(record: EgressRecord | None) -> str:
    if record is None:
        return ""
    token = base64.b64encode(f"call-{record.token}:".encode()).decode()
    return f"Proxy-Authorization: Basic {token}\r\n"


async def ask(
    proxy: EgressProxy, record: EgressRecord | None, head: str
) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter]:
    """Send a request head (`auth` added); returns (the answer's first part, the stream)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    line, _, rest = head.partition("\r\n")
    writer.write(f"{line}\r\n{auth(record)}{rest}".encode())
    await writer.drain()
    answer = await reader.readuntil(b"\r\n\r\n")
    return answer.decode(), reader, writer


async def body_of(head: str, reader: asyncio.StreamReader) -> str:
    length = int(head.split("Content-Length: ")[1].split("\r\n", maxsplit=1)[0])
    return (await reader.readexactly(length)).decode()


async def test_connect_to_an_allowed_host_tunnels_and_is_recorded(
    upstream: tuple[int, list[web.Request]],
) -> None:
    port, _ = upstream
    proxy = await start_proxy(f"127.0.0.1:{port}")
    record = proxy.open_call()
    head, reader, writer = await ask(proxy, record, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
    assert head.startswith("HTTP/1.1 200")
    writer.write(b"GET /through HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = (await reader.read()).decode()
    assert "upstream saw /through auth=none" in answer
    assert record.used and record.hosts == {f"127.0.0.1:{port}"}
    writer.close()
    await proxy.close()


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("10.0.0.5:443", "nanobot: 10.0.0.5 is a private address"),
        ("169.254.169.254:80", "nanobot: 169.254.169.254 is a cloud metadata address"),
        ("127.0.0.1:5432", "nanobot: 127.0.0.1 is a loopback address"),
        ("[::1]:6379", "nanobot: ::1 is a loopback address"),
        ("[::ffff:10.0.0.5]:80", "private, inside an IPv6 address"),
        ("lan.example:443", "nanobot: lan.example has the address 10.0.0.5, which is a private"),
        ("mixed.example:443", "mixed.example has the address 10.0.0.5"),
        ("metadata.google.internal:80", "is a cloud metadata service"),
    ],
)
async def test_connect_to_what_is_not_public_is_refused_saying_why(target: str, said: str) -> None:
    proxy = await start_proxy()
    record = proxy.open_call()
    head, reader, writer = await ask(proxy, record, f"CONNECT {target} HTTP/1.1\r\n\r\n")
    assert head.startswith("HTTP/1.1 403 Forbidden")
    body = await body_of(head, reader)
    assert said in body
    if "metadata service" not in said:
        assert "tools.exec.allow_hosts" in body
    assert not record.used
    assert record.contacts[0].refused is not None and said in record.contacts[0].refused
    writer.close()
    await proxy.close()


async def test_a_public_address_is_connected_to_as_checked_with_no_second_lookup(
    upstream: tuple[int, list[web.Request]],
) -> None:
    port, _ = upstream
    lookups: list[str] = []
    dialled: list[tuple[IPAddress, int]] = []

    async def rebinding(host: str, _: int) -> Sequence[IPAddress]:
        # Public the first time, loopback after: a second lookup would reach the host.
        lookups.append(host)
        return [ipaddress.ip_address("93.184.216.34" if len(lookups) == 1 else "127.0.0.1")]

    async def local(address: IPAddress, _: int) -> Streams:
        dialled.append((address, _))  # the internet stands here on 127.0.0.1
        return await asyncio.open_connection("127.0.0.1", port)

    listener = socket.create_server(("127.0.0.1", 0))
    proxy = EgressProxy(listener, resolver=rebinding, connector=local)
    await proxy.start()
    record = proxy.open_call()
    head, reader, writer = await ask(proxy, record, "CONNECT rebind.example:443 HTTP/1.1\r\n\r\n")
    assert head.startswith("HTTP/1.1 200")
    writer.write(b"GET /public HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert "upstream saw /public" in (await reader.read()).decode()
    assert lookups == ["rebind.example"]
    assert dialled == [(ipaddress.ip_address("93.184.216.34"), 443)]
    assert record.hosts == {"rebind.example:443"}
    writer.close()
    await proxy.close()


async def test_a_dead_upstream_is_a_502_naming_it() -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()
    proxy = await start_proxy(f"127.0.0.1:{dead_port}")
    head, reader, writer = await ask(
        proxy, proxy.open_call(), f"CONNECT 127.0.0.1:{dead_port} HTTP/1.1\r\n\r\n"
    )
    assert head.startswith("HTTP/1.1 502")
    assert f"could not connect to 127.0.0.1:{dead_port}" in await body_of(head, reader)
    writer.close()
    await proxy.close()


async def test_plain_http_is_forwarded_in_origin_form_without_the_credentials(
    upstream: tuple[int, list[web.Request]],
) -> None:
    port, seen = upstream
    proxy = await start_proxy(f"local.example:{port}")
    record = proxy.open_call()
    head, reader, writer = await ask(
        proxy,
        record,
        f"GET http://local.example:{port}/page?q=1 HTTP/1.1\r\nHost: local.example\r\n\r\n",
    )
    assert head.startswith("HTTP/1.1 200")
    assert "upstream saw /page?q=1 auth=none" in (await reader.read()).decode()
    assert seen[0].headers["Connection"] == "close"
    assert record.hosts == {f"local.example:{port}"}
    writer.close()
    await proxy.close()


async def test_allow_hosts_by_port_and_by_name(upstream: tuple[int, list[web.Request]]) -> None:
    port, _ = upstream
    proxy = await start_proxy(f"127.0.0.1:{port + 1}", "localhost")
    record = proxy.open_call()
    head, _, writer = await ask(proxy, record, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
    assert head.startswith("HTTP/1.1 403")  # another port than the one named
    writer.close()
    assert proxy.allowed == (f"127.0.0.1:{port + 1}", "localhost")
    assert proxy.direct == ("::1",)  # named loopback hosts go through the proxy
    await proxy.close()


@pytest.mark.parametrize(
    ("head", "status", "said"),
    [
        ("NONSENSE\r\n\r\n", 400, "not an HTTP/1.x request"),
        ("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "absolute http:// URL"),
        ("GET https://public.example/ HTTP/1.1\r\n\r\n", 400, "https through CONNECT"),
        ("CONNECT public.example HTTP/1.1\r\n\r\n", 400, "is not host:port"),
        ("CONNECT a:99999 HTTP/1.1\r\n\r\n", 400, "is not host:port"),
        ("CONNECT nowhere.example:443 HTTP/1.1\r\n\r\n", 502, "could not resolve"),
        ("GET http://x/ HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed header"),
    ],
)
async def test_bad_requests_get_a_clear_answer(head: str, status: int, said: str) -> None:
    proxy = await start_proxy()
    answer, reader, writer = await ask(proxy, proxy.open_call(), head)
    assert answer.startswith(f"HTTP/1.1 {status}")
    assert said in await body_of(answer, reader)
    writer.close()
    await proxy.close()


async def test_an_oversized_head_is_refused() -> None:
    proxy = await start_proxy()
    answer, _, writer = await ask(
        proxy, proxy.open_call(), "GET http://x/ HTTP/1.1\r\nX: " + "a" * 70_000 + "\r\n\r\n"
    )
    assert answer.startswith("HTTP/1.1 400")
    writer.close()
    await proxy.close()


async def test_only_running_calls_may_use_it_and_each_is_recorded_apart(
    upstream: tuple[int, list[web.Request]],
) -> None:
    port, _ = upstream
    proxy = await start_proxy(f"127.0.0.1:{port}")
    head, _, writer = await ask(proxy, None, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
    assert head.startswith("HTTP/1.1 407")
    assert "Proxy-Authenticate: Basic" in head
    writer.close()
    first, second = proxy.open_call(), proxy.open_call()
    assert proxy.url(first) == f"http://call-{first.token}:sandbox@127.0.0.1:{proxy.port}"
    head, _, writer = await ask(proxy, first, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
    assert head.startswith("HTTP/1.1 200")
    writer.close()
    head, _, writer = await ask(proxy, second, "CONNECT 10.0.0.5:80 HTTP/1.1\r\n\r\n")
    writer.close()
    assert first.hosts == {f"127.0.0.1:{port}"} and not second.used
    assert [c.host for c in second.contacts] == ["10.0.0.5"]
    proxy.end_call(first)
    head, _, writer = await ask(proxy, first, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
    assert head.startswith("HTTP/1.1 407")  # its call has ended
    writer.close()
    await proxy.close()


async def test_ending_a_call_or_the_proxy_closes_the_tunnels() -> None:
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # says nothing and never closes

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = await start_proxy(f"127.0.0.1:{port}")
    call, other = proxy.open_call(), proxy.open_call()
    head, reader, mine = await ask(proxy, call, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
    assert head.startswith("HTTP/1.1 200")
    head2, reader2, mine2 = await ask(proxy, other, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
    assert head2.startswith("HTTP/1.1 200")
    proxy.end_call(call)
    assert await reader.read() == b""  # closed by the proxy, not by the silent upstream
    await proxy.close()
    assert await reader2.read() == b""
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", proxy.port)
    server.close()
    for writer in (*held, mine, mine2):
        writer.close()
    await server.wait_closed()


def test_allow_host_entries_parse_and_match() -> None:
    entry = AllowedHost.parse("Ollama.LAN.:11434")
    assert (entry.host, entry.port, entry.text) == ("ollama.lan", 11434, "ollama.lan:11434")
    assert entry.matches("ollama.lan", 11434) and not entry.matches("ollama.lan", 80)
    assert AllowedHost.parse("fd00::1").text == "[fd00::1]"
    assert AllowedHost.parse("[fd00::1]:8080").matches("fd00::1", 8080)
    for bad in ("", ":80", "host:0", "host:x", "http://host", "[::1]x"):
        with pytest.raises(ValueError, match=r"expected|the port must be"):
            AllowedHost.parse(bad)


def test_a_record_keeps_the_first_contacts_and_counts_the_rest() -> None:
    record = EgressRecord("t")
    for n in range(MAX_CONTACTS + 5):
        record.add(Contact("10.0.0.5", n + 1, "refused"))
    record.add(Contact("example.com", 443))
    assert len(record.contacts) == MAX_CONTACTS and record.more == 6
    assert record.used  # the connection it made is past the kept ones, and still counts


async def test_connections_are_bounded_per_call_and_in_all() -> None:
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = await start_proxy(f"127.0.0.1:{port}")
    call = proxy.open_call()
    mine = []
    for _ in range(MAX_TUNNELS_PER_CALL):
        head, _, writer = await ask(proxy, call, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
        assert head.startswith("HTTP/1.1 200")
        mine.append(writer)
    head, reader, writer = await ask(proxy, call, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")
    assert head.startswith("HTTP/1.1 429")
    assert "may hold 64 connections at once" in await body_of(head, reader)
    mine.append(writer)
    # Silent connections (no head) count too, up to the proxy's limit; past it, closed at once.
    idle = [await asyncio.open_connection("127.0.0.1", proxy.port) for _ in range(MAX_CONNECTIONS)]
    extra_reader, extra = await asyncio.open_connection("127.0.0.1", proxy.port)
    assert await extra_reader.read() == b""
    await proxy.close()
    for writer in (*mine, *(w for _, w in idle), extra, *held):
        writer.close()
    server.close()
    await server.wait_closed()


async def test_a_public_address_of_this_machine_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On a server with a public address, that address reaches every service bound to
    # 0.0.0.0 there (an unauthenticated Redis, the webhook port) as loopback would.
    own = ipaddress.ip_address("93.184.216.34")
    monkeypatch.setattr(addresses, "_own", [(time.monotonic(), frozenset({own}))])
    proxy = await start_proxy()
    for target in ("93.184.216.34:6379", "public.example:443"):
        head, reader, writer = await ask(
            proxy, proxy.open_call(), f"CONNECT {target} HTTP/1.1\r\n\r\n"
        )
        assert head.startswith("HTTP/1.1 403"), target
        assert "a local (this machine's own) address" in await body_of(head, reader)
        writer.close()
    await proxy.close()


def test_this_machines_addresses_come_from_the_kernels_tables() -> None:
    trie = (
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n"
        "Local:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 127.0.0.0\n        /8 host LOCAL\n"
        "     |-- 127.0.0.1\n        /32 host LOCAL\n     |-- 192.0.2.255\n"
        "        /32 link BROADCAST\n     |-- 203.0.113.7\n        /32 host LOCAL\n"
    )
    inet6 = (
        "fd000000000000000000000000000002 04 40 00 82     eth0\n"
        "00000000000000000000000000000001 01 80 10 80       lo\n"
    )
    assert addresses.local_addresses(trie, inet6) == {
        ipaddress.ip_address(a) for a in ("127.0.0.1", "203.0.113.7", "fd00::2", "::1")
    }
    assert ipaddress.ip_address("127.0.0.1") in addresses.own_addresses()  # this machine
