"""Which proxy the environment names for a URL, for the HTTP clients that do not ask it.

aiohttp only reads the proxy variables with `trust_env`, and then on every request, in a
thread, which costs more CPU than the rest of a short request; nanobot's aiohttp clients
look it up once, here, and pass it as `proxy=`.
"""

from __future__ import annotations

from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass


def env_proxy(url: str) -> str | None:
    """The proxy HTTPS_PROXY/HTTP_PROXY/ALL_PROXY name for `url`, unless NO_PROXY exempts it."""
    parts = urlsplit(url)
    proxies = getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or proxy_bypass(parts.hostname or ""):
        return None
    return proxy
