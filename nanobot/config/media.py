"""The sections for what people send besides text, and for spoken replies: `transcription`
(voice notes to text), `documents` (text out of PDFs, office files and text files) and `tts`
(replies read aloud, sent as voice notes)."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from nanobot.config._section import Section
from nanobot.config.agent import base_advice, model_advice

MB = 1024 * 1024


def _model(model: str | None) -> str | None:
    if model is None or not model.strip():
        return None  # unset, as an empty variable in the environment says
    advice = model_advice(model)
    if advice is not None:
        raise ValueError(advice[0])
    return model.strip()


def _base(url: str | None) -> str | None:
    if url is None or not url.strip():
        return None
    advice = base_advice(url)
    if advice is not None:
        raise ValueError(advice[0])
    return url.strip()


class _Endpoint(Section):
    """A model reached through litellm: `api_key` None is the provider's own variable
    (`OPENAI_API_KEY`, `GROQ_API_KEY`, ...)."""

    model: str | None = None
    api_base: str | None = None
    api_key: SecretStr | None = None
    timeout: float = Field(120, gt=0)  # seconds per request

    _check_model = field_validator("model")(_model)
    _check_base = field_validator("api_base")(_base)


class TranscriptionConfig(_Endpoint):
    """Voice notes and audio to text. No `model`: they are kept, and the sender is told how
    to turn transcription on."""

    language: str | None = None  # ISO-639-1 ("en"); None: the model guesses
    max_seconds: float = Field(300, gt=0)
    max_bytes: int = Field(20 * MB, gt=0)


class DocumentsConfig(Section):
    """Text out of the files people send: how much goes into the turn, and the bounds on
    reading one."""

    enabled: bool = True
    max_chars: int = Field(16_000, ge=500)  # of a document's text in the turn
    timeout: float = Field(30, gt=0)  # seconds to read one
    max_memory_mb: int = Field(1024, ge=64)  # the reader's address space
    max_expanded_mb: int = Field(200, ge=1)  # what an office file (a zip) may expand to
    max_parallel: int = Field(2, ge=1, le=32)  # documents read at once, in every chat


class TtsConfig(_Endpoint):
    """Replies read aloud through litellm's speech API, where a chat asks for them
    (`channels.<name>.voice_replies`, `/voice`). No `model`: replies are text only."""

    voice: str = "alloy"
    max_chars: int = Field(1500, ge=100, le=4096)  # of a reply spoken; the rest is text only

    @field_validator("voice")
    @classmethod
    def _named(cls, voice: str) -> str:
        if not voice.strip():
            raise ValueError("must name a voice (e.g. alloy)")
        return voice.strip()
