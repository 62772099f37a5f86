"""Voice notes heard as text: a transcription model through litellm, within the limits set.

What a person says in a voice note is their message. It is transcribed once: the transcript
is kept next to the audio (`<file>.txt`), so a turn that a crash interrupted, taken up again
after the restart, does not pay for it twice. The transcript's words are logged at DEBUG
only; INFO says that a transcription happened.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from loguru import logger

from nanobot.bus.events import Attachment
from nanobot.errors import ProviderError, ProviderErrorKind
from nanobot.providers.litellm_provider import transcribe
from nanobot.providers.provider import RetryPolicy, retried
from nanobot.workspace import Workspace

MB: Final = 1024 * 1024
NOT_SET_UP: Final = (
    "voice notes need `transcription.model` in the config (README: Voice notes and documents)"
)


_FAILED: Final[dict[ProviderErrorKind, str]] = {
    "rate_limited": "the transcription service is rate-limiting me; please send it again in a "
    "minute",
    "unavailable": "the transcription service is unavailable; please send it again in a few "
    "minutes",
    "timeout": "the transcription service took too long; please send it again",
    "auth": "the transcription service refused its API key (transcription.api_key)",
    "bad_request": "the transcription service refused the file; the details are in the log",
    "context_overflow": "the transcription service refused the file as too long",
}


@dataclass(frozen=True, slots=True)
class TranscriptionSettings:
    """`model` None: nothing is transcribed, and the sender is told how to turn it on.
    `api_key` None: the provider's own variable. `max_total`: seconds for one note, its
    retries included."""

    model: str | None = None
    api_key: str | None = None
    api_base: str | None = None
    language: str | None = None
    max_seconds: float = 300.0
    max_bytes: int = 20 * MB
    timeout: float = 120.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_total: float = 180.0


@dataclass(frozen=True, slots=True)
class Heard:
    """A note's transcript, or (`text` None) why there is none: words for its sender that
    complete "I could not transcribe your voice note: …"."""

    text: str | None
    problem: str | None = None


class Transcriber:
    """Turns voice notes and audio files into text. Cancellable at any await (the call is
    dropped; nothing is kept)."""

    def __init__(self, settings: TranscriptionSettings, workspace: Workspace) -> None:
        """`workspace`: where the notes are (the inbox in it); they are read, and their
        transcripts written, confined to it."""
        self._settings = settings
        self._workspace = workspace

    @property
    def model(self) -> str | None:
        return self._settings.model

    async def hear(self, attachment: Attachment) -> Heard:
        """The transcript of `attachment` (saved already), or why there is none. Never
        raises for the note or the provider: each failure is a `Heard` with its reason."""
        settings = self._settings
        if settings.model is None:
            return Heard(None, NOT_SET_UP)
        if attachment.duration is not None and attachment.duration > settings.max_seconds:
            longest = clock(settings.max_seconds)
            length = clock(attachment.duration)
            return Heard(None, f"it is {length} long, and at most {longest} is transcribed")
        if attachment.size > settings.max_bytes:
            most = f"{settings.max_bytes / MB:.0f} MB"
            size = f"{attachment.size / MB:.1f} MB"
            return Heard(None, f"it is {size}, and at most {most} is transcribed")
        kept = _transcript_path(attachment.path)
        try:
            audio, cached = await asyncio.to_thread(self._read, attachment.path, kept)
            if cached is not None:
                logger.info("voice note {}: transcribed before, kept", attachment.path.name)
                return Heard(cached)
        except OSError as exc:
            logger.warning("voice note {} could not be read: {}", attachment.path, exc)
            return Heard(None, f"its file could not be read ({exc.strerror or exc})")
        return await self._transcribed(attachment, audio, kept)

    def _read(self, audio: Path, kept: Path) -> tuple[bytes, str | None]:
        """The note's bytes, and the transcript kept for it if one is there (not older)."""
        fd, info = self._workspace.open_file(audio)
        with os.fdopen(fd, "rb") as file:
            data = file.read()
        try:
            kept_fd, kept_info = self._workspace.open_file(kept)
        except FileNotFoundError:
            return data, None
        with os.fdopen(kept_fd, "rb") as file:
            text = file.read().decode("utf-8", "replace")
        return data, text if kept_info.st_mtime >= info.st_mtime else None

    async def _transcribed(self, attachment: Attachment, audio: bytes, kept: Path) -> Heard:
        settings = self._settings
        assert settings.model is not None
        model = settings.model
        started = time.monotonic()
        try:
            text = await retried(
                lambda: transcribe(
                    model,
                    audio,
                    attachment.path.name,
                    api_key=settings.api_key,
                    api_base=settings.api_base,
                    language=settings.language,
                    seconds=settings.timeout,
                ),
                settings.retry,
                started + settings.max_total,
                f"transcription {model}",
            )
        except ProviderError as exc:
            logger.warning("voice note {}: transcription failed: {}", attachment.path.name, exc)
            return Heard(None, _FAILED[exc.kind])
        logger.info(
            "voice note {} ({}) transcribed by {} in {:.1f}s: {} characters",
            attachment.path.name,
            clock(attachment.duration) if attachment.duration is not None else "length unknown",
            model,
            time.monotonic() - started,
            len(text),
        )
        logger.debug("transcript of {}: {}", attachment.path.name, text)
        try:
            await asyncio.to_thread(self._workspace.replace, kept, text.encode())
        except OSError as exc:  # the turn goes on; a restart would transcribe it again
            logger.warning("the transcript of {} was not kept: {}", attachment.path.name, exc)
        return Heard(text)


def clock(seconds: float) -> str:
    """`seconds` as people read a note's length: 0:07, 2:05, 1:02:03."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _transcript_path(audio: Path) -> Path:
    return audio.with_name(audio.name + ".txt")
