"""Text out of documents (nanobot/media/documents.py): real files made here by the libraries
that write them (fpdf2 and pypdf, python-docx, openpyxl, python-pptx, zipfile), read by the
real extraction worker in its own process (hence `process`: each read starts one)."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import zipfile
from datetime import date
from pathlib import Path
from typing import Any

import docx
import openpyxl
import pptx
import pytest
from fpdf import FPDF
from pptx.util import Inches
from pypdf import PdfWriter
from pypdf.generic import ContentStream

from nanobot.media.documents import WORKER, DocumentLimits, Extracted, read_document
from nanobot.sizes import format_size

pytestmark = pytest.mark.process

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64)


async def read(path: Path, mime_type: str | None = None, **limits: Any) -> Extracted:
    extracted = await read_document(path, mime_type, DocumentLimits(**limits))
    assert extracted is not None
    return extracted


def whole_text(extracted: Extracted) -> str:
    """The text file's content, checked against what the caller was given."""
    assert extracted.problem is None and extracted.text_path is not None
    text = extracted.text_path.read_text(encoding="utf-8")
    assert extracted.head == text[: len(extracted.head)]
    assert extracted.total_chars == len(text)
    assert extracted.cut == len(text) - len(extracted.head)
    return text


def refused(extracted: Extracted) -> str:
    assert extracted.text_path is None and extracted.head == "" and extracted.total_chars == 0
    assert extracted.problem
    return extracted.problem


def no_text_files(folder: Path) -> bool:
    return not [path for path in folder.iterdir() if path.name.endswith((".txt", ".part"))]


def pdf_bytes(pages: list[str]) -> bytes:
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    for words in pages:
        pdf.add_page()
        pdf.multi_cell(0, 10, words)
    return bytes(pdf.output())


def slow_pdf(path: Path) -> Path:
    """A one-page PDF whose page holds a million text operators: pypdf needs about a minute
    for its text (a stand-in for a file made to keep a parser busy)."""
    writer = PdfWriter(clone_from=io.BytesIO(pdf_bytes(["x"])))
    stream = ContentStream(None, writer)
    stream.set_data(b"BT /F1 12 Tf 72 720 Td " + b"(a) Tj 1 0 Td " * 1_000_000 + b"ET")
    writer.pages[0].replace_contents(stream)
    writer.pages[0].compress_content_streams()
    with path.open("wb") as file:
        writer.write(file)
    return path


def docx_file(path: Path) -> Path:
    document = docx.Document()
    document.add_heading("Quarterly report", level=1)
    document.add_paragraph("Sales went up in the north.")
    table = document.add_table(rows=2, cols=3)
    table.cell(0, 0).merge(table.cell(0, 1)).text = "Region"
    table.cell(0, 2).text = "Sales"
    table.cell(1, 0).text = "North"
    table.cell(1, 2).text = "1200"
    document.add_heading("Outlook", level=2)
    document.add_paragraph("More of the same.")
    document.save(str(path))
    return path


async def test_pictures_sound_and_video_are_the_callers(tmp_path: Path) -> None:
    (tmp_path / "photo.png").write_bytes(PNG)
    (tmp_path / "voice.oga").write_bytes(b"OggS\x00\x02" + bytes(100))
    assert await read_document(tmp_path / "photo.png", "image/png", DocumentLimits()) is None
    assert await read_document(tmp_path / "voice.oga", None, DocumentLimits()) is None
    assert no_text_files(tmp_path)


def test_the_gateway_never_imports_the_parsers() -> None:
    probe = (
        "import sys, nanobot.media.documents\n"
        "print(sorted(m for m in ('pypdf', 'docx', 'openpyxl', 'pptx', 'lxml', 'zipfile')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- each kind -------------------------------------------------------------------------------


async def test_a_pdf_page_by_page_into_a_text_file_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf_bytes(["First page: revenue grew.", "Second page: costs fell.", "End."]))
    extracted = await read(path, "application/pdf")
    assert extracted.shape == "3 pages"
    assert extracted.text_path == tmp_path / "report.pdf.txt"
    text = whole_text(extracted)
    assert extracted.cut == 0 and extracted.head == text
    assert text.index("--- page 1 of 3 ---") < text.index("revenue grew")
    assert text.index("--- page 2 of 3 ---") < text.index("costs fell") < text.index("page 3 of 3")


