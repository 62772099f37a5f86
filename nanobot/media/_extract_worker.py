"""The document reader's own process: `python -m nanobot.media._extract_worker`, started by
`documents.read_document` for one file.

The request comes as JSON on stdin (`path`, `mime_type`, `limits`); the answer goes as one
JSON object on stdout: `{"document": false}` for a picture, sound or video; else
`text_name`, `head`, `total_chars` and `shape`, or `problem` (and `detail`, for the log).
Before it reads anything, the process caps its own address space (RLIMIT_AS) and the size
of any file it writes (RLIMIT_FSIZE: the text file, bounded by `max_text_chars`), and makes
no core dump; what a library prints goes to stderr, never into the answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import traceback
from pathlib import Path
from typing import BinaryIO, Final

from nanobot.media import _readers as readers
from nanobot.media._kinds import (
    ENCRYPTED_OFFICE,
    SNIFF_BYTES,
    Claim,
    Office,
    Sniffed,
    archive_what,
    office_kind,
    ole_what,
    sniff,
)
from nanobot.media._limits import DocumentLimits
from nanobot.media._readers import Reader, Text, Unreadable, brief, os_reason
from nanobot.sizes import format_size
from nanobot.workspace import Workspace

Answer = dict[str, object]

_LABELS: Final[dict[str, str]] = {
    "pdf": "PDF",
    "docx": "Word document",
    "xlsx": "Excel workbook",
    "pptx": "PowerPoint presentation",
    "csv": "CSV file",
    "tsv": "TSV file",
    "text": "text file",
}
_READERS: Final[dict[str, Reader]] = {
    "pdf": readers.read_pdf,
    "docx": readers.read_docx,
    "xlsx": readers.read_xlsx,
    "pptx": readers.read_pptx,
    "csv": readers.read_csv,
    "tsv": readers.read_tsv,
    "text": readers.read_text,
}
_SCAN_CHUNK: Final = 1 << 20


def main() -> None:
    answer_to = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    request = json.loads(sys.stdin.buffer.read())
    limits = DocumentLimits(**request["limits"])
    _confine(limits)
    try:
        answer = extract(Path(request["path"]), request["mime_type"], limits)
    except MemoryError:
        answer = _problem(_out_of_memory(limits))
    answer_to.write(json.dumps(answer))
    answer_to.flush()


def extract(path: Path, mime_type: str | None, limits: DocumentLimits) -> Answer:
    """Read the document at `path` and keep its text beside it; the answer to send."""
    try:
        fd, _ = Workspace(path.parent).open_file(path.name)
    except OSError as exc:
        return _problem(f"it could not be opened ({os_reason(exc)})")
    with os.fdopen(fd, "rb") as file:
        sniffed = sniff(file.read(SNIFF_BYTES), path.name, mime_type)
        if sniffed.content == "media":
            return {"document": False}
        try:
            kind = _kind(sniffed, file, path.name, mime_type, limits)
        except Unreadable as exc:
            return _problem(exc.problem)
        except OSError as exc:
            return _problem(f"it could not be read ({os_reason(exc)})")
        return _read(file, kind, path, limits)


def _read(file: BinaryIO, kind: str, path: Path, limits: DocumentLimits) -> Answer:
    text = Text(limits.max_text_chars)
    try:
        file.seek(0)
        shape = _READERS[kind](file, text, limits)
    except Unreadable as exc:
        return _problem(exc.problem)
    except MemoryError:
        return _problem(_out_of_memory(limits))
    # The boundary of every parser: whatever one raises on a bad file means damage.
    except Exception as exc:  # noqa: BLE001
        if "memory allocation failed" in str(exc).lower():  # libxml2's own words
            return _problem(_out_of_memory(limits))
        return _problem(_damaged(kind, brief(exc)), traceback.format_exc(limit=-4))
    if text.full:
        most = limits.max_text_chars
        text.note(f"\n[the text stops here: at most {most:,} characters of a document are kept]")
        shape += f", cut at {most:,} characters"
    return _keep(path, text.value(), shape, limits)


def _kind(
    sniffed: Sniffed, file: BinaryIO, name: str, mime_type: str | None, limits: DocumentLimits
) -> str:
    """The reader for the file, or `Unreadable` saying why there is none."""
    match sniffed.content:
        case "pdf":
            return "pdf"
        case "zip":
            return _office(file, sniffed.claim, name, mime_type, limits)
        case "ole":
            if _holds(file, ENCRYPTED_OFFICE):
                raise Unreadable("the Office file is encrypted and needs a password")
            raise Unreadable(_unsupported(ole_what(name, mime_type)))
        case "text":
            return sniffed.claim if sniffed.claim in ("csv", "tsv") else "text"
        case _ if sniffed.claim is not None:
            raise Unreadable(_damaged(sniffed.claim, "it does not start like one"))
        case _:
            raise Unreadable(_unsupported(sniffed.what))


def _office(
    file: BinaryIO, claim: Claim | None, name: str, mime_type: str | None, limits: DocumentLimits
) -> Office:
    """Which Office document the ZIP is, once its central directory shows that it is one
    and that it expands to no more than `max_expanded_bytes` (nothing is expanded here)."""
    import zipfile  # not for the other kinds: it takes as long to import as the rest

    label = _LABELS[claim] if claim in ("docx", "xlsx", "pptx") else "ZIP archive"
    try:
        with zipfile.ZipFile(file) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        raise Unreadable(f"the file is damaged or not a valid {label} ({brief(exc)})") from exc
    names = {member.filename for member in members}
    kind = office_kind(names)
    if kind is None:
        raise Unreadable(_unsupported(archive_what(names, name, mime_type)))
    expanded = sum(member.file_size for member in members)
    if expanded > limits.max_expanded_bytes:
        raise Unreadable(
            f"it would expand to {format_size(expanded)}, past the "
            f"{format_size(limits.max_expanded_bytes)} limit for Office files (a decompression "
            "bomb?); nothing of it was expanded"
        )
    # bzip2 and LZMA members are decompressed a whole read at a time, unbounded by the
    # declared size; no Office program writes them.
    if any(
        member.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) for member in members
    ):
        raise Unreadable(_damaged(kind, "a compression Office files do not use"))
    return kind


def _holds(file: BinaryIO, needle: bytes) -> bool:
    file.seek(0)
    tail = b""
    while chunk := file.read(_SCAN_CHUNK):
        if needle in tail + chunk:
            return True
        tail = chunk[-len(needle) :]
    return False


def _keep(path: Path, whole: str, shape: str, limits: DocumentLimits) -> Answer:
    """Write the text beside the document, whole, and answer with its beginning."""
    # A NUL cannot be stored in PostgreSQL text; a lone surrogate (from a PDF's broken font
    # map) cannot be encoded at all.
    whole = whole.replace("\x00", "")
    try:
        data = whole.encode("utf-8")
    except UnicodeEncodeError:
        data = whole.encode("utf-8", "replace")
        whole = data.decode("utf-8")
    try:
        saved = Workspace(path.parent).create(".", f"{path.name}.txt", data)
    except OSError as exc:
        return _problem(f"its text could not be saved beside it ({os_reason(exc)})")
    return {
        "document": True,
        "text_name": saved,
        "head": whole[: limits.max_chars],
        "total_chars": len(whole),
        "shape": shape,
        "problem": None,
    }


def _confine(limits: DocumentLimits) -> None:
    text_bytes = 4 * limits.max_text_chars + (1 << 20)
    for which, wanted in (
        (resource.RLIMIT_AS, limits.max_memory_bytes),
        (resource.RLIMIT_FSIZE, text_bytes),
        (resource.RLIMIT_CORE, 0),
    ):
        _, hard = resource.getrlimit(which)
        most = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        # Where a system refuses a limit (macOS has no RLIMIT_AS to speak of), the time
        # limit still holds.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(which, (most, most))


def _damaged(kind: str, why: str) -> str:
    return f"the file is damaged or not a valid {_LABELS[kind]} ({why})"


def _unsupported(what: str) -> str:
    return f"it is {what}, a kind of file nanobot does not read"


def _out_of_memory(limits: DocumentLimits) -> str:
    return f"reading it needed more than the {format_size(limits.max_memory_bytes)} memory limit"


def _problem(problem: str, detail: str | None = None) -> Answer:
    return {"document": True, "problem": problem, "detail": detail}


if __name__ == "__main__":
    main()
