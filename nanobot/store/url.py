"""Where the state lives, as `store.url` says it: `sqlite:///<path>` or `postgresql://…`.

A PostgreSQL URL may carry a password (`postgresql://user:secret@host/db`, or
`?password=secret`); `redact` is the only form of it that reaches a message or a log line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from nanobot.errors import StoreError

Backend = Literal["sqlite", "postgresql"]

SQLITE_PREFIX: Final = "sqlite:///"
POSTGRES_SCHEMES: Final = ("postgresql", "postgres")
HIDDEN: Final = "***"

_SCHEME: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def backend(url: str) -> Backend:
    """Which backend `url` names. Raises `StoreError` (naming only the scheme, never the
    rest, which may hold a password) for anything else."""
    if url.startswith(SQLITE_PREFIX):
        return "sqlite"
    match = _SCHEME.match(url)
    scheme = match.group(1).lower() if match else ""
    if scheme in POSTGRES_SCHEMES:
        return "postgresql"
    if scheme == "sqlite":
        raise StoreError(
            "a SQLite store URL is sqlite:/// and the file's absolute path, "
            "e.g. sqlite:///home/me/.nanobot/state.db"
        )
    shown = f"{scheme}://…" if scheme else "a value without a scheme"
    raise StoreError(
        f"unsupported store URL ({shown}): use sqlite:///<absolute path> or "
        "postgresql://user:password@host:port/database"
    )


def sqlite_path(url: str) -> Path:
    """The file a `sqlite:///` URL names: `sqlite:///home/me/state.db` is
    /home/me/state.db, and `sqlite:///~/state.db` is in the home directory."""
    if backend(url) != "sqlite":
        raise StoreError(f"not a SQLite store URL: {redact(url)}")
    path = url.removeprefix(SQLITE_PREFIX)
    if path.startswith("~"):
        return Path(path).expanduser()
    return Path("/" + path.lstrip("/"))


def redact(url: str) -> str:
    """`url` with its password, if any, replaced by `***` (in the user part and in a
    `password=` query parameter); anything but a PostgreSQL URL is returned as it is."""
    if not url.lower().startswith(tuple(f"{s}:" for s in POSTGRES_SCHEMES)):
        return url
    try:
        parts = urlsplit(url)
    except ValueError:  # unparseable: show nothing of what might be secret
        return f"{url.split(':', 1)[0]}://{HIDDEN}"
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        if ":" in user:
            user = user.split(":", 1)[0] + ":" + HIDDEN
        netloc = f"{user}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(key.lower() == "password" for key, _ in pairs):
            pairs = [(k, HIDDEN if k.lower() == "password" else v) for k, v in pairs]
            query = urlencode(pairs, safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def password(url: str) -> str | None:
    """The password in a PostgreSQL `url` (to scrub from driver messages), if it has one."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.password:
        return parts.password
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key.lower() == "password" and value:
            return value
    return None
