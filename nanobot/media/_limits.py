"""How much reading one document may take (`documents.DocumentLimits`, defined apart so the
extraction worker has it without importing what only the gateway needs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class DocumentLimits:
    """How much reading one document may take.

    `max_chars`: the beginning of the text the caller gets (`Extracted.head`).
    `timeout` (seconds) and `max_memory_bytes` (the reader's whole address space, its
    interpreter and libraries included): past either, the reader is stopped.
    `max_expanded_bytes`: the most a DOCX/XLSX/PPTX may expand to, by its own declaration.
    `max_pages` (PDF pages, slides), `max_sheets`, `max_rows` (per sheet, and of a CSV) and
    `max_text_chars` (the whole text kept) bound what is read of a large document; the text
    then says what was left out.
    """

    max_chars: int = 16_000
    timeout: float = 30.0
    max_memory_bytes: int = 1 << 30
    max_expanded_bytes: int = 200 << 20
    max_pages: int = 2_000
    max_sheets: int = 20
    max_rows: int = 10_000
    max_text_chars: int = 5_000_000

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value > 0:
                raise ValueError(f"DocumentLimits.{name} must be positive, not {value!r}")
