"""One reader per kind of document, run only in the extraction worker's process.

A reader takes the open file, a `Text` to add to and the limits, and returns the document's
shape in words ("12 pages"). It raises `Unreadable` for what it can say plainly (an
encrypted PDF); whatever else its library raises on a bad file the worker reports as damage.
Each library is imported inside its reader: a CSV never pays for lxml.

What goes into the text: PDF pages and slides each under a marker line; a DOCX's paragraphs
and tables in order (headings as Markdown headings); sheets and CSV rows as tab-separated
lines, each sheet under a header; a note in brackets wherever a limit left something out.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import date, datetime, time
from itertools import islice
from typing import TYPE_CHECKING, BinaryIO, Final

from nanobot.media._limits import DocumentLimits
from nanobot.workspace import ConfinementError, OutsideWorkspace

if TYPE_CHECKING:
    from docx.table import Table
    from pptx.shapes.base import BaseShape

_SNIFF_CSV: Final = 64 * 1024  # the sample csv.Sniffer sees
_CSV_DELIMITERS: Final = ",;\t|"
_FALLBACK_CODECS: Final = (("cp1252", "Windows-1252"), ("latin-1", "Latin-1"))
_BEYOND_ASCII: Final = re.compile("[^\x00-\x7f\ufffd]")


class Unreadable(Exception):
    """The document cannot be read; `problem` says why, as a phrase for a person."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class Text:
    """A document's text as its reader finds it, kept up to `limit` characters. Past that
    `full` is set and the rest is dropped; readers stop at their next look at `full`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chars = 0
        self.full = False
        self._pieces: list[str] = []

    def add(self, piece: str) -> None:
        room = self.limit - self.chars
        if len(piece) > room:
            piece = piece[:room]
            self.full = True
        self._pieces.append(piece)
        self.chars += len(piece)

    def line(self, piece: str = "") -> None:
        self.add(piece + "\n")

    def note(self, line: str) -> None:
        """A line saying what was left out, kept even past `limit`."""
        self._pieces.append(line + "\n")
        self.chars += len(line) + 1

    def value(self) -> str:
        return "".join(self._pieces)


Reader = Callable[[BinaryIO, Text, DocumentLimits], str]


def read_pdf(file: BinaryIO, text: Text, limits: DocumentLimits) -> str:
    from pypdf import PdfReader

    document = PdfReader(file)
    if document.is_encrypted:
        # Many PDFs are encrypted with an empty password, only to restrict printing or copying.
        try:
            opened = document.decrypt("")
        except Exception as exc:  # pypdf raises several kinds for ciphers it lacks
            raise Unreadable(
                f"the PDF is encrypted in a way nanobot cannot open ({brief(exc)})"
            ) from exc
        if not opened:
            raise Unreadable("the PDF is encrypted and needs a password")
    pages = len(document.pages)
    shown = min(pages, limits.max_pages)
    wordless = True
    for number, page in enumerate(islice(document.pages, shown), 1):
        if text.full:
            break
        text.line(f"--- page {number} of {pages} ---")
        try:
            words = page.extract_text()
        # One bad page (a broken font, a stream that ends early) should not cost the others;
        # pypdf raises all sorts on them, its own errors and Python's.
        except Exception as exc:  # noqa: BLE001
            text.line(f"[this page could not be read: {brief(exc)}]")
            continue
        wordless = wordless and not words.strip()
        text.line(words.strip())
    if shown < pages:
        text.line(f"[only the first {shown:,} pages are read: {pages - shown:,} more not]")
    shape = count(pages, "page") + (f", the first {shown:,} read" if shown < pages else "")
    return shape + (", no text in it (scanned images?)" if wordless and pages else "")


def read_docx(file: BinaryIO, text: Text, limits: DocumentLimits) -> str:
    import docx
    from docx.table import Table

    document = docx.Document(file)
    # Paragraph.style searches the styles part each time (seconds on a long document): each
    # paragraph's style id is looked up here instead.
    headings = {style.style_id: _heading(style.name) for style in document.styles}
    paragraphs = tables = 0
    for block in document.iter_inner_content():
        if text.full:
            break
        if isinstance(block, Table):
            tables += 1
            text.line()
            _lines(_table_rows(block), text)
            text.line()
        elif block.text.strip():
            paragraphs += 1
            text.line(headings.get(block._p.style or "", "") + block.text)
    return f"{count(paragraphs, 'paragraph')}, {count(tables, 'table')}"


def _heading(style: str | None) -> str:
    """The Markdown heading mark for a paragraph style's name ("Heading 2": "## ")."""
    level = (style or "").removeprefix("Heading ")
    if style == "Title":
        return "# "
    return "#" * int(level) + " " if level.isdigit() and 0 < int(level) < 10 else ""


