"""Which addresses count as the public internet: the one table web_fetch and the sandbox's
egress proxy both check every resolved address against, and the system resolver they use."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]
"""Maps (host name, port) to the addresses a connection could go to."""

# First match wins, so the specific entries come before the ranges that contain them.
_NOT_PUBLIC: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.ip_network(net), kind)
    for net, kind in (
        ("0.0.0.0/8", "unspecified ('this network')"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "carrier-grade NAT (shared)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.169.254/32", "cloud metadata"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignment"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),  # includes the broadcast address
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("fd00:ec2::254/128", "cloud metadata"),
        ("fc00::/7", "private (unique local)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
        ("2001::/23", "IETF protocol assignment"),  # includes Teredo
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "segment routing"),
    )
)
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})


def address_kind(ip: IPAddress) -> str | None:
    """Why `ip` is not a public internet address ("loopback", "private", ...), or None.

    IPv6 addresses that carry an IPv4 address (mapped ::ffff:a.b.c.d, 6to4, NAT64) are judged
    by the IPv4 address; other IPv6 addresses must be global unicast (2000::/3).
    """
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            kind = address_kind(embedded)
            return None if kind is None else f"{kind}, inside an IPv6 address"
    for network, kind in _NOT_PUBLIC:
        if network.version == ip.version and ip in network:
            return kind
    if isinstance(ip, ipaddress.IPv6Address) and ip not in _GLOBAL_UNICAST_V6:
        return "reserved"
    if ip in own_addresses():
        # A public address of this machine's own reaches every service bound to 0.0.0.0
        # here (a Redis, a database, a model server) as surely as loopback does.
        return "local (this machine's own)"
    return None


OWN_TTL = 10.0  # seconds an interface address read stays current (addresses change rarely)
# The last read: [when (monotonic), what]; one list, updated in place.
_own: list[tuple[float, frozenset[IPAddress]]] = [(-OWN_TTL, frozenset())]


def own_addresses() -> frozenset[IPAddress]:
    """The addresses of this machine's interfaces (Linux: /proc/net/fib_trie's local
    entries, /proc/net/if_inet6), read at most every OWN_TTL seconds; empty where /proc does
    not tell. A read of two small kernel tables: cheap enough for the event loop."""
    now = time.monotonic()
    read_at, addresses = _own[0]
    if now - read_at < OWN_TTL:
        return addresses
    try:
        trie = Path("/proc/net/fib_trie").read_text()
    except OSError:
        trie = ""
    try:
        inet6 = Path("/proc/net/if_inet6").read_text()
    except OSError:
        inet6 = ""
    _own[0] = (now, local_addresses(trie, inet6))
    return _own[0][1]


def local_addresses(fib_trie: str, if_inet6: str) -> frozenset[IPAddress]:
    """The interface addresses the kernel's tables list: each IPv4 address the FIB marks
    `/32 host LOCAL`, each IPv6 address of if_inet6 (32 hex digits first on a line)."""
    found: set[IPAddress] = set()
    last: str | None = None
    for line in fib_trie.splitlines():
        text = line.strip()
        if text.startswith(("|--", "+--")):
            last = text[3:].split()[0]
        elif text.startswith("/32 host LOCAL") and last is not None:
            with contextlib.suppress(ValueError):
                found.add(ipaddress.IPv4Address(last))
    for line in if_inet6.splitlines():
        digits = line.split()[:1]
        if digits and len(digits[0]) == 32:
            with contextlib.suppress(ValueError):
                found.add(ipaddress.IPv6Address(int(digits[0], 16)))
    return frozenset(found)


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Resolve `host` with the system resolver, off the event loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0])) for info in infos))


def host_key(host: str) -> str:
    """`host` as allow lists compare it: lower case, no trailing dot, no IPv6 brackets."""
    return host.strip().rstrip(".").lower().strip("[]")
