"""What kind of file arrived, told from its first bytes, its name and the mime type the
platform gave. Pure: the gateway uses it to pass over pictures, sound and video without
starting a reader, the extraction worker to pick its reader.

The content decides; the name and the mime type only claim. A PDF called `scan.jpg` is read
as a PDF, and text is read as text whatever it is called; a file called `.pdf` that neither
starts like a PDF nor holds text is reported as not a valid PDF. Only a file whose content
says nothing (binary data of no format known here) is taken for a picture, sound or video
when its name or mime type says so.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import PurePath
from typing import Final, Literal

Content = Literal["pdf", "zip", "ole", "text", "media", "other"]
"""What the first bytes show: a PDF, a ZIP (the Office formats are ZIPs), an OLE2 compound
file (old Office formats, and encrypted new ones), text, a picture/sound/video, or other."""

Claim = Literal["pdf", "docx", "xlsx", "pptx", "csv", "tsv"]
"""A document kind a name or mime type claims."""

Office = Literal["docx", "xlsx", "pptx"]

SNIFF_BYTES: Final = 8192
"""How much of the start of a file `sniff` needs."""

ENCRYPTED_OFFICE: Final = "EncryptedPackage".encode("utf-16-le")
"""The stream an encrypted DOCX/XLSX/PPTX keeps inside its OLE2 container (a directory
entry's name, in UTF-16): a password-protected Office file is an OLE2 file holding it."""

_PDF: Final = b"%PDF-"
_PDF_WITHIN: Final = 1024
_ZIP: Final = (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08")
_OLE: Final = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_MEDIA_MAGIC: Final = (
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",  # JPEG
    b"GIF87a",
    b"GIF89a",
    b"II*\x00",  # TIFF
    b"MM\x00*",
    b"OggS",  # Opus and Vorbis voice notes
    b"ID3",  # MP3 with tags
    b"fLaC",
    b"\x1a\x45\xdf\xa3",  # Matroska, WebM
    b"#!AMR",
)
_RIFF_MEDIA: Final = (b"WAVE", b"WEBP", b"AVI ")
_OTHER_MAGIC: Final = (
    (b"{\\rtf", "an RTF document"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"BZh", "a bzip2 archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\x7fELF", "an ELF program"),
    (b"MZ", "a Windows program"),
    (b"SQLite format 3\x00", "an SQLite database"),
)
_RTF: Final = b"{\\rtf"
_UTF16: Final = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
_TEXT_CONTROLS: Final = bytes(c for c in range(32) if c not in b"\t\n\r\f\b\x1b")
_MEDIA_MIME: Final = ("image/", "audio/", "video/")
_MEDIA_SUFFIXES: Final = frozenset(
    {
        *(".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".heic", ".heif"),
        *(".avif", ".ico", ".mp3", ".ogg", ".oga", ".opus", ".wav", ".flac", ".m4a", ".aac"),
        *(".amr", ".wma", ".mp4", ".mov", ".webm", ".mkv", ".avi", ".m4v", ".3gp"),
    }
)
_SUFFIX_CLAIMS: Final[dict[str, Claim]] = {
    ".pdf": "pdf",
    ".docx": "docx",
    ".docm": "docx",
    ".xlsx": "xlsx",
    ".xlsm": "xlsx",
    ".pptx": "pptx",
    ".pptm": "pptx",
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
}
_OPENXML: Final = "application/vnd.openxmlformats-officedocument."
_MIME_CLAIMS: Final[dict[str, Claim]] = {
    "application/pdf": "pdf",
    _OPENXML + "wordprocessingml.document": "docx",
    _OPENXML + "spreadsheetml.sheet": "xlsx",
    _OPENXML + "presentationml.presentation": "pptx",
    "text/csv": "csv",
    "application/csv": "csv",
    "text/tab-separated-values": "tsv",
}
_OFFICE_PARTS: Final[dict[str, Office]] = {
    "word/document.xml": "docx",
    "xl/workbook.xml": "xlsx",
    "ppt/presentation.xml": "pptx",
}
_OLD_OFFICE: Final = {
    ".doc": "an old-format Word document",
    ".dot": "an old-format Word template",
    ".xls": "an old-format Excel workbook",
    ".ppt": "an old-format PowerPoint presentation",
    ".pps": "an old-format PowerPoint slide show",
    ".msg": "an Outlook message",
}
_GENERIC_MIME: Final = frozenset({"application/octet-stream", "application/zip", "binary/octet"})


@dataclass(frozen=True, slots=True)
class Sniffed:
    """What a file seems to be: its `content`, the document kind its name or mime type
    claims (`claim`, None when they claim none), and, for content of no kind read here,
    `what` it is in words ("a gzip archive (.gz)")."""

    content: Content
    claim: Claim | None
    what: str


def sniff(head: bytes, name: str, mime_type: str | None) -> Sniffed:
    """What the file whose first `SNIFF_BYTES` (or fewer: all of it) are `head` seems to be.

    `name` is the file's name (only its suffix counts), `mime_type` what the platform said,
    if anything."""
    claim = claimed(name, mime_type)
    # The header may follow some junk (PDF 1.7, annex H), but text that names it is text.
    if head.startswith(_PDF) or (claim == "pdf" and _PDF in head[:_PDF_WITHIN]):
        return Sniffed("pdf", claim, "")
    content = next((content for test, content in _BY_CONTENT if test(head)), None)
    if content is not None:
        return Sniffed(content, claim, "")
    rtf = head.startswith(_RTF)  # text, but not to be read as such
    if _is_text(head) and not rtf:
        return Sniffed("text", claim, "")
    if not rtf and _claims_media(name, mime_type):
        return Sniffed("media", claim, "")
    what = next((what for magic, what in _OTHER_MAGIC if head.startswith(magic)), "binary data")
    return Sniffed("other", claim, describe(what, name, mime_type))


def claimed(name: str, mime_type: str | None) -> Claim | None:
    """The document kind that `name`'s suffix, or else `mime_type`, claims."""
    by_name = _SUFFIX_CLAIMS.get(_suffix(name))
    if by_name is not None:
        return by_name
    return _MIME_CLAIMS.get((mime_type or "").split(";")[0].strip().lower())


def office_kind(members: Collection[str]) -> Office | None:
    """Which Office document a ZIP with these member names is, if it is one."""
    for part, kind in _OFFICE_PARTS.items():
        if part in members:
            return kind
    return None


def archive_what(members: Collection[str], name: str, mime_type: str | None) -> str:
    """A ZIP that is no Office document, in words."""
    if "mimetype" in members and "META-INF/container.xml" in members:
        base = "an EPUB e-book"
    elif "mimetype" in members and "content.xml" in members:
        base = "an OpenDocument file"
    elif "xl/workbook.bin" in members:
        base = "an Excel binary workbook"
    else:
        base = "a ZIP archive"
    return describe(base, name, mime_type)


def ole_what(name: str, mime_type: str | None) -> str:
    """An OLE2 file that is not an encrypted Office document, in words."""
    return describe(_OLD_OFFICE.get(_suffix(name), "an old-format Office file"), name, mime_type)


def describe(base: str, name: str, mime_type: str | None) -> str:
    """`base` with the file's suffix, or else an informative mime type, in brackets."""
    suffix = _suffix(name)
    mime = (mime_type or "").split(";")[0].strip().lower()
    detail = suffix or (mime if mime and mime not in _GENERIC_MIME else "")
    return f"{base} ({detail})" if detail else base


def _suffix(name: str) -> str:
    return PurePath(name).suffix.lower()


def _is_media(head: bytes) -> bool:
    riff = head.startswith(b"RIFF") and head[8:12] in _RIFF_MEDIA
    iso = head[4:8] == b"ftyp"  # MP4, QuickTime, M4A, HEIC, AVIF, 3GP
    # An MPEG audio frame (MP3 without tags) or an ADTS AAC frame: 11 sync bits.
    mpeg = len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0
    return head.startswith(_MEDIA_MAGIC) or riff or iso or mpeg


def _claims_media(name: str, mime_type: str | None) -> bool:
    return (mime_type or "").lower().startswith(_MEDIA_MIME) or _suffix(name) in _MEDIA_SUFFIXES


_BY_CONTENT: Final[tuple[tuple[Callable[[bytes], bool], Content], ...]] = (
    (lambda head: head.startswith(_ZIP), "zip"),
    (lambda head: head.startswith(_OLE), "ole"),
    (lambda head: head.startswith(_UTF16), "text"),  # before MPEG's sync bits: FF FE
    (_is_media, "media"),
)


def _is_text(head: bytes) -> bool:
    """Text in some encoding other than UTF-16: no NUL and hardly any other control
    characters."""
    if b"\x00" in head:
        return False
    controls = len(head) - len(head.translate(None, _TEXT_CONTROLS))
    return controls * 100 <= len(head)
