"""Text out of the documents people send: PDF, DOCX, XLSX, CSV/TSV, PPTX and text-like files.

`read_document` is the whole interface. The text is read in a child process of its own
(`nanobot.media._extract_worker`), never on the event loop nor in the gateway's memory:
the parsers (pypdf, python-docx, openpyxl, python-pptx) are imported only there, the child's
address space is capped (RLIMIT_AS) and it is killed when its time is up, so a file made to
hang or bloat a parser costs one child process and is reported as such. Zip-based Office
files are refused, by the sizes their central directory declares and before anything is
expanded, when they would expand past `max_expanded_bytes` (a decompression bomb).

The whole text goes to `<name>.txt` beside the file (written whole: a temporary file, then
linked under its name; never over an existing file: `<name>-1.txt`, … when that is taken),
for the file tools to page through; the caller gets its beginning.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from loguru import logger

from nanobot.media._kinds import SNIFF_BYTES, sniff
from nanobot.media._limits import DocumentLimits
from nanobot.media._readers import os_reason
from nanobot.workspace import Workspace

__all__ = ["DocumentLimits", "Extracted", "read_document"]

WORKER: Final = "nanobot.media._extract_worker"
_ENV_KEPT: Final = ("PATH", "PYTHONPATH", "SYSTEMROOT", "TMPDIR")  # not the gateway's secrets


@dataclass(frozen=True, slots=True)
class Extracted:
    """What was read of a document.

    `text_path`: the file holding the whole text (None when nothing could be read); `head`:
    its first `max_chars` characters; `total_chars`: the length of the whole text, `cut`
    how many of those are not in `head`; `shape`: the document's extent in words ("12
    pages", "3 sheets, 2 shown", "1 slide"; empty when it could not be read); `problem`:
    why it could not be read, as a phrase to follow "could not be read: " ("the PDF is
    encrypted and needs a password"), else None.
    """

    text_path: Path | None
    head: str
    total_chars: int
    shape: str
    cut: int
    problem: str | None

    @classmethod
    def unreadable(cls, problem: str) -> Extracted:
        return cls(None, "", 0, "", 0, problem)


async def read_document(
    path: Path, mime_type: str | None, limits: DocumentLimits
) -> Extracted | None:
    """The text of the document at `path` (a file the channel saved, opened without following
    a symlink in its place), or None when it is no document at all but a picture, sound or
    video (the caller's to handle). `mime_type` is what the platform said, if anything; the
    content decides (see `nanobot.media._kinds`).

    Never raises for a file: what cannot be read comes back with `problem` set (encrypted,
    damaged, of an unsupported type, over a limit, gone) and no text file. Cancellation is
    safe: the reader is killed and reaped before the cancellation goes on; a reader killed
    while writing may leave its hidden `.<name>.txt.*.part` file behind.
    """
    try:
        head = await asyncio.to_thread(_first_bytes, path)
    except OSError as exc:
        return Extracted.unreadable(f"it could not be opened ({os_reason(exc)})")
    if sniff(head, path.name, mime_type).content == "media":
        return None
    answer = await _run_worker(path, mime_type, limits)
    if isinstance(answer, Extracted):
        logger.info("document {} not read: {}", path.name, answer.problem)
        return answer
    if not answer.get("document", True):
        return None
    if answer.get("problem"):
        logger.info("document {} not read: {}", path.name, answer["problem"])
        logger.debug("document {}: {}", path.name, answer.get("detail"))
        return Extracted.unreadable(str(answer["problem"]))
    head_text = str(answer["head"])
    total = int(answer["total_chars"])
    logger.debug("document {}: {}, {} characters", path.name, answer["shape"], total)
    return Extracted(
        text_path=path.parent / str(answer["text_name"]),
        head=head_text,
        total_chars=total,
        shape=str(answer["shape"]),
        cut=total - len(head_text),
        problem=None,
    )


async def _run_worker(
    path: Path, mime_type: str | None, limits: DocumentLimits
) -> dict[str, Any] | Extracted:
    """The worker's answer, or an `Extracted` saying why there is none."""
    request = {"path": str(path), "mime_type": mime_type, "limits": asdict(limits)}
    env = {name: os.environ[name] for name in _ENV_KEPT if name in os.environ}
    try:
        # -P: the gateway's working directory may be the workspace, where a `nanobot/` the
        # model wrote must not stand in for ours.
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",
            "-m",
            WORKER,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
        )
    except OSError as exc:
        return Extracted.unreadable(f"the document reader could not be started ({os_reason(exc)})")
    try:
        async with asyncio.timeout(limits.timeout):
            output, _ = await process.communicate(json.dumps(request).encode())
    except TimeoutError:
        return Extracted.unreadable(
            f"reading it took longer than the {limits.timeout:g}-second time limit"
        )
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    try:
        answer = json.loads(output) if process.returncode == 0 else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return Extracted.unreadable(_crash(process.returncode))
    return answer


def _crash(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        name = signal.strsignal(-returncode) or f"signal {-returncode}"
        return f"the document reader crashed on it ({name.lower()})"
    return f"the document reader failed on it (exit status {returncode})"


def _first_bytes(path: Path) -> bytes:
    fd, _ = Workspace(path.parent).open_file(path.name)
    with os.fdopen(fd, "rb") as file:
        return file.read(SNIFF_BYTES)
