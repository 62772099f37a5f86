"""``bench/media.py``, part two: the gateway's memory while a 20 MB document comes in.

The real ``nanobot gateway`` (tests/gateway_process.py starts it: an isolated environment,
a temporary data dir, ``transport: direct``, the default ``documents`` limits) polls a fake
Telegram and calls a fake model, both in this process (what is measured is the gateway's
memory, not its speed). Documents of about 20 MB (under the 20 MiB a bot may download),
made here by the libraries that write them:

- **pdf**: a report of 10 pages, each a heading, a paragraph and a photo (random pixels, as
  incompressible as a photo's);
- **docx**: the same report as a Word document (the photos in its zip);
- **text**: a 20 MB log file, 250,000 lines (the reader keeps the first 5,000,000
  characters, `max_text_chars`).

Per round, one document in a chat of its own: the gateway's VmRSS before it (settled), its
peak while the document is downloaded, saved, journaled, read by the worker and answered
(VmHWM, reset to the current RSS through ``/proc/PID/clear_refs`` just before the document
is queued, read when the reply has arrived: the kernel's own peak, no sampling), and its
VmRSS a second after. The idle figure is the gateway's VmRSS after one text message (as
``gateway_startup`` measures it), before any document. The reader (the
``nanobot.media._extract_worker`` child) is a process of its own: its VmHWM is read every
5 ms while it runs in the gateway, and its exact peak (``wait4``'s ``ru_maxrss``) is
measured apart, the same worker run on the same saved file with the same limits.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import docx
from docx.shared import Inches
from fpdf import FPDF
from PIL import Image

from bench._common import BenchError, isolated_env, run_measured
from bench._gateway import cpu_seconds, descendants, hwm_kib, rss_kib
from bench._setup import gateway_config
from nanobot.media.documents import WORKER, DocumentLimits
from tests.fakes.llm import FakeLLM, Text
from tests.fakes.telegram import MAX_DOWNLOAD, FakeTelegram
from tests.gateway_process import GatewayProcess

TARGET_BYTES = 20_000_000
KINDS = ("pdf", "docx", "text")
PAGES = 10
PHOTO = (1280, 520)  # pixels: 2 MB of RGB that does not compress, per page
ANSWER = "I have read your document."
PARAGRAPH = (
    "Revenue grew in every region this quarter; the north led with new customers in "
    "retail, while costs stayed flat thanks to the move to the new warehouse. "
)
MIME = {
    "pdf": "application/pdf",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "text": "text/plain",
}
NAMES = {"pdf": "report.pdf", "docx": "report.docx", "text": "server.log"}
WORDS = {"pdf": "Revenue grew", "docx": "Revenue grew", "text": "GET /api/orders/"}
SETTLE_S = 1.0
SAMPLE_S = 0.005


@dataclass
class Round:
    """One document into the gateway; memory in KiB, times in seconds."""

    kind: str
    size: int
    before_kib: int
    peak_kib: int
    after_kib: int
    worker_peak_kib: int  # sampled VmHWM, the last read before it ended
    worker_samples: int
    gateway_cpu_s: float
    reply_s: float  # from queuing the document to the reply


@dataclass
class MemoryFigures:
    idle_kib: int = 0
    rounds: list[Round] = field(default_factory=list)
    worker_exact_kib: dict[str, list[int]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)


def _photo(rng: random.Random) -> bytes:
    width, height = PHOTO
    image = Image.frombytes("RGB", PHOTO, rng.randbytes(width * height * 3))
    out = io.BytesIO()
    image.save(out, "PNG", compress_level=1)
    return out.getvalue()


def _pdf(rng: random.Random) -> bytes:
    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    for page in range(1, PAGES + 1):
        pdf.add_page()
        pdf.cell(0, 10, f"Section {page}: the quarter in numbers", new_x="LMARGIN", new_y="NEXT")
        pdf.multi_cell(0, 6, PARAGRAPH * 6)
        pdf.image(io.BytesIO(_photo(rng)), w=180)
    return bytes(pdf.output())


def _docx(rng: random.Random) -> bytes:
    document = docx.Document()
    for page in range(1, PAGES + 1):
        document.add_heading(f"Section {page}: the quarter in numbers", level=1)
        document.add_paragraph(PARAGRAPH * 6)
        document.add_picture(io.BytesIO(_photo(rng)), width=Inches(6))
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _log(rng: random.Random) -> bytes:
    lines: list[str] = []
    size, number = 0, 0
    while size < TARGET_BYTES:
        number += 1
        line = (
            f"2026-12-03T{number // 3600 % 24:02d}:{number // 60 % 60:02d}:{number % 60:02d}Z "
            f"INFO request {number} GET /api/orders/{rng.randrange(10**6)} 200 "
            f"in {rng.randrange(1, 900)} ms\n"
        )
        lines.append(line)
        size += len(line)
    return "".join(lines).encode()[:TARGET_BYTES]


def make_documents() -> dict[str, bytes]:
    """The three documents, the same bytes every run (a seeded generator)."""
    made: dict[str, Callable[[random.Random], bytes]] = {"pdf": _pdf, "docx": _docx, "text": _log}
    documents = {kind: make(random.Random(29)) for kind, make in made.items()}
    for kind, data in documents.items():
        if not 0.9 * TARGET_BYTES < len(data) <= MAX_DOWNLOAD:
            raise BenchError(f"the {kind} document is {len(data):,} bytes, not about 20 MB")
    return documents


def _reset_peak(pid: int) -> None:
    """VmHWM back to the current VmRSS (Linux 4.0 and later)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5", encoding="ascii")