def _table_rows(table: Table) -> Iterator[list[str]]:
    for row in table.rows:
        cells: list[str] = []
        seen = None
        for cell in row.cells:
            if cell._tc is not seen:  # a merged cell comes once for each column it spans
                cells.append(cell.text)
            seen = cell._tc
        yield cells


def read_xlsx(file: BinaryIO, text: Text, limits: DocumentLimits) -> str:
    from openpyxl import load_workbook

    book = load_workbook(file, read_only=True, data_only=True)
    try:
        sheets = book.worksheets
        shown = sheets[: limits.max_sheets]
        cut = False
        for sheet in shown:
            if text.full:
                break
            text.line(f"=== sheet: {sheet.title} ===")
            # Rows as the file has them, not padded to the extent it declares (which some
            # programs write wrong, up to the whole 16,384 × 1,048,576 grid).
            sheet.reset_dimensions()
            rows = sheet.iter_rows(values_only=True)
            cut = _rows(rows, text, limits.max_rows, "sheet")[1] or cut
            text.line()
        if len(shown) < len(sheets):
            rest = ", ".join(sheet.title for sheet in sheets[len(shown) :])
            text.line(f"[only the first {len(shown)} sheets are read; not: {rest}]")
    finally:
        book.close()
    shape = count(len(sheets), "sheet")
    if len(shown) < len(sheets):
        shape += f", {len(shown)} shown"
    return shape + (f", at most {limits.max_rows:,} rows of each" if cut else "")


def read_csv(file: BinaryIO, text: Text, limits: DocumentLimits) -> str:
    return _delimited(file, text, limits, None)


def read_tsv(file: BinaryIO, text: Text, limits: DocumentLimits) -> str:
    return _delimited(file, text, limits, "\t")


def _delimited(file: BinaryIO, text: Text, limits: DocumentLimits, delimiter: str | None) -> str:
    content, codec, more = decode(file, limits.max_text_chars)
    csv.field_size_limit(limits.max_text_chars)  # this process reads one file
    if delimiter is not None:
        rows = csv.reader(io.StringIO(content), delimiter=delimiter)
    else:
        try:
            dialect: type[csv.Dialect] = csv.Sniffer().sniff(
                content[:_SNIFF_CSV], delimiters=_CSV_DELIMITERS
            )
        except csv.Error:  # one column, or no pattern to see: commas
            dialect = csv.excel
        rows = csv.reader(io.StringIO(content), dialect)
    seen, cut = _rows(rows, text, limits.max_rows, "file")
    if more and not cut:
        text.full = True
    shape = f"more than {seen:,} rows, the first {seen:,} shown" if cut else count(seen, "row")
    return shape + (f", {codec}" if codec else "")


def read_text(file: BinaryIO, text: Text, limits: DocumentLimits) -> str:
    content, codec, more = decode(file, limits.max_text_chars)
    text.add(content)
    if more:
        text.full = True
    lines = content.count("\n") + (not content.endswith("\n") if content else 0)
    shape = count(lines, "line") if content else "empty"
    return shape + (f", {codec}" if codec else "")


