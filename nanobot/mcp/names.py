"""The names MCP tools are offered to the model under: `<server>_<tool>`, made valid for the
model APIs (`[A-Za-z0-9_-]`, at most 64 characters) and unique within the server.

A clash the suffix cannot resolve (a server listing a tool whose own name is what another's
suffixed name becomes) is refused: `NameClash` names both tools.

Across servers the names cannot clash: a server's name (at most 40 characters) is a prefix
no other server's tools can have (the config refuses `a` beside `a_b`, and names that
built-in tools start with).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

MAX_NAME = 64
_INVALID = re.compile(r"[^A-Za-z0-9_-]")
_SUFFIX = 7  # "_" and 6 hex digits of the original name's hash


class NameClash(ValueError):
    """Two of a server's tools would be offered under one name; the message names both."""


def offered_names(server: str, tools: Iterable[str]) -> dict[str, str]:
    """The model's name for each of `server`'s `tools` (offered name -> the server's own).

    A name that had to change (characters replaced, or cut to MAX_NAME) and then meets
    another gets a suffix from its original's hash; names that need no change keep theirs.

    Raises:
        NameClash: a suffixed name is taken all the same.
    """
    wanted = list(dict.fromkeys(tools))
    plain = {tool: _valid(f"{server}_{tool}") for tool in wanted}
    taken: dict[str, str] = {}
    for tool in wanted:  # unchanged names first: they are what a user reads in the server's docs
        if plain[tool] == f"{server}_{tool}":
            taken[plain[tool]] = tool
    for tool in wanted:
        name = plain[tool]
        if taken.get(name) == tool:
            continue
        if name in taken or len(f"{server}_{tool}") > MAX_NAME:
            digest = hashlib.sha256(tool.encode()).hexdigest()[: _SUFFIX - 1]
            name = f"{name[: MAX_NAME - _SUFFIX]}_{digest}"
        if name in taken:
            raise NameClash(
                f"the tools {taken[name]!r} and {tool!r} of the MCP server {server} would both "
                f"be offered as {name}"
            )
        taken[name] = tool
    return taken


def _valid(name: str) -> str:
    return _INVALID.sub("_", name)[:MAX_NAME]
