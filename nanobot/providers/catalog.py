"""What litellm's model list says about a model: context window, prices, vision.

Read from the JSON file litellm ships (`model_prices_and_context_window_backup.json`, the
list litellm itself uses with LITELLM_LOCAL_MODEL_COST_MAP), found and read without importing
litellm: its import takes seconds, and the direct transport does not need it at all. The file
is read once, on the first lookup, and only the entries asked for are parsed (it is 3 MB of
JSON, some 4,000 models).
"""

from __future__ import annotations

import importlib.util
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

DEFAULT_CONTEXT_WINDOW = 32_000
DATA_FILE = "model_prices_and_context_window_backup.json"
# litellm writes the file with an indent of 4: a model's entry starts at such a line and ends
# at the first line that closes an object at the same depth.
_TOP_LEVEL = b"{\n    "
_END = b"\n    }"
_TIER = re.compile(r"input_cost_per_token_above_(\d+)(k?)_tokens")


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per token, with the higher rates some models charge for long prompts, and the
    rate of prompt tokens read from the provider's cache (`cached`; None: as `input`)."""

    input: float
    output: float
    # (threshold in prompt tokens, input rate, output rate), highest threshold first
    tiers: tuple[tuple[int, float, float], ...] = ()
    cached: float | None = None

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """The cost of a call; `cached_tokens` are part of `prompt_tokens`."""
        rates = (self.input, self.output)
        for threshold, tier_input, tier_output in self.tiers:
            if prompt_tokens > threshold:
                rates = (tier_input, tier_output)
                break
        cached = min(max(cached_tokens, 0), prompt_tokens) if self.cached is not None else 0
        cached_cost = cached * self.cached if self.cached is not None else 0.0
        return (prompt_tokens - cached) * rates[0] + cached_cost + completion_tokens * rates[1]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """The few facts nanobot uses about a model."""

    context_window: int = DEFAULT_CONTEXT_WINDOW
    prices: Prices | None = None  # None: the model is not priced (no cost is reported)
    vision: bool = False


UNKNOWN = ModelInfo()


class Catalog:
    """Lookups in one model list file; `Catalog.shipped()` is litellm's.

    Thread-safe (the provider prepares in a thread); each model is looked up once.
    """

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._data: bytes | None = None
        self._parsed: dict[str, Any] | None = None  # the whole file, if it is not laid out
        self._infos: dict[str, ModelInfo] = {}
        self._providers: dict[str, str | None] = {}
        self._lock = threading.Lock()

    @classmethod
    def shipped(cls) -> Catalog:
        """The list in litellm's installed package (an empty catalog if there is none)."""
        return cls(_shipped_path())

    def info(self, model: str) -> ModelInfo:
        """What the list says about `model`, as litellm finds it: the id itself, else the
        id without its provider prefix if that entry is the same provider's. `UNKNOWN` for a
        model the list does not have."""
        with self._lock:
            info = self._infos.get(model)
            if info is None:
                info = self._infos[model] = _info(self._lookup(model))
        return info

    def provider(self, key: str) -> str | None:
        """The `litellm_provider` of the list's entry named exactly `key`, or None (no such
        entry, or none said)."""
        with self._lock:
            if key not in self._providers:
                entry = self._entry(key)
                listed = entry.get("litellm_provider") if entry is not None else None
                self._providers[key] = listed if isinstance(listed, str) else None
            return self._providers[key]

    def _lookup(self, model: str) -> Mapping[str, Any] | None:
        entry = self._entry(model)
        if entry is None and "/" in model:
            provider, bare = model.split("/", 1)
            entry = self._entry(bare)
            if entry is not None and not _same_provider(entry.get("litellm_provider"), provider):
                entry = None
        return entry

    def _entry(self, key: str) -> Mapping[str, Any] | None:
        data = self._read()
        if self._parsed is not None:
            entry = self._parsed.get(key)
            return entry if isinstance(entry, Mapping) else None
        if '"' in key or "\\" in key:
            return None  # not a model id; it would need JSON escaping to be found
        start = data.find(b'\n    "' + key.encode() + b'": {')
        if start < 0:
            return None
        start = data.index(b"{", start)
        end = data.find(_END, start)
        try:
            entry = orjson.loads(data[start : end + len(_END)])
        except orjson.JSONDecodeError:
            logger.debug("model list {}: entry {!r} is not JSON", self._path, key)
            return None
        return entry if isinstance(entry, Mapping) else None

    def _read(self) -> bytes:
        if self._data is None:
            self._data = b""
            if self._path is not None:
                try:
                    self._data = self._path.read_bytes()
                except OSError as exc:
                    logger.warning("cannot read litellm's model list {}: {}", self._path, exc)
            if self._data and not self._data.startswith(_TOP_LEVEL):
                # Laid out otherwise than litellm writes it: parse it all, once.
                parsed = orjson.loads(self._data)
                self._parsed = parsed if isinstance(parsed, dict) else {}
            logger.debug("read litellm's model list {} ({} bytes)", self._path, len(self._data))
        return self._data


def litellm_data_dir() -> Path | None:
    """The directory of the installed litellm package, found without importing it."""
    spec = importlib.util.find_spec("litellm")
    locations = spec.submodule_search_locations if spec is not None else None
    return Path(next(iter(locations))) if locations else None


def _shipped_path() -> Path | None:
    directory = litellm_data_dir()
    return directory / DATA_FILE if directory is not None else None


def _same_provider(listed: object, provider: str) -> bool:
    """Whether an entry's `litellm_provider` is `provider` (or one of its kinds, as
    "vertex_ai-language-models" is vertex_ai's)."""
    return isinstance(listed, str) and (listed == provider or listed.startswith(provider + "-"))


def _info(entry: Mapping[str, Any] | None) -> ModelInfo:
    if entry is None:
        return UNKNOWN
    window = entry.get("max_input_tokens") or entry.get("max_tokens")
    return ModelInfo(
        context_window=int(window) if isinstance(window, (int, float)) else DEFAULT_CONTEXT_WINDOW,
        prices=_prices(entry),
        vision=entry.get("supports_vision") is True,
    )


def _prices(entry: Mapping[str, Any]) -> Prices | None:
    base_input, base_output = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
    if not isinstance(base_input, (int, float)) or not isinstance(base_output, (int, float)):
        return None
    tiers = []
    for key, value in entry.items():
        match = _TIER.fullmatch(key)
        if match is None or not isinstance(value, (int, float)):
            continue
        output = entry.get(f"output_cost_per_token_above_{match[1]}{match[2]}_tokens", base_output)
        threshold = int(match[1]) * (1000 if match[2] else 1)
        if isinstance(output, (int, float)):
            tiers.append((threshold, float(value), float(output)))
    cached = entry.get("cache_read_input_token_cost")
    return Prices(
        float(base_input),
        float(base_output),
        tuple(sorted(tiers, reverse=True)),
        float(cached) if isinstance(cached, (int, float)) else None,
    )