async def test_a_long_pdf_gives_its_first_pages_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "book.pdf"
    path.write_bytes(pdf_bytes([f"Chapter {number}." for number in range(1, 6)]))
    extracted = await read(path, max_pages=2)
    assert extracted.shape == "5 pages, the first 2 read"
    text = whole_text(extracted)
    assert "Chapter 2." in text and "Chapter 3." not in text
    assert text.rstrip().endswith("[only the first 2 pages are read: 3 more not]")


async def test_a_nanobot_package_in_the_working_directory_is_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = tmp_path / "nanobot" / "media"
    planted.mkdir(parents=True)
    (tmp_path / "nanobot" / "__init__.py").write_text("")
    (planted / "__init__.py").write_text("")
    marker = tmp_path / "ran"
    (planted / "_extract_worker.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.md").write_text("# real\n")
    assert whole_text(await read(tmp_path / "notes.md")) == "# real\n"
    assert not marker.exists()


async def test_an_existing_text_file_is_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf_bytes(["Fresh words."]))
    (tmp_path / "report.pdf.txt").write_text("the user's own file")
    extracted = await read(path)
    assert extracted.text_path == tmp_path / "report.pdf-1.txt"
    assert "Fresh words." in whole_text(extracted)
    assert (tmp_path / "report.pdf.txt").read_text() == "the user's own file"
    assert not [path for path in tmp_path.iterdir() if path.name.endswith(".part")]


async def test_a_pdf_with_only_an_owner_password_is_read(tmp_path: Path) -> None:
    writer = PdfWriter(clone_from=io.BytesIO(pdf_bytes(["Printing is restricted."])))
    writer.encrypt("", owner_password="owner", algorithm="AES-128")
    path = tmp_path / "restricted.pdf"
    with path.open("wb") as file:
        writer.write(file)
    assert "Printing is restricted." in whole_text(await read(path))


async def test_an_encrypted_pdf_is_refused_plainly(tmp_path: Path) -> None:
    writer = PdfWriter(clone_from=io.BytesIO(pdf_bytes(["Secret plans."])))
    writer.encrypt("hunter2", algorithm="AES-256")
    path = tmp_path / "secret.pdf"
    with path.open("wb") as file:
        writer.write(file)
    assert refused(await read(path)) == "the PDF is encrypted and needs a password"
    assert no_text_files(tmp_path)