def read_pptx(file: BinaryIO, text: Text, limits: DocumentLimits) -> str:
    from pptx import Presentation

    slides = Presentation(file).slides
    shown = min(len(slides), limits.max_pages)
    for number, slide in enumerate(islice(slides, shown), 1):
        if text.full:
            break
        text.line(f"--- slide {number} of {len(slides)} ---")
        for shape in slide.shapes:
            _shape_text(shape, text)
        notes = slide.notes_slide.notes_text_frame if slide.has_notes_slide else None
        if notes is not None and notes.text.strip():
            text.line("[notes] " + _lines_of(notes.text))
    if shown < len(slides):
        text.line(f"[only the first {shown:,} slides are read: {len(slides) - shown:,} more not]")
    return count(len(slides), "slide") + (
        f", the first {shown:,} read" if shown < len(slides) else ""
    )


def _shape_text(shape: BaseShape, text: Text) -> None:
    from pptx.shapes.autoshape import Shape
    from pptx.shapes.graphfrm import GraphicFrame
    from pptx.shapes.group import GroupShape

    if isinstance(shape, GroupShape):
        for inner in shape.shapes:
            _shape_text(inner, text)
    elif isinstance(shape, Shape) and shape.has_text_frame and shape.text_frame.text.strip():
        text.line(_lines_of(shape.text_frame.text))
    elif isinstance(shape, GraphicFrame) and shape.has_table:
        _lines(([cell.text for cell in row.cells] for row in shape.table.rows), text)


def _lines_of(words: str) -> str:
    return words.replace("\v", "\n").strip()  # python-pptx gives a line break as \v


def decode(file: BinaryIO, limit: int) -> tuple[str, str | None, bool]:
    """The file's text, up to about `limit` characters; how it was read when that was not
    plain UTF-8 ("read as Windows-1252 (not UTF-8)"); whether the file goes on past what was
    read.

    UTF-8 with a few bad bytes stays UTF-8 (they become U+FFFD); anything else that is not
    UTF-8 is taken for Windows-1252, and failing that Latin-1, which reads any bytes."""
    raw = file.read(4 * limit)  # UTF-8 takes at most four bytes a character
    more = bool(file.read(1))
    codec = "utf-16" if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else "utf-8-sig"

    def decoded(name: str, errors: str = "strict") -> str:
        # Not final when the file goes on: a character cut at the end is dropped.
        return codecs.getincrementaldecoder(name)(errors).decode(raw, final=not more)

    try:
        return decoded(codec), None, more
    except UnicodeDecodeError:
        lenient = decoded(codec, "replace")
    if _BEYOND_ASCII.search(lenient):  # real UTF-8 sequences: a legacy encoding makes few
        return lenient, "read as UTF-8, some bytes in it not valid", more
    for name, label in _FALLBACK_CODECS:
        try:
            return decoded(name), f"read as {label} (not UTF-8)", more
        except UnicodeDecodeError:
            continue
    raise AssertionError("Latin-1 decodes any bytes")


def _rows(rows: Iterable[Sequence[object]], text: Text, most: int, what: str) -> tuple[int, bool]:
    """Rows as tab-separated lines (empty ones left out), at most `most`; how many were
    seen, and whether more were left."""
    seen = 0
    for row in rows:
        if seen == most:
            text.line(f"[this {what} goes on past row {most:,}: the rest is not shown]")
            return seen, True
        if text.full:
            break
        seen += 1
        _lines(((_cell(value) for value in row),), text)
    return seen, False


def _lines(rows: Iterable[Iterable[str]], text: Text) -> None:
    for row in rows:
        cells = [" ".join(cell.split()) for cell in row]  # a tab or newline would break the row
        while cells and not cells[-1]:
            cells.pop()
        if cells:
            text.line("\t".join(cells))


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        return f"{value:.15g}"  # as a spreadsheet shows it: 0.3, not 0.30000000000000004
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return str(value)


def count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def brief(exc: BaseException) -> str:
    """An exception in a few words: its message's first line, or its type."""
    words = str(exc.args[0] if len(exc.args) == 1 else exc).strip().splitlines()
    first = words[0][:200] if words else ""
    return first or type(exc).__name__


def os_reason(exc: OSError) -> str:
    """An `OSError` in a few words, for a person: "permission denied"."""
    if isinstance(exc, OutsideWorkspace):
        return "it is a link to a file outside its folder"
    if isinstance(exc, ConfinementError):
        return exc.reason
    return (exc.strerror or str(exc)).lower()
