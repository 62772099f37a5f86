"""The reader of what people send besides text, built from `transcription` and `documents`;
the speaker of replies and the chats' choice of them, from `tts` and `voice_replies`."""

from __future__ import annotations

from nanobot.config import Config
from nanobot.media.documents import DocumentLimits
from nanobot.media.reading import Reader
from nanobot.media.speech import SPOKEN_CHANNELS, Speaker, SpeechSettings, VoiceReplies
from nanobot.media.voice import Transcriber, TranscriptionSettings
from nanobot.providers.provider import RetryPolicy
from nanobot.store import Database
from nanobot.store.chats import ChatSettings
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
    transcriber = Transcriber(settings, Workspace(config.workspace_path))
    return Reader(transcriber, limits, parallel=documents.max_parallel)


def build_speaker(config: Config) -> Speaker | None:
    """Replies read aloud with `tts.model` (retried as model calls are); None without one."""
    tts, agent = config.tts, config.agent
    if tts.model is None:
        return None
    settings = SpeechSettings(
        model=tts.model,
        voice=tts.voice,
        api_key=tts.api_key.get_secret_value() if tts.api_key else None,
        api_base=tts.api_base,
        timeout=tts.timeout,
        max_chars=tts.max_chars,
        retry=RetryPolicy(attempts=agent.max_retries, max_total=agent.retry_max_seconds),
        max_total=tts.timeout + agent.retry_max_seconds,
    )
    return Speaker(settings, Workspace(config.workspace_path))


def build_voices(config: Config, db: Database) -> VoiceReplies | None:
    """Which replies are spoken: each chat's `/voice`, else its channel's `voice_replies`;
    None without `tts.model` (no reply is)."""
    if config.tts.model is None:
        return None
    defaults = {name: getattr(config.channels, name).voice_replies for name in SPOKEN_CHANNELS}
    return VoiceReplies(ChatSettings(db), defaults)