async def test_a_truncated_pdf_is_reported_damaged(tmp_path: Path) -> None:
    data = pdf_bytes(["Half of this is gone."] * 3)
    path = tmp_path / "cut.pdf"
    path.write_bytes(data[: len(data) // 2])
    problem = refused(await read(path))
    assert problem.startswith("the file is damaged or not a valid PDF (")
    assert no_text_files(tmp_path)


async def test_a_docx_paragraphs_headings_and_tables_in_order(tmp_path: Path) -> None:
    extracted = await read(docx_file(tmp_path / "report.docx"))
    assert extracted.shape == "4 paragraphs, 1 table"
    lines = whole_text(extracted).splitlines()
    assert lines[:2] == ["# Quarterly report", "Sales went up in the north."]
    assert "Region\tSales" in lines  # the merged cell once
    assert "North\t\t1200" in lines  # an empty cell keeps its column
    assert lines.index("North\t\t1200") < lines.index("## Outlook")


async def test_an_xlsx_sheet_by_sheet(tmp_path: Path) -> None:
    book = openpyxl.Workbook()
    sales = book.active
    assert sales is not None
    sales.title = "Sales"
    sales.append(["Region", "Amount", "Day"])
    sales.append(["North", 0.1 + 0.2, date(2026, 3, 1)])
    book.create_sheet("Notes").append(["checked", True])
    path = tmp_path / "book.xlsx"
    book.save(path)
    extracted = await read(path)
    assert extracted.shape == "2 sheets"
    assert whole_text(extracted).splitlines() == [
        "=== sheet: Sales ===",
        "Region\tAmount\tDay",
        "North\t0.3\t2026-03-01T00:00:00",
        "",
        "=== sheet: Notes ===",
        "checked\tTRUE",
        "",
    ]


async def test_a_sheet_that_misstates_its_extent_is_read_whole(tmp_path: Path) -> None:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(["a", "b", "c"])
    sheet.append(["d", "e", "f"])
    written = tmp_path / "written.xlsx"
    book.save(written)
    path = tmp_path / "misstated.xlsx"
    with zipfile.ZipFile(written) as source, zipfile.ZipFile(path, "w") as target:
        for member in source.infolist():
            data = source.read(member)
            if member.filename == "xl/worksheets/sheet1.xml":
                assert b'<dimension ref="A1:C2"/>' in data
                data = data.replace(b'<dimension ref="A1:C2"/>', b'<dimension ref="A1:A1"/>')
            target.writestr(member, data)
    assert whole_text(await read(path)).splitlines()[1:3] == ["a\tb\tc", "d\te\tf"]


async def test_a_huge_spreadsheet_gives_its_first_sheets_and_rows_and_says_so(
    tmp_path: Path,
) -> None:
    book = openpyxl.Workbook(write_only=True)
    for number in range(1, 5):
        sheet = book.create_sheet(f"S{number}")
        for row in range(120):
            sheet.append([number, row])
    path = tmp_path / "big.xlsx"
    book.save(path)
    extracted = await read(path, max_sheets=2, max_rows=50)
    assert extracted.shape == "4 sheets, 2 shown, at most 50 rows of each"
    text = whole_text(extracted)
    assert text.count("[this sheet goes on past row 50: the rest is not shown]") == 2
    assert "1\t49" in text and "1\t50" not in text
    assert "=== sheet: S3 ===" not in text
    assert text.rstrip().endswith("[only the first 2 sheets are read; not: S3, S4]")


async def test_a_pptx_slide_by_slide_with_tables_and_notes(tmp_path: Path) -> None:
    deck = pptx.Presentation()
    first = deck.slides.add_slide(deck.slide_layouts[1])
    assert first.shapes.title is not None
    first.shapes.title.text = "Plan"
    first.placeholders[1].text_frame.text = "Hire two people\nShip in May"
    first.notes_slide.notes_text_frame.text = "Say it slowly"
    second = deck.slides.add_slide(deck.slide_layouts[5])
    table = second.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(4), Inches(1)).table
    table.cell(0, 0).text, table.cell(0, 1).text = "Item", "Cost"
    table.cell(1, 0).text, table.cell(1, 1).text = "Laptop", "900"
    path = tmp_path / "deck.pptx"
    deck.save(str(path))
    extracted = await read(path)
    assert extracted.shape == "2 slides"
    lines = whole_text(extracted).splitlines()
    assert lines[:5] == [
        "--- slide 1 of 2 ---",
        "Plan",
        "Hire two people",
        "Ship in May",
        "[notes] Say it slowly",
    ]
    assert lines[5] == "--- slide 2 of 2 ---"
    assert lines[-2:] == ["Item\tCost", "Laptop\t900"]


async def test_a_csv_as_tab_separated_rows(tmp_path: Path) -> None:
    path = tmp_path / "people.csv"
    path.write_text('name;city;note\nAnn;Paris;"likes; semicolons"\nBob;Rome;"two\nlines"\n')
    extracted = await read(path, "text/csv")
    assert extracted.shape == "3 rows"
    assert whole_text(extracted).splitlines() == [
        "name\tcity\tnote",
        "Ann\tParis\tlikes; semicolons",
        "Bob\tRome\ttwo lines",
    ]


async def test_a_long_tsv_gives_its_first_rows_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "log.tsv"
    path.write_text("".join(f"{number}\tok\n" for number in range(30)))
    extracted = await read(path, max_rows=10)
    assert extracted.shape == "more than 10 rows, the first 10 shown"
    assert whole_text(extracted).splitlines()[-2:] == [
        "9\tok",
        "[this file goes on past row 10: the rest is not shown]",
    ]


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("notes.md", "# Title\n\n- a *point*\n"),
        ("data.json", '{"name": "Zoë", "n": [1, 2]}\n'),
        ("config.yaml", "key: value\nlist:\n  - one\n"),
        ("main.py", "def f() -> int:\n\treturn 1\n"),
    ],
)
async def test_text_like_files_as_they_are(tmp_path: Path, name: str, content: str) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    extracted = await read(path)
    assert whole_text(extracted) == content
    lines = content.count("\n")
    assert extracted.shape == f"{lines} line{'s' if lines > 1 else ''}"


