"""Hosts a setting lets through although they are not on the public internet
(`tools.exec.allow_hosts`): the entries as the config gives them, and how they match."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AllowedHost:
    """One `tools.exec.allow_hosts` entry: a host name or IP (as allow lists compare them:
    lower case, no trailing dot, no brackets), and a port (None: any)."""

    host: str
    port: int | None

    @classmethod
    def parse(cls, entry: str) -> AllowedHost:
        """`host`, `host:port`, `[v6]:port` or a bare IPv6 address.

        Raises:
            ValueError: the entry is empty or not one of those, or its port is not 1-65535.
        """
        text = entry.strip()
        host, port = text, ""
        if any(c in text for c in "/ @?#"):
            raise ValueError(f"{entry!r}: expected host, host:port or [ipv6]:port, not a URL")
        if text.startswith("["):
            host, _, rest = text[1:].partition("]")
            if rest and not rest.startswith(":"):
                raise ValueError(f"{entry!r}: expected [address]:port")
            port = rest[1:]
        elif text.count(":") == 1:
            host, port = text.split(":")
        host = host.strip().rstrip(".").lower()
        if not host or any(c in host for c in "/ @?#[]"):
            raise ValueError(f"{entry!r}: expected host, host:port or [ipv6]:port")
        if not port:
            return cls(host, None)
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535")
        return cls(host, int(port))

    @property
    def text(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    def matches(self, host: str, port: int) -> bool:
        return self.host == host and self.port in (None, port)
