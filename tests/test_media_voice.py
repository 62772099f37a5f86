"""Voice notes heard: the real litellm transcription API against the fake OpenAI server's
`/audio/transcriptions`, real audio made in the test, the limits, the failures, and the
transcript kept beside the note."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from nanobot.bus.events import Attachment
from nanobot.media.voice import NOT_SET_UP, Transcriber, TranscriptionSettings, clock
from nanobot.providers.provider import RetryPolicy
from nanobot.workspace import Workspace
from tests.fakes import audio
from tests.fakes.llm import AuthError, FakeLLM, RateLimit, ServerError

MODEL = "openai/whisper-1"


@pytest.fixture
def logs() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="DEBUG", format="{level} {message}")
    yield lines
    logger.remove(sink)


def note(tmp_path: Path, seconds: float = 2.0, name: str = "voice_7.ogg") -> Attachment:
    data = audio.ogg_opus(seconds)
    path = tmp_path / "inbox" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return Attachment("voice", path, "audio/ogg", len(data), seconds)


def transcriber(tmp_path: Path, fake: FakeLLM | None, **settings: object) -> Transcriber:
    options: dict[str, object] = {
        "model": MODEL,
        "api_base": fake.base_url if fake else None,
        "api_key": "test-key",
        "retry": RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02),
    }
    options.update(settings)
    return Transcriber(TranscriptionSettings(**options), Workspace(tmp_path))  # type: ignore[arg-type]


async def test_a_note_is_heard_and_its_transcript_kept(
    tmp_path: Path, fake_llm: FakeLLM, logs: list[str]
) -> None:
    voice = note(tmp_path)
    fake_llm.add_transcript(voice.path.read_bytes(), "remind me to call Anna at six")
    hear = transcriber(tmp_path, fake_llm, language="en")
    heard = await hear.hear(voice)
    assert (heard.text, heard.problem) == ("remind me to call Anna at six", None)
    (request,) = fake_llm.transcription_requests
    assert (request.language, request.sha256) == ("en", audio.digest(voice.path.read_bytes()))
    assert request.headers["Authorization"] == "Bearer test-key"
    kept = voice.path.with_name("voice_7.ogg.txt")
    assert kept.read_text() == "remind me to call Anna at six"
    # The words only at DEBUG; INFO says that a note was transcribed.
    info = [line for line in logs if line.startswith("INFO")]
    assert any("voice_7.ogg (0:02) transcribed by openai/whisper-1" in line for line in info)
    assert not any("Anna" in line for line in logs if not line.startswith("DEBUG"))
    # Heard again (a turn a crash cut short, taken up after the restart): not sent again.
    assert (await hear.hear(voice)).text == "remind me to call Anna at six"
    assert len(fake_llm.transcription_requests) == 1


async def test_a_transcript_older_than_its_note_is_not_taken(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    voice = note(tmp_path)
    kept = voice.path.with_name("voice_7.ogg.txt")
    kept.write_text("stale words")

    os.utime(kept, (1, 1))
    fake_llm.add_transcript(voice.path.read_bytes(), "fresh words")
    assert (await transcriber(tmp_path, fake_llm).hear(voice)).text == "fresh words"


async def test_transient_failures_are_retried_then_said(tmp_path: Path, fake_llm: FakeLLM) -> None:
    voice = note(tmp_path)
    fake_llm.add_transcript(voice.path.read_bytes(), "hello")
    fake_llm.script_for("whisper-1", ServerError(503), RateLimit(0))
    assert (await transcriber(tmp_path, fake_llm).hear(voice)).text == "hello"
    assert len(fake_llm.transcription_requests) == 3

    fake_llm.script_for("whisper-1", *[ServerError(500)] * 3)
    heard = await transcriber(tmp_path, fake_llm).hear(note(tmp_path, name="voice_8.ogg"))
    assert heard.text is None
    assert heard.problem == (
        "the transcription service is unavailable; please send it again in a few minutes"
    )
    assert not (tmp_path / "inbox" / "voice_8.ogg.txt").exists()


async def test_a_refused_key_is_not_retried(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.script_for("whisper-1", AuthError())
    heard = await transcriber(tmp_path, fake_llm).hear(note(tmp_path))
    assert heard.problem == "the transcription service refused its API key (transcription.api_key)"
    assert len(fake_llm.transcription_requests) == 1


async def test_the_limits_are_kept_before_anything_is_sent(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    long = note(tmp_path, seconds=400)
    heard = await transcriber(tmp_path, fake_llm).hear(long)
    assert heard.problem == "it is 6:40 long, and at most 5:00 is transcribed"
    big = await transcriber(tmp_path, fake_llm, max_bytes=100).hear(note(tmp_path, name="b.ogg"))
    assert big.problem is not None and big.problem.endswith("and at most 0 MB is transcribed")
    unset = await transcriber(tmp_path, None, model=None).hear(note(tmp_path, name="c.ogg"))
    assert unset.problem == NOT_SET_UP
    assert fake_llm.transcription_requests == []


async def test_a_note_that_is_gone_is_said(tmp_path: Path, fake_llm: FakeLLM) -> None:
    voice = note(tmp_path)
    voice.path.unlink()
    heard = await transcriber(tmp_path, fake_llm).hear(voice)
    assert heard.problem is not None and heard.problem.startswith("its file could not be read")


async def test_a_note_outside_the_workspace_is_not_read(tmp_path: Path, fake_llm: FakeLLM) -> None:
    voice = note(tmp_path / "elsewhere")
    heard = await transcriber(tmp_path / "workspace", fake_llm).hear(voice)
    assert heard.text is None
    assert fake_llm.transcription_requests == []


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0.4, "0:00"), (7, "0:07"), (125, "2:05"), (3723, "1:02:03")]
)
def test_a_notes_length_reads_as_a_clock(seconds: float, shown: str) -> None:
    assert clock(seconds) == shown