async def test_text_that_is_not_utf8_is_read_as_windows_1252(tmp_path: Path) -> None:
    path = tmp_path / "old.txt"
    path.write_bytes("café – naïve\n".encode("cp1252"))
    extracted = await read(path)
    assert whole_text(extracted) == "café – naïve\n"
    assert extracted.shape == "1 line, read as Windows-1252 (not UTF-8)"


async def test_utf8_with_a_bad_byte_stays_utf8(tmp_path: Path) -> None:
    path = tmp_path / "mostly.txt"
    path.write_bytes("Zoë – ok ".encode() + b"\xff" + " naïve\n".encode())
    extracted = await read(path)
    assert whole_text(extracted) == "Zoë – ok \ufffd naïve\n"
    assert extracted.shape == "1 line, read as UTF-8, some bytes in it not valid"


async def test_content_decides_over_the_name(tmp_path: Path) -> None:
    text = tmp_path / "notes.docx"
    text.write_text("just words\n")
    assert whole_text(await read(text)) == "just words\n"
    fake = tmp_path / "report.pdf"
    fake.write_bytes(bytes(range(256)))
    problem = refused(await read(fake, "application/pdf"))
    assert problem == "the file is damaged or not a valid PDF (it does not start like one)"


@pytest.mark.parametrize(
    ("name", "data", "problem"),
    [
        (
            "blob.bin",
            bytes(range(256)) * 4,
            "it is binary data (.bin), a kind of file nanobot does not read",
        ),
        (
            "old.doc",
            b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(600),
            "it is an old-format Word document (.doc), a kind of file nanobot does not read",
        ),
        (
            # The shape of an encrypted DOCX: an OLE2 file with an EncryptedPackage stream.
            "locked.docx",
            b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
            + bytes(2000)
            + "EncryptedPackage".encode("utf-16-le")
            + bytes(64),
            "the Office file is encrypted and needs a password",
        ),
    ],
)
async def test_unsupported_types_are_named(
    tmp_path: Path, name: str, data: bytes, problem: str
) -> None:
    (tmp_path / name).write_bytes(data)
    assert refused(await read(tmp_path / name)) == problem
    assert no_text_files(tmp_path)


async def test_a_zip_that_is_no_office_file_is_named(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "photos.zip", "w") as archive:
        archive.writestr("a.txt", "hello")
    problem = refused(await read(tmp_path / "photos.zip", "application/zip"))
    assert problem == "it is a ZIP archive (.zip), a kind of file nanobot does not read"


# -- what goes over a limit ------------------------------------------------------------------


async def test_a_long_text_is_cut_for_the_turn_and_kept_whole(tmp_path: Path) -> None:
    content = "".join(f"line {number}\n" for number in range(2000))
    path = tmp_path / "long.log"
    path.write_text(content)
    extracted = await read(path, max_chars=100)
    assert whole_text(extracted) == content
    assert extracted.head == content[:100]
    assert extracted.cut == len(content) - 100


async def test_past_max_text_chars_the_text_stops_with_a_note(tmp_path: Path) -> None:
    content = "word " * 1000
    path = tmp_path / "many.txt"
    path.write_text(content)
    extracted = await read(path, max_text_chars=1000)
    assert extracted.shape == "1 line, cut at 1,000 characters"
    text = whole_text(extracted)
    kept, note = text[:1000], text[1000:]
    assert kept == content[:1000]
    assert note == "\n[the text stops here: at most 1,000 characters of a document are kept]\n"


