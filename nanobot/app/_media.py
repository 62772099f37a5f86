"""The reader of what people send besides text, built from `transcription` and `documents`."""

from __future__ import annotations

from nanobot.config import Config
from nanobot.media.documents import DocumentLimits
from nanobot.media.reading import Reader
from nanobot.media.voice import Transcriber, TranscriptionSettings
from nanobot.providers.provider import RetryPolicy
from nanobot.workspace import Workspace

MB = 1024 * 1024


def build_reader(config: Config) -> Reader:
    """Voice notes heard with `transcription.model` (retried as model calls are, within the
    agent's retry budget on top of a request's time), documents read unless
    `documents.enabled` is false."""
    heard, documents, agent = config.transcription, config.documents, config.agent
    settings = TranscriptionSettings(
        model=heard.model,
        api_key=heard.api_key.get_secret_value() if heard.api_key else None,
        api_base=heard.api_base,
        language=heard.language,
        max_seconds=heard.max_seconds,
        max_bytes=heard.max_bytes,
        timeout=heard.timeout,
        retry=RetryPolicy(attempts=agent.max_retries, max_total=agent.retry_max_seconds),
        max_total=heard.timeout + agent.retry_max_seconds,
    )
    limits = (
        DocumentLimits(
            max_chars=documents.max_chars,
            timeout=documents.timeout,
            max_memory_bytes=documents.max_memory_mb * MB,
            max_expanded_bytes=documents.max_expanded_mb * MB,
        )
        if documents.enabled
        else None
    )
    return Reader(Transcriber(settings, Workspace(config.workspace_path)), limits)
