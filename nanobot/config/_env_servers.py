"""MCP servers from the environment: `NANOBOT_MCP__SERVERS__<NAME>__<KEY>[__<ENTRY>]`.

pydantic-settings lowercases every part of a variable's name, which is right for keys and
wrong below `mcp.servers`: a server's `env` passes variable names on (`GITHUB_TOKEN` is not
`github_token`), and a server's name is the user's own (`GitHub` in the file). So these
variables are read here, with the case of the names below a server kept, and merged over the
file's servers; the settings tree's environment source leaves `mcp.servers` alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from nanobot.config.mcp import McpServerConfig
from nanobot.errors import ConfigError

PREFIX = "NANOBOT_MCP__SERVERS"
_SECTION = "NANOBOT_MCP"

# The keys of a server that map names to values, set one entry per variable.
_MAPS = ("env", "headers", "approval_tools")


def servers_from_env(env: Mapping[str, str], file_servers: object) -> dict[str, dict[str, Any]]:
    """The servers the variables set, each a mapping of its keys, to merge over the file's.

    A variable's server name is matched to the file's servers without regard to case, `_`
    standing for `-` too (a variable's name has no `-`); a name no server of the file has is
    a new server, in lower case. A whole server or all of them may be given as JSON
    (`NANOBOT_MCP__SERVERS__<NAME>='{"url": ...}'`, `NANOBOT_MCP__SERVERS='{...}'`).

    Raises:
        ConfigError: a variable names no key of a server, a list or mapping is not JSON, or
            its server name matches two of the file's.
    """
    names = [str(name) for name in file_servers] if isinstance(file_servers, Mapping) else []
    found: dict[str, dict[str, Any]] = {}
    for variable in sorted(env):  # the whole before its parts, so a part lands over it
        value = env[variable]
        if variable in (_SECTION, PREFIX):
            whole = _json_object(variable, value)
            if variable == _SECTION:  # the section's other keys are pydantic-settings' own
                whole = whole.get("servers") or {}
                if not isinstance(whole, dict):
                    raise ConfigError(f"environment variable {variable}: servers is not an object")
            for name, each in whole.items():
                _merge(found.setdefault(_server_name(variable, str(name), names), {}), each)
            continue
        if not variable.startswith(PREFIX + "__"):
            continue
        parts = variable[len(PREFIX) + 2 :].split("__")
        server = found.setdefault(_server_name(variable, parts[0], names), {})
        if len(parts) == 1:
            _merge(server, _json_object(variable, value))
            continue
        _set(server, variable, parts[1:], value)
    return found


def _set(server: dict[str, Any], variable: str, keys: list[str], value: str) -> None:
    """Set what `variable`'s name below its server (`keys`) names to `value`."""
    key = keys[0].lower()
    if key not in McpServerConfig.model_fields or len(keys) > 2:
        raise ConfigError(
            f"environment variable {variable}: unknown key (a server takes "
            f"NANOBOT_MCP__SERVERS__<NAME>__<KEY>, and its {', '.join(_MAPS)} "
            "one entry at a time: NANOBOT_MCP__SERVERS__<NAME>__ENV__<VARIABLE>)"
        )
    if len(keys) == 2:
        if key not in _MAPS:
            raise ConfigError(f"environment variable {variable}: {key} has no entries")
        if not isinstance(server.get(key), dict):
            server[key] = {}
        server[key][keys[1]] = value
    elif key in _MAPS:
        server[key] = _json_object(variable, value)
    elif key in ("args", "tools"):
        server[key] = _json_list(variable, value)
    else:
        server[key] = value


def merged(file_servers: object, env_servers: dict[str, dict[str, Any]]) -> object:
    """The file's servers with the environment's over them, key by key and entry by entry."""
    if not env_servers:
        return file_servers
    servers: dict[str, Any] = dict(file_servers) if isinstance(file_servers, Mapping) else {}
    for name, server in env_servers.items():
        base = servers.get(name)
        servers[name] = {**base} if isinstance(base, Mapping) else {}
        _merge(servers[name], server)
    return servers


def _server_name(variable: str, given: str, names: list[str]) -> str:
    if given in names:
        return given
    matches = [n for n in names if n.lower().replace("-", "_") == given.lower()]
    if len(matches) > 1:
        raise ConfigError(
            f"environment variable {variable}: the servers {' and '.join(matches)} both "
            "answer to this name; rename one"
        )
    return matches[0] if matches else given.lower()


def _merge(into: dict[str, Any], over: Mapping[str, Any]) -> None:
    for key, value in over.items():
        if key in _MAPS and isinstance(value, Mapping) and isinstance(into.get(key), Mapping):
            into[key] = {**into[key], **value}
        else:
            into[key] = value


def _json_object(variable: str, value: str) -> dict[str, Any]:
    decoded = _json(variable, value, 'a JSON object, e.g. \'{"url": "https://..."}\'')
    if not isinstance(decoded, dict):
        raise ConfigError(f"environment variable {variable}: must be a JSON object")
    return decoded


def _json_list(variable: str, value: str) -> list[Any]:
    decoded = _json(variable, value, 'a JSON list, e.g. \'["--flag", "value"]\'')
    if not isinstance(decoded, list):
        raise ConfigError(f"environment variable {variable}: must be a JSON list")
    return decoded


def _json(variable: str, value: str, expected: str) -> object:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"environment variable {variable}: not valid JSON ({exc.msg} at character "
            f"{exc.pos}); it must be {expected}"
        ) from None
