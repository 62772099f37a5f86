"""What kind of file arrived (nanobot/media/_kinds.py): the content decides, names claim."""

from __future__ import annotations

import codecs

import pytest

from nanobot.media._kinds import Sniffed, sniff
from nanobot.media.documents import DocumentLimits

OPENXML = "application/vnd.openxmlformats-officedocument."
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64)


def seems(content: str, claim: str | None = None, what: str = "") -> Sniffed:
    return Sniffed(content, claim, what)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("head", "name", "mime_type", "expected"),
    [
        (b"%PDF-1.7\n", "scan.jpg", "image/jpeg", seems("pdf")),
        (b"junk\n%PDF-1.4\n", "a.pdf", None, seems("pdf", "pdf")),
        (b"a header: %PDF-1.4\n", "notes.md", None, seems("text")),
        (b"PK\x03\x04rest", "report.docx", None, seems("zip", "docx")),
        (b"PK\x03\x04rest", "upload", f"{OPENXML}spreadsheetml.sheet", seems("zip", "xlsx")),
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "old.xls", None, seems("ole")),
        (PNG, "photo", None, seems("media")),
        (b"OggS\x00\x02", "voice", "audio/ogg", seems("media")),
        (b"\x00\x00\x00\x18ftypmp42", "clip.mp4", None, seems("media")),
        (b"RIFF\x24\x00\x00\x00WAVEfmt ", "a.wav", None, seems("media")),
        (b"\xff\xfb\x90\x00", "track", None, seems("media")),  # an MP3 frame
        (b"# Notes\n", "notes.pdf", "application/pdf", seems("text", "pdf")),
        (b"a;b\n1;2\n", "t.csv", None, seems("text", "csv")),
        (b"x\ty\n", "t", "text/tab-separated-values; charset=utf-8", seems("text", "tsv")),
        (codecs.BOM_UTF16_LE + "hi".encode("utf-16-le"), "u.txt", None, seems("text")),
        ("café\n".encode("cp1252"), "old.txt", None, seems("text")),
        (b"", "empty.txt", None, seems("text")),
        (b"\x01\x02\x00\x03", "song.mp3", None, seems("media")),
        (b"\x01\x02\x00\x03", "clip", "video/mp4", seems("media")),
        (b"\x01\x02\x00\x03", "report.pdf", None, seems("other", "pdf", "binary data (.pdf)")),
        (
            b"\x01\x02\x00\x03",
            "blob",
            "application/octet-stream",
            seems("other", None, "binary data"),
        ),
        (b"\x1f\x8b\x08\x00", "logs.gz", None, seems("other", None, "a gzip archive (.gz)")),
        (b"{\\rtf1 hi}", "a.rtf", None, seems("other", None, "an RTF document (.rtf)")),
        (
            b"\x7fELF\x02",
            "tool",
            "application/x-executable",
            seems("other", None, "an ELF program (application/x-executable)"),
        ),
    ],
)
def test_the_content_decides_and_names_only_claim(
    head: bytes, name: str, mime_type: str | None, expected: Sniffed
) -> None:
    assert sniff(head, name, mime_type) == expected


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        DocumentLimits(max_chars=0)
