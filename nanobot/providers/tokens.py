"""Counting the tokens of chat messages with tiktoken, offline.

The accounting is litellm's `token_counter` for OpenAI-format messages (3 tokens a message,
every string field, 1 more for a name, tool call arguments, 85 for an image at "auto"
detail, 3 to prime the reply), so a window holds what it held when litellm counted. The
encoding is the model's where tiktoken knows it (o200k_base for gpt-4o, …), else
cl100k_base: other vendors' tokenizers differ, and the window keeps a margin for that.

An encoding costs 40–75 MiB of memory and a few hundred ms to load, and most windows are
far below their budget: until a count must be exact (`load`), `count` answers an upper bound
instead, the text's UTF-8 bytes (a token is at least one byte), which decides "it fits" as
well as the exact count would.

tiktoken downloads an encoding the first time it is asked for one. It must not here: the
files come from litellm's package, which ships them for the same reason (and points
TIKTOKEN_CACHE_DIR at them when imported; this module does the same, without importing
litellm). Where a file is missing, tokens are estimated from the length of the text.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from loguru import logger

from nanobot.providers.base import Message
from nanobot.providers.catalog import litellm_data_dir

PER_MESSAGE = 3  # <|start|>{role}\n{content}<|end|>\n
PER_NAME = 1
REPLY_PRIMING = 3  # <|start|>assistant<|message|>
IMAGE = 85  # an image at "auto" detail, as litellm counts it without fetching it
CHUNK = 1024  # tiktoken's merge loop is quadratic in one piece's length: encode in chunks
CHARS_PER_TOKEN = 4  # the estimate, without an encoding
FALLBACK_ENCODING = "cl100k_base"
# tiktoken caches `{url}` under sha1(url); litellm ships these files named so.
_BLOB = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"
_FILES = {"cl100k_base": "cl100k_base", "o200k_base": "o200k_base", "p50k_base": "p50k_base"}
_FILES["o200k_harmony"] = "o200k_base"  # o200k_base's vocabulary plus special tokens

Count = Callable[[str], int]


class TokenCounter:
    """Counts tokens of messages for one model: exactly once `load` has loaded the encoding
    (a few hundred ms: call it off the event loop), an upper bound before. Thread-safe."""

    def __init__(self, model: str, tokenizers: Path | None = None) -> None:
        """`tokenizers`: where the encoding files are; litellm's package by default."""
        self._model = model
        self._tokenizers = tokenizers
        self._count: Count | None = None
        self._lock = threading.Lock()

    def load(self) -> bool:
        """Load the encoding now, so that counts are exact from now on; whether it was not
        loaded before (the counts made until now were bounds). Blocking; idempotent."""
        with self._lock:
            if self._count is not None:
                return False
            self._count = _counter(self._model, self._tokenizers)
            return True

    @property
    def exact(self) -> bool:
        """Whether counts are exact (the encoding is loaded), not bounds."""
        return self._count is not None

    def count(self, messages: Sequence[Message]) -> int:
        """The tokens `messages` take: exactly once loaded, else at least as many."""
        count = self._count or _bound
        total = REPLY_PRIMING
        for message in messages:
            total += PER_MESSAGE
            for key, value in message.items():
                if isinstance(value, str):
                    total += count(value) + (PER_NAME if key == "name" else 0)
                elif key == "tool_calls" and isinstance(value, list):
                    total += sum(
                        count(str(call["function"].get("arguments", ""))) for call in value
                    )
                elif key == "content" and isinstance(value, list):
                    total += _parts(value, count)
        return total


def _parts(parts: list[object], count: Count) -> int:
    total = 0
    for part in parts:
        if isinstance(part, str):
            total += count(part)
        elif isinstance(part, dict):
            if part.get("type") in ("image_url", "image"):
                total += IMAGE
            else:
                total += count(str(part.get("text", "")))
    return total


def encoding_name(model: str) -> str:
    """The tiktoken encoding of `model` (its id without a provider prefix), if one is
    shipped; else cl100k_base."""
    import tiktoken

    try:
        name = tiktoken.encoding_name_for_model(model.rsplit("/", 1)[-1])
    except KeyError:
        return FALLBACK_ENCODING
    return name if name in _FILES else FALLBACK_ENCODING


def _counter(model: str, tokenizers: Path | None) -> Count:
    name = encoding_name(model)
    directory = tokenizers or _shipped_tokenizers()
    url = _BLOB.format(_FILES[name])
    if directory is None or not (directory / hashlib.sha1(url.encode()).hexdigest()).is_file():
        logger.debug(
            "no {} file in {} (from litellm's package): tokens of {} are estimated, "
            "{} characters a token",
            name,
            directory,
            model,
            CHARS_PER_TOKEN,
        )
        return _estimate
    import tiktoken

    os.environ["TIKTOKEN_CACHE_DIR"] = str(directory)
    encoding = tiktoken.get_encoding(name)
    encode = encoding.encode_ordinary

    def count(text: str) -> int:
        if len(text) <= CHUNK:
            return len(encode(text))
        return sum(len(encode(text[i : i + CHUNK])) for i in range(0, len(text), CHUNK))

    return count


def _bound(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _estimate(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def _shipped_tokenizers() -> Path | None:
    """litellm's tokenizer files, or CUSTOM_TIKTOKEN_CACHE_DIR as litellm would take."""
    custom = os.environ.get("CUSTOM_TIKTOKEN_CACHE_DIR")
    if custom:
        return Path(custom)
    package = litellm_data_dir()
    return package / "litellm_core_utils" / "tokenizers" if package is not None else None
