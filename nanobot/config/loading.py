"""Loading the configuration: finding the file, reading its YAML and the environment, saying
what is wrong with either (`ConfigError`), and the warning for a file others may read."""

from __future__ import annotations

import json
import os
import stat
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_settings import SettingsError

from nanobot.config._env_servers import PREFIX as SERVERS_PREFIX
from nanobot.config._env_servers import merged, servers_from_env
from nanobot.config.tree import DEFAULT_DATA_DIR, ENV_PREFIX, Config
from nanobot.errors import ConfigError

ENV_CONFIG_PATH = "NANOBOT_CONFIG"
DEFAULT_CONFIG_PATH = DEFAULT_DATA_DIR / "config.yaml"


def config_path(explicit: Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """Where the config file is: explicit path, else $NANOBOT_CONFIG, else the default."""
    env = os.environ if env is None else env
    if explicit is not None:
        return explicit.expanduser()
    if env.get(ENV_CONFIG_PATH):
        return Path(env[ENV_CONFIG_PATH]).expanduser()
    return DEFAULT_CONFIG_PATH.expanduser()


def load(path: Path | None = None) -> Config:
    """Load the configuration from the file (see `config_path`) and the environment.

    A missing file at the default location means "all defaults"; a missing file that was
    named explicitly (argument or $NANOBOT_CONFIG) is an error.

    Raises:
        ConfigError: the file cannot be read or parsed, or a key is unknown or invalid. The
            message names the file (or environment variable), the key path and the reason.
    """
    named = path is not None or bool(os.environ.get(ENV_CONFIG_PATH))
    file = config_path(path)
    data = _read_yaml(file, must_exist=named)
    _check_env_names(os.environ)
    given = data
    mcp = data.get("mcp")
    servers = servers_from_env(os.environ, mcp.get("servers") if isinstance(mcp, Mapping) else None)
    if servers:
        mcp = dict(mcp) if isinstance(mcp, Mapping) else {}
        data = {**data, "mcp": {**mcp, "servers": merged(mcp.get("servers"), servers)}}
    try:
        config = Config(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, file)) from None
    except SettingsError as exc:  # a variable `_check_env_names` let through
        raise ConfigError(f"environment: {exc}") from None
    _check_workspace(config, file)
    config._source = file
    config._file_secrets = _secrets_in(config, given)
    return config


def exposed(config: Config) -> str | None:
    """The start-up warning for a config file that sets a secret and that others than its
    owner may read or write: one line naming the file, its mode, the keys and the fix
    (`chmod 600 FILE`). None when it is private, sets no secret, or was not read from a file.

    nanobot warns and leaves the mode alone: the file is the user's, who may share it with a
    group on purpose, manage it with a tool that would set it back, or mount it read-only (as
    Docker and Kubernetes secrets are). The files nanobot writes itself are created private
    (`nanobot onboard`'s config 0600; the data dir 0700, tightened at every start).
    """
    file = config.source
    if file is None or not config._file_secrets:
        return None
    try:
        mode = stat.S_IMODE(file.stat().st_mode)
    except OSError:
        return None
    if not mode & 0o066:
        return None
    access = " and ".join(
        word for bits, word in ((0o044, "read"), (0o022, "changed")) if mode & bits
    )
    who = " and ".join(
        word for bits, word in ((0o060, "its group"), (0o006, "anyone")) if mode & bits
    )
    return (
        f"{file} holds secrets ({', '.join(config._file_secrets)}) and can be {access} by "
        f"{who} (mode {mode:04o}): run `chmod 600 {file}`"
    )


def _is_secret(text: str) -> bool:
    """Whether a secret's value gives anything away: a URL without a password (a SQLite
    store's path) does not."""
    if "://" in text:
        try:
            return urlsplit(text).password is not None
        except ValueError:
            return True
    return bool(text)


def _secrets_in(model: BaseModel, data: Mapping[str, Any], prefix: str = "") -> tuple[str, ...]:
    """The key paths of the secrets in `model` that `data` (the file's mapping) sets."""
    found: list[str] = []
    for name in type(model).model_fields:
        given = data.get(name)
        if given is None:
            continue
        value = getattr(model, name)
        if isinstance(value, SecretStr) and _is_secret(value.get_secret_value()):
            found.append(f"{prefix}{name}")
        elif isinstance(value, BaseModel) and isinstance(given, Mapping):
            found += _secrets_in(value, given, f"{prefix}{name}.")
    return tuple(found)


