"""``bench/media.py``, part one: what nanobot adds to the transcription of a voice note.

Two ways of hearing the same note, against the same fake transcription server (a process
of its own: ``python -m tests.fakes.llm``, answering at once), interleaved in a shuffled
order every round:

- **bare**: ``litellm.atranscription`` with the note's bytes, exactly the arguments nanobot
  passes (``file=(name, bytes)``, ``max_retries=0``, ``timeout``, ``api_base``, ``api_key``);
- **nanobot**: ``Reader.read("", [note])``, the path a message with a voice note takes in
  the dispatcher: the note read from the inbox (confined to the workspace, off the event
  loop), no transcript kept for it yet, the call through the provider's retry loop, the
  transcript kept beside the note (``<note>.txt``, written whole), the turn's text built.
  Every round saves a new note (unmeasured), so no round finds a kept transcript.

Each measurement lasts until the call returned and the tasks it started (litellm's logging)
have finished. Wall time and this process's CPU time (all threads) are recorded; nanobot's
added time is the median over rounds of (nanobot - bare) in the same round.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import REPO_ROOT, BenchError, isolated_env
from bench._gateway import Child
from nanobot.bus.events import Attachment
from nanobot.media.reading import Reader
from nanobot.media.voice import Transcriber, TranscriptionSettings
from nanobot.providers.litellm_provider import _litellm
from nanobot.workspace import Workspace
from tests.fakes import audio

MODEL = "openai/whisper-1"
NOTE_SECONDS = 15.0  # a typical voice note
TRANSCRIPT = "Could you move my dentist appointment to Thursday afternoon, please?"
API_KEY = "sk-bench-not-a-secret"
TIMEOUT_S = 120.0  # transcription.timeout's default: litellm's HTTP timeout per request
SETTLE_LIMIT_S = 2.0  # the longest wait for the tasks a measured call started


@dataclass
class VoiceSamples:
    """Seconds per round, in round order (the warm-ups left out)."""

    bare_wall: list[float] = field(default_factory=list)
    bare_cpu: list[float] = field(default_factory=list)
    nanobot_wall: list[float] = field(default_factory=list)
    nanobot_cpu: list[float] = field(default_factory=list)
    note_bytes: int = 0

    @property
    def added_wall(self) -> list[float]:
        return [n - b for n, b in zip(self.nanobot_wall, self.bare_wall, strict=True)]

    @property
    def added_cpu(self) -> list[float]:
        return [n - b for n, b in zip(self.nanobot_cpu, self.bare_cpu, strict=True)]


async def _fake(tmp: Path) -> tuple[Child, str]:
    script = tmp / "transcripts.json"
    script.write_text(json.dumps({"default_transcript": TRANSCRIPT}), encoding="utf-8")
    argv = [sys.executable, "-m", "tests.fakes.llm", "--port", "0", "--script", str(script)]
    child = await Child.start(
        "fake-transcription", argv, isolated_env(tmp), REPO_ROOT, tmp / "fake.log"
    )
    url = await child.line(60)
    if not url.startswith("http://"):
        raise BenchError(f"fake transcription server: unexpected first line {url!r}")
    return child, url


def _settles(task: asyncio.Task[Any]) -> bool:
    """Whether a task a measured call started is part of its cost: not litellm's logging
    worker, which the first call starts and which runs as long as the loop does (the work
    it is handed is queued by both ways alike)."""
    code = getattr(task.get_coro(), "cr_code", None)
    return not task.done() and (code is None or code.co_qualname != "LoggingWorker._worker_loop")


async def _timed(work: Callable[[], Awaitable[Any]]) -> tuple[float, float, Any]:
    """Wall and CPU seconds of `work()` and the tasks it left running, and its result."""
    before = asyncio.all_tasks()
    cpu, wall = time.process_time(), time.perf_counter()
    result = await work()
    if started := [t for t in asyncio.all_tasks() - before if _settles(t)]:
        await asyncio.wait(started, timeout=SETTLE_LIMIT_S)
    return time.perf_counter() - wall, time.process_time() - cpu, result


async def measure_voice(tmp: Path, rounds: int, warmups: int) -> VoiceSamples:
    """`warmups` + `rounds` rounds of the bare call and the reader, in shuffled order."""
    litellm = await asyncio.to_thread(_litellm)  # as nanobot imports and configures it

    child, url = await _fake(tmp)
    try:
        inbox = tmp / "workspace" / "inbox"
        inbox.mkdir(parents=True)
        settings = TranscriptionSettings(model=MODEL, api_key=API_KEY, api_base=url)
        reader = Reader(Transcriber(settings, Workspace(tmp / "workspace")), None)
        data = audio.ogg_opus(NOTE_SECONDS)
        samples = VoiceSamples(note_bytes=len(data))
        shuffle = random.Random(29)

        async def bare() -> str:
            response = await litellm.atranscription(
                model=MODEL,
                file=("voice_0.ogg", data),
                api_base=url,
                api_key=API_KEY,
                max_retries=0,
                timeout=TIMEOUT_S,
            )
            return str(response.text)

        for number in range(warmups + rounds):
            path = inbox / f"voice_{number}.ogg"
            path.write_bytes(data)
            note = Attachment("voice", path, "audio/ogg", len(data), NOTE_SECONDS)

            async def nanobot(note: Attachment = note) -> str:
                read = await reader.read("", [note])
                if read.heard != 1:
                    raise BenchError(f"the note was not heard: {read.text!r}")
                return read.text

            order = [("bare", bare), ("nanobot", nanobot)]
            shuffle.shuffle(order)
            gc.collect()
            figures: dict[str, tuple[float, float]] = {}
            for name, work in order:
                wall, cpu, text = await _timed(work)
                if TRANSCRIPT not in text:
                    raise BenchError(f"{name}: {text!r} is not the transcript")
                figures[name] = (wall, cpu)
            if number >= warmups:
                samples.bare_wall.append(figures["bare"][0])
                samples.bare_cpu.append(figures["bare"][1])
                samples.nanobot_wall.append(figures["nanobot"][0])
                samples.nanobot_cpu.append(figures["nanobot"][1])
        kept = inbox / f"voice_{warmups + rounds - 1}.ogg.txt"
        if kept.read_text(encoding="utf-8") != TRANSCRIPT:
            raise BenchError(f"{kept} does not hold the transcript")
        return samples
    finally:
        await child.stop()
