"""The sandbox's own network for tests: the shared namespace and the egress proxy, as the
gateway makes them (`app.open_sandbox`), on the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from nanobot.allowed_hosts import AllowedHost
from nanobot.tools.egress import EgressProxy
from nanobot.tools.netns import NetworkNamespace
from nanobot.tools.sandbox import Network


@asynccontextmanager
async def public_network(allow_hosts: Sequence[str] = ()) -> AsyncIterator[Network]:
    """A namespace with its proxy serving it; both closed on exit."""
    namespace = NetworkNamespace.create()
    proxy = EgressProxy(namespace.listener, allow_hosts=[AllowedHost.parse(h) for h in allow_hosts])
    await proxy.start()
    try:
        yield Network(tuple(namespace.enter), proxy)
    finally:
        await proxy.close()
        namespace.close()