def docx_with_padding(path: Path, padding: int) -> Path:
    """A real DOCX, with a member of `padding` zero bytes (about 1/1000 of that on disk)."""
    docx_file(path)
    with (
        zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as archive,
        archive.open("word/media/padding.bin", "w") as member,
    ):
        chunk = bytes(1 << 20)
        for _ in range(padding >> 20):
            member.write(chunk)
    return path


async def test_a_decompression_bomb_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    path = docx_with_padding(tmp_path / "bomb.docx", 16 << 20)
    with zipfile.ZipFile(path) as archive:
        declared = sum(member.file_size for member in archive.infolist())
    assert path.stat().st_size < declared // 100
    problem = refused(await read(path, max_expanded_bytes=8 << 20))
    assert problem == (
        f"it would expand to {format_size(declared)}, past the 8 MB limit for Office files "
        "(a decompression bomb?); nothing of it was expanded"
    )
    assert no_text_files(tmp_path)
    assert whole_text(await read(path)).startswith("# Quarterly report")  # the limit, only


async def test_the_declared_sizes_decide(tmp_path: Path) -> None:
    """An XLSX whose central directory declares a 3 GB member: refused by that number."""
    book = openpyxl.Workbook()
    path = tmp_path / "sheet.xlsx"
    book.save(path)
    data = bytearray(path.read_bytes())
    entry = data.index(b"PK\x01\x02")  # the first central directory entry
    data[entry + 24 : entry + 28] = (3 << 30).to_bytes(4, "little")  # its uncompressed size
    path.write_bytes(bytes(data))
    problem = refused(await read(path))
    assert problem.startswith("it would expand to 3 GB, past the 200 MB limit for Office files")


async def test_a_document_that_needs_too_much_memory_is_stopped(tmp_path: Path) -> None:
    """A DOCX of 100 MB of XML (under the expansion limit) needs some 300 MB to parse."""
    docx_file(tmp_path / "seed.docx")
    paragraph = b"<w:p><w:r><w:t>" + b"x" * 1000 + b"</w:t></w:r></w:p>"
    path = tmp_path / "heavy.docx"
    with (
        zipfile.ZipFile(tmp_path / "seed.docx") as seed,
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as heavy,
    ):
        for member in seed.infolist():
            data = seed.read(member)
            if member.filename == "word/document.xml":
                body = data.index(b"<w:body>") + len(b"<w:body>")
                data = data[:body] + paragraph * 100_000 + data[body:]
            heavy.writestr(member.filename, data)
    problem = refused(await read(path, max_memory_bytes=200 << 20))
    assert problem == "reading it needed more than the 200 MB memory limit"
    assert no_text_files(tmp_path)


async def test_a_parser_kept_busy_is_stopped_at_the_time_limit(tmp_path: Path) -> None:
    path = slow_pdf(tmp_path / "busy.pdf")
    problem = refused(await read(path, timeout=1.0))
    assert problem == "reading it took longer than the 1-second time limit"
    assert workers() == []


def workers() -> list[int]:
    """This process's extraction workers still alive."""
    found = []
    for task in Path("/proc/self/task").iterdir():
        children = (task / "children").read_text().split()
        for pid in children:
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if WORKER.encode() in command:
                found.append(int(pid))
    return found


async def test_cancelling_kills_the_worker(tmp_path: Path) -> None:
    path = slow_pdf(tmp_path / "busy.pdf")
    reading = asyncio.create_task(read(path, timeout=60.0))
    for _ in range(3000):  # until the worker runs (it has a minute's work)
        if started := workers():
            break
        await asyncio.sleep(0.01)
    assert started
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert workers() == []
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped, not a zombie


async def test_a_missing_file_or_a_link_out_is_not_opened(tmp_path: Path) -> None:
    assert refused(await read(tmp_path / "gone.pdf")) == (
        "it could not be opened (no such file or directory)"
    )
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (tmp_path / "secret.txt").write_text("not for the model")
    (inbox / "link.md").symlink_to(tmp_path / "secret.txt")
    problem = refused(await read(inbox / "link.md"))
    assert problem.startswith("it could not be opened (")
    assert no_text_files(inbox)
