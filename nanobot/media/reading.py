"""A person's message as the model reads it once its files are read: voice notes heard,
documents' text taken out, every other file named with where it was saved.

Voice notes (and Telegram's round video notes) are the sender's own words: their transcript
is the message, marked as spoken, with its length. An audio file may be anyone's voice, and
a document anyone's text: both are content from outside, inside the untrusted-content
markers. A file nothing can be read from is named, with why, so that nothing a person sent
is silently dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from nanobot.bus.events import Attachment
from nanobot.media.documents import DocumentLimits, Extracted, read_document
from nanobot.media.voice import Transcriber, clock
from nanobot.tools.base import untrusted

SPOKEN: Final = frozenset({"voice", "audio", "video_note"})
# What a person says themselves: a turn that reads it has taken in nothing from outside.
OWN_WORDS: Final = frozenset({"voice", "video_note"})
_LABELS: Final = {"voice": "voice note", "audio": "audio file", "video_note": "video note"}


@dataclass(frozen=True, slots=True)
class Read:
    """The turn's text; `problems`, lines to tell the sender at once (a note that could not
    be heard); `said`, whether the model has anything to answer (besides those problems)."""

    text: str
    problems: tuple[str, ...] = ()
    said: bool = True
    heard: int = 0  # notes transcribed


@dataclass(frozen=True, slots=True)
class _Part:
    line: str
    problem: str | None = None
    said: bool = True
    heard: bool = False


class Reader:
    """Reads the files of a message. `documents` None: documents are only named; at most
    `parallel` are read at once, by all callers together (each reader is a process of its
    own, of up to `documents.max_memory_bytes`)."""

    def __init__(
        self, transcriber: Transcriber, documents: DocumentLimits | None, *, parallel: int = 2
    ) -> None:
        self._transcriber = transcriber
        self._documents = documents
        self._readers = asyncio.Semaphore(parallel)

    @property
    def model(self) -> str | None:
        """The model that hears voice notes (None: none is configured)."""
        return self._transcriber.model

    async def read(self, text: str, attachments: Sequence[Attachment]) -> Read:
        """`text` (a caption, or the message) with what its `attachments` say, in order.
        All are read at once. Never raises for a file: each failure is said in the text (and,
        for a voice note, in `problems`). Cancellable."""
        if not attachments:
            return Read(text)
        parts = await asyncio.gather(*(self._part(a) for a in attachments))
        lines = [text] if text else []
        lines += [part.line for part in parts]
        return Read(
            "\n".join(lines),
            tuple(part.problem for part in parts if part.problem),
            bool(text.strip()) or any(part.said for part in parts),
            sum(part.heard for part in parts),
        )

    async def _part(self, attachment: Attachment) -> _Part:
        if attachment.kind in SPOKEN:
            return await self._spoken(attachment)
        if attachment.kind in ("document", "file") and self._documents is not None:
            async with self._readers:  # the time limit starts once it is its turn
                extracted = await read_document(
                    attachment.path, attachment.mime_type, self._documents
                )
            if extracted is not None:
                return _Part(_document(attachment, extracted))
        return _Part(named(attachment))

    async def _spoken(self, attachment: Attachment) -> _Part:
        label = _LABELS[attachment.kind]
        length = f", {clock(attachment.duration)}" if attachment.duration is not None else ""
        heard = await self._transcriber.hear(attachment)
        if heard.text is None:
            where = f"saved as {attachment.path}"
            line = f"[{label}{length} received, {where}; not transcribed: {heard.problem}]"
            problem = f"I could not transcribe your {label}: {heard.problem}."
            return _Part(line, problem, said=False)
        words = heard.text or "(no words were heard in it)"
        head = f"[{label}{length}, spoken; its transcript follows (saved as {attachment.path})]"
        if attachment.kind not in OWN_WORDS:
            words = untrusted(f"the transcript of {attachment.path.name}, sent in the chat", words)
        return _Part(f"{head}\n{words}", heard=True)


def named(attachment: Attachment) -> str:
    """The line that says a file arrived and where it is."""
    return (
        f"[{attachment.kind} received, saved as {attachment.path} "
        f"({attachment.size} bytes, {attachment.mime_type or 'unknown type'})]"
    )


def listed(text: str, attachments: Sequence[Attachment]) -> str:
    """`text` with a line naming each of `attachments` (nothing read from them)."""
    return "\n".join([*([text] if text else []), *(named(a) for a in attachments)])


def _document(attachment: Attachment, extracted: Extracted) -> str:
    name = attachment.path.name
    if extracted.problem is not None or extracted.text_path is None:
        why = extracted.problem or "nothing could be read from it"
        return f"[document {name} received, saved as {attachment.path}; not read: {why}]"
    shown = (
        f"the first {len(extracted.head):,} characters below"
        if extracted.cut
        else "all of it below"
    )
    head = (
        f"[document {name} received, saved as {attachment.path} ({extracted.shape}); its text "
        f"is in {extracted.text_path} ({extracted.total_chars:,} characters, {shown})]"
    )
    body = untrusted(f"the document {name}, sent in the chat", extracted.head)
    return f"{head}\n{body}"