def _check_workspace(config: Config, file: Path) -> None:
    """The workspace is what the agent may read: it must not hold nanobot's own secrets."""
    workspace = config.workspace_path.resolve()
    for what, path in (("data_dir", config.data_dir), ("the config file", file)):
        if path.resolve().is_relative_to(workspace):
            raise ConfigError(
                f"{file}: invalid configuration\n  workspace: {config.workspace_path} holds "
                f"{what} ({path}), so the agent could read nanobot's state and secrets; "
                "choose a workspace folder that holds neither"
            )


def _read_yaml(file: Path, *, must_exist: bool) -> dict[str, Any]:
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        if must_exist:
            raise ConfigError(f"{file}: config file not found") from None
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read config file: {exc}") from None
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader: no arbitrary objects
    except _DuplicateKey as exc:
        raise ConfigError(
            f"{file}: line {exc.line}: key {exc.key!r} is set twice (first at line "
            f"{exc.first}); YAML would silently keep only the last: remove one"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(f"{file}: the top level must be a mapping of keys, not a {kind}")
    return data


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, line: int, first: int) -> None:
        super().__init__(f"duplicate key {key!r} at line {line}")
        self.key, self.line, self.first = key, line, first


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key set twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges; keys it brings may be overridden
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                first = lines.get(key)
            except TypeError:  # unhashable: the safe loader's own error follows
                continue
            if first is not None:
                raise _DuplicateKey(key, line, first)
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


def _check_env_names(env: Mapping[str, str]) -> None:
    """Every NANOBOT_* variable names a key, and one for a list or a section holds JSON.

    pydantic-settings ignores variables that match no field (a typo such as
    NANOBOT_AGENT_MODEL, one underscore, would be silently dropped), and fails on a list
    or section that is not JSON with a traceback naming neither the variable nor the form.
    """
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG_PATH:
            continue
        if name == SERVERS_PREFIX or name.startswith(
            SERVERS_PREFIX + "__"
        ):  # read with their case kept: `servers_from_env`
            continue
        model: type[BaseModel] | None = Config
        annotation: object = None
        for part in name[len(ENV_PREFIX) :].lower().split("__"):
            fields = {f.alias or n: f for n, f in model.model_fields.items()} if model else {}
            field = fields.get(part)
            if field is None:
                raise ConfigError(
                    f"environment variable {name}: unknown key (nested keys are separated "
                    "by a double underscore, e.g. NANOBOT_AGENT__MODEL)"
                )
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                model = annotation
            else:
                model = None
        _check_json(name, value, annotation)


# The variables of lists of platform user ids (`allow_from`, `approvers`).
_USER_LISTS = ("__ALLOW_FROM", "__APPROVERS")


def _check_json(name: str, value: str, annotation: object) -> None:
    """A list or a section set by variable `name` must be JSON (as pydantic-settings reads
    it); if it is not, say which form is expected, with an example."""
    if not value:
        return  # not decoded: pydantic reports the empty value with the key
    if get_origin(annotation) in (Union, types.UnionType):  # X | None
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        annotation = inner[0] if len(inner) == 1 else None
    if get_origin(annotation) in (list, set, tuple, frozenset):
        items = [item.strip().strip("'\"") for item in value.strip().strip("[]").split(",")]
        if name.endswith(_USER_LISTS):  # numeric ids only: "@alice" would be refused next
            items = [i for i in items if i == "*" or i.lstrip("-").isdigit()] or ["123456789"]
        expected = f"a JSON list, e.g. {name}='{json.dumps([i for i in items if i])}'"
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        key = next(iter(annotation.model_fields))
        expected = (
            f"a JSON object, e.g. {name}='{{\"{key}\": ...}}', or set one key at a time: "
            f"{name}__{key.upper()}=..."
        )
    else:
        return
    try:
        json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"environment variable {name}: not valid JSON ({exc.msg} at character {exc.pos}); "
            f"it must be {expected}"
        ) from None


def _describe(exc: ValidationError, file: Path) -> str:
    # Named only where it exists: a wrong variable alone must not send one to a missing file.
    source = str(file) if file.exists() else f"the environment (no config file at {file})"
    lines = [f"{source}: invalid configuration"]
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        reason = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        reason = reason.removeprefix("Value error, ")  # pydantic's prefix for our own checks
        env_name = ENV_PREFIX + "__".join(str(part) for part in error["loc"]).upper()
        origin = f" (from environment variable {env_name})" if env_name in os.environ else ""
        lines.append(f"  {key}: {reason}{origin}")
    return "\n".join(lines)
