"""Issue 29, voice notes and documents: what nanobot adds to hearing a voice note, and the
gateway's memory while a 20 MB document is downloaded and read.

1. **A voice note's added time** (`bench/_media_voice.py`): nanobot's reader of a message's
   files (`Reader.read`, as the dispatcher calls it) against a bare
   `litellm.atranscription` of the same note, both against the fake transcription server
   answering at once, interleaved in shuffled order every round; the median over rounds of
   the difference, wall and CPU. The provider's own time is in both, so it cancels out.
2. **Memory while a 20 MB document comes in** (`bench/_media_memory.py`): the real gateway
   takes a 20 MB PDF, DOCX and log file (interleaved, several rounds) from the fake Telegram;
   its peak RSS (the kernel's high-water mark, reset before each document) against its idle
   RSS, and the peak of the document reader, a process of its own.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._common import Metric, format_table, gateway_loop_run, git_state, write_results
from bench._media_memory import KINDS, MemoryFigures, measure_memory
from bench._media_voice import NOTE_SECONDS, VoiceSamples, measure_voice
from nanobot import log

NAME = "media"
VOICE_ROUNDS, VOICE_WARMUPS = 200, 20
VOICE_TARGET_MS = 50.0
MEMORY_ROUNDS = 3


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _ms(values: list[float]) -> list[float]:
    return [value * 1000 for value in values]


def _mib(values: list[int]) -> list[float]:
    return [value / 1024 for value in values]


def voice_metrics(samples: VoiceSamples) -> list[Metric]:
    note = f"a {NOTE_SECONDS:g}-second OGG/Opus note, {samples.note_bytes:,} bytes"
    return [
        Metric(
            "voice note: nanobot's added time (wall)",
            "ms",
            _ms(samples.added_wall),
            target=VOICE_TARGET_MS,
            note="Reader.read minus the bare call, per round",
        ),
        Metric("… added CPU", "ms", _ms(samples.added_cpu)),
        Metric("… Reader.read (wall)", "ms", _ms(samples.nanobot_wall), note=note),
        Metric("… bare litellm.atranscription (wall)", "ms", _ms(samples.bare_wall)),
        Metric("… Reader.read (CPU)", "ms", _ms(samples.nanobot_cpu)),
        Metric("… bare litellm.atranscription (CPU)", "ms", _ms(samples.bare_cpu)),
    ]


def memory_metrics(figures: MemoryFigures) -> list[Metric]:
    idle = figures.idle_kib
    metrics = [Metric("gateway idle RSS, after one message", "MiB", [idle / 1024])]
    for kind in KINDS:
        rounds = [r for r in figures.rounds if r.kind == kind]
        size = f"{figures.sizes[kind] / 1e6:.1f} MB"
        metrics += [
            Metric(
                f"{size} {kind}: gateway peak RSS − idle",
                "MiB",
                _mib([r.peak_kib - idle for r in rounds]),
            ),
            Metric("… gateway peak RSS", "MiB", _mib([r.peak_kib for r in rounds])),
            Metric(
                "… gateway RSS 1 s after − idle", "MiB", _mib([r.after_kib - idle for r in rounds])
            ),
            Metric(
                "… reader's peak RSS (exact, run apart)",
                "MiB",
                _mib(figures.worker_exact_kib[kind]),
            ),
            Metric(
                "… reader's peak RSS (read in the gateway)",
                "MiB",
                _mib([r.worker_peak_kib for r in rounds]),
            ),
            Metric("… gateway CPU", "s", [r.gateway_cpu_s for r in rounds]),
            Metric("… document queued → reply", "s", [r.reply_s for r in rounds]),
        ]
    return metrics


async def measure(tmp: Path) -> tuple[VoiceSamples, MemoryFigures]:
    _progress(
        f"  a voice note: {VOICE_WARMUPS} warm-up rounds, then {VOICE_ROUNDS} rounds of "
        "the bare call and the reader, shuffled"
    )
    voice_dir = tmp / "voice"
    voice_dir.mkdir()
    samples = await measure_voice(voice_dir, VOICE_ROUNDS, VOICE_WARMUPS)
    added = statistics.median(samples.added_wall) * 1000
    _progress(f"    nanobot's added time: {added:.2f} ms (median)")
    _progress(f"  20 MB documents into the gateway: {MEMORY_ROUNDS} rounds of {', '.join(KINDS)}")
    memory_dir = tmp / "memory"
    memory_dir.mkdir()
    figures = await measure_memory(memory_dir, MEMORY_ROUNDS, _progress)
    return samples, figures


def main() -> None:
    for name in [n for n in os.environ if n.startswith("NANOBOT_")]:
        del os.environ[name]
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="nanobot-bench-media-") as name:
        tmp = Path(name)
        # As the gateway logs: INFO to its log file (the transcription's line is written).
        log.setup(level="INFO", log_dir=tmp / "logs", stderr_level="WARNING")
        samples, figures = gateway_loop_run(measure(tmp))
    load_after = os.getloadavg()
    metrics = voice_metrics(samples) + memory_metrics(figures)
    print(format_table(metrics))
    print(
        f"Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; "
        f"after: {', '.join(f'{x:.2f}' for x in load_after)} (other processes slow every figure)."
    )
    payload: dict[str, Any] = {
        "git": git_state(),
        "metrics": [m.as_json() for m in metrics],
        "voice": {
            "bare_wall_s": samples.bare_wall,
            "nanobot_wall_s": samples.nanobot_wall,
            "bare_cpu_s": samples.bare_cpu,
            "nanobot_cpu_s": samples.nanobot_cpu,
            "note_bytes": samples.note_bytes,
        },
        "memory": {
            "idle_kib": figures.idle_kib,
            "sizes": figures.sizes,
            "rounds": [vars(r) for r in figures.rounds],
            "worker_exact_kib": figures.worker_exact_kib,
        },
        "load_average": {"before": load_before, "after": load_after},
    }
    path = write_results(NAME, payload)
    print(f"\nResults: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