def _worker(pid: int) -> int | None:
    for child in descendants(pid):
        try:
            if WORKER.encode() in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
        except OSError:
            continue
    return None


async def _watch_worker(pid: int, stop: asyncio.Event) -> tuple[int, int]:
    """The largest VmHWM read of the gateway's document workers until `stop`, and the
    number of reads."""
    peak = samples = 0
    while not stop.is_set():
        worker = _worker(pid)
        if worker is not None:
            try:
                peak = max(peak, hwm_kib(worker))
                samples += 1
            except (OSError, BenchError):  # it ended meanwhile
                pass
        try:
            async with asyncio.timeout(SAMPLE_S):
                await stop.wait()
        except TimeoutError:
            pass
    return peak, samples


async def worker_exact_kib(path: Path, mime_type: str) -> int:
    """The worker's peak RSS (``ru_maxrss`` from ``wait4``) reading `path` with the default
    limits, started as ``read_document`` starts it; its text file goes beside `path`.

    Through ``run_measured``'s small wrapper: a child's ``ru_maxrss`` starts from its
    parent's RSS at the fork, which for this process (the documents, the fakes) is larger
    than the worker's own."""
    limits = asdict(DocumentLimits())
    request = json.dumps({"path": str(path), "mime_type": mime_type, "limits": limits})
    env = {name: os.environ[name] for name in ("PATH", "PYTHONPATH") if name in os.environ}
    argv = [sys.executable, "-P", "-m", WORKER]
    run = await run_measured(argv, env, stdin=request.encode())
    answer = json.loads(run.check().stdout)
    if answer.get("problem") or "head" not in answer:
        raise BenchError(f"the worker did not read {path.name}: {answer}")
    return run.peak_rss_kib


async def _one(
    gateway: GatewayProcess,
    telegram: FakeTelegram,
    llm: FakeLLM,
    *,
    kind: str,
    data: bytes,
    chat: int,
) -> Round:
    pid = _pid(gateway)
    first = llm.request_count
    await asyncio.sleep(SETTLE_S)
    before = rss_kib(pid)
    _reset_peak(pid)
    cpu = cpu_seconds(pid)
    stop = asyncio.Event()
    watching = asyncio.create_task(_watch_worker(pid, stop), name="watch-worker")
    queued = time.monotonic()
    telegram.user_document(
        chat, filename=NAMES[kind], content=data, mime_type=MIME[kind], user_id=chat
    )
    try:
        await telegram.wait_for_sent(1, chat, seconds=120)
    finally:
        stop.set()
        worker_peak, samples = await watching
    reply_s = time.monotonic() - queued
    peak = hwm_kib(pid)
    gateway_cpu = cpu_seconds(pid) - cpu
    await asyncio.sleep(SETTLE_S)
    after = rss_kib(pid)
    said = [str(r.messages[-1]["content"]) for r in llm.requests[first:]]
    # The second report.pdf in the inbox is saved as report-1.pdf, and so on.
    stem, suffix = NAMES[kind].rsplit(".", 1)
    marker = rf'<untrusted_content source="the document {stem}(-\d+)?\.{suffix}, sent in the chat">'
    if len(said) != 1 or not re.search(marker, said[0]) or WORDS[kind] not in said[0]:
        raise BenchError(f"the {kind} document did not reach the model as read: {said!r:.600}")
    return Round(kind, len(data), before, peak, after, worker_peak, samples, gateway_cpu, reply_s)


def _pid(gateway: GatewayProcess) -> int:
    assert gateway.process is not None
    return gateway.process.pid


async def measure_memory(tmp: Path, rounds: int, progress: Callable[[str], None]) -> MemoryFigures:
    """`rounds` rounds of every kind, interleaved, in one gateway; then the worker alone."""
    documents = await asyncio.to_thread(make_documents)
    figures = MemoryFigures(sizes={kind: len(data) for kind, data in documents.items()})
    progress("  documents: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in figures.sizes.items()))
    async with FakeLLM(default_reply=Text(ANSWER)) as llm, FakeTelegram() as telegram:
        root = tmp / "gateway"
        root.mkdir()
        config = gateway_config(root, llm.base_url, telegram.base_url, None, "direct")
        gateway = GatewayProcess(root, config, isolated_env(root))
        await gateway.start(ready="telegram connected")
        try:
            chats = iter(range(2_000_000, 3_000_000))
            chat = next(chats)
            telegram.user_message(chat, "hello", user_id=chat)
            await telegram.wait_for_sent(1, chat, seconds=60)
            await asyncio.sleep(2 * SETTLE_S)
            figures.idle_kib = rss_kib(_pid(gateway))
            progress(f"  idle after one message: {figures.idle_kib / 1024:.1f} MiB")
            for number in range(rounds):
                for kind in KINDS:
                    one = await _one(
                        gateway, telegram, llm, kind=kind, data=documents[kind], chat=next(chats)
                    )
                    figures.rounds.append(one)
                    progress(
                        f"    round {number + 1} {kind}: gateway peak "
                        f"{one.peak_kib / 1024:.1f} MiB (before {one.before_kib / 1024:.1f}, "
                        f"after {one.after_kib / 1024:.1f}); reader "
                        f"{one.worker_peak_kib / 1024:.1f} MiB"
                    )
        finally:
            await gateway.stop()
        inbox = root / "data" / "workspace" / "inbox"
        for kind in KINDS:
            saved = inbox / NAMES[kind]
            figures.worker_exact_kib[kind] = [
                await worker_exact_kib(saved, MIME[kind]) for _ in range(rounds)
            ]
    return figures
