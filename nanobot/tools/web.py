"""Web tools: web_search (Brave Search API) and web_fetch.

web_fetch only reaches the public internet. Every URL, the first and each redirect hop, is
resolved (`loop.getaddrinfo`) and refused if any of its addresses is not public
(`address_kind`); the request then connects to the address that was checked, not to a fresh
lookup of the name, so DNS rebinding between check and connect is not possible. TLS is still
verified against the host name (the `sni_hostname` extension of httpcore). Proxies from the
environment are ignored, as they would resolve names themselves.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import html
import ipaddress
import re
import ssl
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from nanobot.tools._html_text import html_to_text
from nanobot.tools._untrusted import defuse
from nanobot.tools.addresses import (
    METADATA_HOSTS,
    IPAddress,
    Resolver,
    address_kind,
    host_key,
    system_resolver,
)
from nanobot.tools.base import Tool, ToolError, ToolParams, ToolResult, untrusted
from nanobot.tools.registry import MAX_RESULT_CHARS
from nanobot.tools.taint import cut

if TYPE_CHECKING:
    import httpx


@cache
def _httpx() -> ModuleType:
    # Imported at the first request: with the CLI libraries installed, httpx imports its
    # own command line (rich) too, some 80 ms that a start-up need not pay.
    import httpx

    return httpx


BRAVE_SEARCH_URL = "https://api.search.brave.com/res/v1/web/search"
USER_AGENT = "Mozilla/5.0 (compatible; nanobot; +https://github.com/HKUDS/nanobot)"
FETCH_MAX_BYTES = 2_000_000
FETCH_TIMEOUT = 20.0
FETCH_MAX_REDIRECTS = 5
FETCH_MAX_CHARS = MAX_RESULT_CHARS - 2000  # leaves room for the header and the wrapper


class WebSearchParams(ToolParams):
    query: str = Field(min_length=1, description="What to search the web for.")
    count: int = Field(default=5, ge=1, le=10, description="How many results to return (1-10).")


class WebSearchTool(Tool[WebSearchParams]):
    """Searches the web with the Brave Search API."""

    name = "web_search"
    description = "Search the web. Returns titles, URLs and snippets; use web_fetch to read a page."
    params = WebSearchParams

    def __init__(
        self, api_key: str | None, *, base_url: str = BRAVE_SEARCH_URL, timeout: float = 15.0
    ) -> None:
        self._api_key = api_key
        self.base_url = base_url
        self.timeout = timeout
        self._ssl: ssl.SSLContext | None = None

    async def run(self, args: WebSearchParams) -> str | ToolResult:
        if not self._api_key:
            raise ToolError("web search is not configured: set tools.web.search_api_key")
        headers = {"Accept": "application/json", "X-Subscription-Token": self._api_key}
        try:
            http = _httpx()
            verify = self._ssl = self._ssl or http.create_ssl_context()
            async with http.AsyncClient(timeout=self.timeout, verify=verify) as client:
                response = await client.get(
                    self.base_url, params={"q": args.query, "count": args.count}, headers=headers
                )
        except _httpx().TimeoutException:
            raise ToolError("web search timed out; try again later") from None
        except _httpx().HTTPError as exc:
            raise ToolError(
                f"web search failed: the search API cannot be reached ({exc})"
            ) from None
        if response.status_code in (401, 403):
            raise ToolError(
                f"the search API refused the key (HTTP {response.status_code}); "
                "check tools.web.search_api_key"
            )
        if response.status_code == 429:
            raise ToolError("the search API is rate-limiting; try again in a minute")
        if not response.is_success:
            raise ToolError(
                f"web search failed: the search API answered HTTP {response.status_code}"
            )
        results = _brave_results(response)
        if not results:
            return f"No results for {args.query!r}."
        lines = []
        for number, (title, url, snippet) in enumerate(results[: args.count], 1):
            lines.append(f"{number}. {title}\n   {url}" + (f"\n   {snippet}" if snippet else ""))
        text = f"Results for {args.query!r}:\n" + untrusted("web_search", "\n".join(lines))
        return ToolResult(text, taint=(cut(f"web search results for {args.query!r}"),))


def _brave_results(response: httpx.Response) -> list[tuple[str, str, str]]:
    """(title, url, snippet) of each web result; snippets come with <strong> marks."""
    try:
        data: Any = response.json()
        items = data.get("web", {}).get("results", [])
        return [
            (_plain(item.get("title", "")), str(item["url"]), _plain(item.get("description", "")))
            for item in items
            if isinstance(item, dict) and item.get("url")
        ]
    except (ValueError, AttributeError) as exc:
        raise ToolError(
            f"web search failed: unexpected answer from the search API ({exc})"
        ) from None


def _plain(marked_up: object) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", str(marked_up))).strip()


class WebFetchParams(ToolParams):
    url: str = Field(description="http(s) URL of the page to read.")
    max_chars: int = Field(
        default=FETCH_MAX_CHARS,
        ge=100,
        le=FETCH_MAX_CHARS,
        description=f"Most characters of text to return (at most {FETCH_MAX_CHARS}).",
    )


@dataclass(frozen=True, slots=True)
class _Page:
    url: httpx.URL
    status: int
    content_type: str
    text: str
    size: int
    cut: bool  # stopped reading at max_bytes


class WebFetchTool(Tool[WebFetchParams]):
    """Fetches a public web page and returns its readable text, marked as untrusted."""

    name = "web_fetch"
    description = (
        "Fetch a URL from the public internet and return its readable text (HTML is reduced "
        "to text; JSON and plain text are returned as they are)."
    )
    params = WebFetchParams

    def __init__(
        self,
        *,
        max_bytes: int = FETCH_MAX_BYTES,
        timeout: float = FETCH_TIMEOUT,
        max_redirects: int = FETCH_MAX_REDIRECTS,
        allow_hosts: Collection[str] = (),
        resolver: Resolver = system_resolver,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`allow_hosts`: host names (or IP literals) exempt from the public-address check,
        e.g. a service on the LAN; redirects away from them are checked as usual.
        `ssl_context`: whom to trust for TLS (default: httpx's, the certifi CAs)."""
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.max_redirects = max_redirects
        self._allow_hosts = frozenset(host_key(h) for h in allow_hosts)
        self._resolve = resolver
        self._ssl = ssl_context  # httpx's by default, made at the first fetch

    async def run(self, args: WebFetchParams) -> str | ToolResult:
        try:
            url = _httpx().URL(args.url.strip())
        except _httpx().InvalidURL as exc:
            raise ToolError(f"{args.url!r} is not a valid URL: {exc}") from None
        try:
            async with asyncio.timeout(self.timeout):
                page = await self._fetch(url)
        except TimeoutError:
            raise ToolError(
                f"fetching {url} took longer than {self.timeout:g} s; gave up"
            ) from None
        except (_httpx().HTTPError, _httpx().InvalidURL) as exc:
            raise ToolError(f"could not fetch {url}: {type(exc).__name__}: {exc}") from None
        text = page.text[: args.max_chars]
        # The server chose the URL it redirected to and its content type: no marker in them.
        shown_url, kind = defuse(str(page.url)), defuse(page.content_type)
        header = f"URL: {shown_url}\nHTTP {page.status}, {kind}, {page.size} bytes"
        if page.cut:
            header += f" (stopped reading at {self.max_bytes} bytes)"
        if len(text) < len(page.text):
            header += f"\nShowing the first {len(text)} of {len(page.text)} characters."
        return ToolResult(
            f"{header}\n{untrusted(str(page.url), text)}", taint=(cut(str(page.url)),)
        )

    async def _fetch(self, url: httpx.URL) -> _Page:
        http = _httpx()
        self._ssl = self._ssl or http.create_ssl_context()
        async with http.AsyncClient(
            verify=self._ssl,
            trust_env=False,
            follow_redirects=False,
            timeout=self.timeout,
            headers={"User-Agent": USER_AGENT},
        ) as client:
            for _ in range(self.max_redirects + 1):
                response = await self._send_pinned(client, url)
                try:
                    if not response.is_redirect:
                        return await self._read(url, response)
                    url = url.join(response.headers["location"])
                finally:
                    await response.aclose()
        raise ToolError(f"gave up after {self.max_redirects} redirects (the last to {url})")

    async def _send_pinned(self, client: httpx.AsyncClient, url: httpx.URL) -> httpx.Response:
        """GET `url` from one of its addresses, all of which were checked to be allowed.

        The connection goes to the checked address itself; the request still names the host
        (Host header, and the TLS server name, which the certificate is verified against).
        """
        if url.scheme not in ("http", "https"):
            raise ToolError(
                f"refused {url}: only http and https URLs can be fetched "
                "(include the scheme, e.g. https://example.com)"
            )
        host = host_key(url.host)
        if not host:
            raise ToolError(f"refused {url}: it has no host name")
        if host in METADATA_HOSTS:
            raise ToolError(f"refused {url}: {url.host} is a cloud metadata service")
        # One address may be unreachable (IPv6 on a server without it); then try the next.
        *others, last = await self._checked_addresses(url, host)
        for address in others:
            with contextlib.suppress(_httpx().ConnectError):
                return await client.send(_request_to(client, url, address), stream=True)
        return await client.send(_request_to(client, url, last), stream=True)

    async def _checked_addresses(self, url: httpx.URL, host: str) -> Sequence[IPAddress]:
        literal = True
        try:
            addresses: Sequence[IPAddress] = [ipaddress.ip_address(host)]
        except ValueError:
            literal = False
            port = url.port or (443 if url.scheme == "https" else 80)
            try:
                addresses = await self._resolve(url.raw_host.decode("ascii"), port)
            except OSError as exc:
                raise ToolError(f"could not resolve {url.host}: {exc}") from None
        if not addresses:
            raise ToolError(f"could not resolve {url.host}: no addresses")
        if host not in self._allow_hosts:
            for address in addresses:
                if kind := address_kind(address):
                    subject = (
                        f"{address} is not a public address"
                        if literal
                        else f"{url.host} has the address {address}, which is not public"
                    )
                    raise ToolError(
                        f"refused {url}: {subject} ({kind}); "
                        "web_fetch only fetches from the public internet"
                    )
        return addresses

    async def _read(self, url: httpx.URL, response: httpx.Response) -> _Page:
        if response.status_code >= 400:
            raise ToolError(f"{url} answered HTTP {response.status_code} {response.reason_phrase}")
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        kind = _content_kind(content_type)
        if kind is None:
            raise ToolError(
                f"{url} is {defuse(content_type)}, not a web page; web_fetch reads HTML, JSON "
                "and text"
            )
        body, cut = bytearray(), False
        async for chunk in response.aiter_bytes():
            room = self.max_bytes - len(body)
            body += chunk[:room]
            if len(chunk) > room:
                cut = True
                break
        if not content_type:
            if b"\0" in body[:1024]:
                raise ToolError(f"{url} is binary data, not a web page")
            kind = "html" if body.lstrip()[:1] == b"<" else "text"
        text = bytes(body).decode(_charset(response, body), errors="replace")
        if kind == "html":
            text = await asyncio.to_thread(html_to_text, text)
        return _Page(url, response.status_code, content_type or "unknown", text, len(body), cut)


def _request_to(client: httpx.AsyncClient, url: httpx.URL, address: IPAddress) -> httpx.Request:
    """A GET for `url` sent to `address`, still naming the host in Host and the TLS SNI."""
    sni = {"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" else {}
    return client.build_request(
        "GET",
        url.copy_with(host=str(address)),
        headers={"Host": url.netloc.decode("ascii")},
        extensions=sni,
    )


def _content_kind(content_type: str) -> Literal["html", "text", "unknown"] | None:
    if not content_type:
        return "unknown"
    if content_type in ("text/html", "application/xhtml+xml"):
        return "html"
    if content_type.startswith("text/") or content_type in ("application/json", "application/xml"):
        return "text"
    if content_type.endswith(("+json", "+xml")):
        return "text"
    return None


def _charset(response: httpx.Response, body: bytearray) -> str:
    declared = response.charset_encoding
    if declared is None:
        meta = re.search(rb"""<meta[^>]+charset=["']?([\w-]+)""", body[:2048], re.IGNORECASE)
        declared = meta.group(1).decode("ascii") if meta else "utf-8"
    try:
        return codecs.lookup(declared).name
    except LookupError:
        return "utf-8"
