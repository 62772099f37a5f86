"""Replies spoken: which replies a chat wants read aloud, what of a reply is read, and the
audio made of it by a speech model through litellm.

A chat's replies are spoken as its `/voice` choice says, else as its channel's
`voice_replies`: never, when the message answered was a voice note (or a round video
note), or always. What is read aloud is the reply without its code (fenced blocks, inline
code), tables, links' addresses and Markdown marks, up to `max_chars` (cut at the end of a
sentence, else of a word); the whole text is always delivered as well. The audio is kept
in the workspace under a name made from what was spoken and how, so a reply whose delivery
a restart cut short is not paid for twice, for `KEEP_SPOKEN` since it was last used (then
removed, at most once an hour as new audio is made). Its words are logged at DEBUG only.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Final

from loguru import logger

from nanobot.bus.events import InboundMessage, OutboundMessage
from nanobot.errors import ProviderError
from nanobot.media.reading import OWN_WORDS
from nanobot.providers.litellm_provider import speak
from nanobot.providers.provider import RetryPolicy, retried
from nanobot.store.chats import ChatSettings, VoiceMode
from nanobot.workspace import Workspace

SPOKEN_CHANNELS: Final = frozenset({"telegram", "discord"})  # the channels that send voice notes
VOICE_FOLDER: Final = Path("outbox") / "voice"
# As long as the journal remembers a reply (`JOURNAL_KEEP`): one delivered again within it
# finds its audio. A chat's audio is in the platform's history by then anyway.
KEEP_SPOKEN: Final = timedelta(days=7)
_PRUNE_EVERY: Final = 3600.0  # seconds between two looks for audio past KEEP_SPOKEN
_KEPT_NAME: Final = re.compile(r"[0-9a-f]{32}\.(?:ogg|mp3)")
_OGG: Final = b"OggS"
_MP3: Final = (b"ID3", b"\xff\xfb", b"\xff\xf3", b"\xff\xf2")  # a tag, or a frame's sync


@dataclass(frozen=True, slots=True)
class SpeechSettings:
    """`api_key` None: the provider's own variable. `max_total`: seconds for one reply's
    speech, its retries included."""

    model: str
    voice: str = "alloy"
    api_key: str | None = None
    api_base: str | None = None
    timeout: float = 120.0
    max_chars: int = 1500
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_total: float = 180.0


class VoiceReplies:
    """Which replies are spoken: each chat's `/voice` choice (kept in the store), else its
    channel's default (`defaults`; a channel not named there: off)."""

    def __init__(self, chats: ChatSettings, defaults: Mapping[str, VoiceMode]) -> None:
        self._chats = chats
        self._defaults = dict(defaults)

    def default(self, channel: str) -> VoiceMode:
        return self._defaults.get(channel, "off")

    def offered(self, channel: str) -> bool:
        """Whether replies on `channel` can be spoken at all (it sends voice notes)."""
        return channel in self._defaults

    async def mode(self, message: InboundMessage) -> tuple[VoiceMode | None, VoiceMode]:
        """What `message`'s chat chose (None: nothing), and its channel's default.

        Raises:
            StoreError: the chat's choice could not be read.
        """
        return await self._chats.voice(message.chat), self.default(message.chat.channel)

    async def choose(self, message: InboundMessage, mode: VoiceMode | None) -> None:
        """Keep `mode` as the choice of `message`'s chat (None: its channel's default).

        Raises:
            StoreError: it could not be kept.
        """
        await self._chats.set_voice(message.chat, mode, by=message.sender_id)

    async def speaks(self, message: InboundMessage) -> bool:
        """Whether the answer to `message` is to be spoken too: it goes to a chat of a
        channel that sends voice notes, whose mode says so for this message.

        Raises:
            StoreError: the chat's choice could not be read.
        """
        if not message.route.deliver or not self.offered(message.chat.channel):
            return False
        chosen, default = await self.mode(message)
        match chosen or default:
            case "always":
                return True
            case "when_spoken":
                return any(a.kind in OWN_WORDS for a in message.attachments)
        return False


class Speaker:
    """Makes the spoken form of replies (the channels' `Voices` port). Cancellable at any
    await: the request is dropped, and nothing half-written is kept."""

    def __init__(self, settings: SpeechSettings, workspace: Workspace) -> None:
        """`workspace`: where the audio is kept (under `outbox/voice/`), confined to it."""
        self._settings = settings
        self._workspace = workspace
        self._pruned_at: float | None = None  # monotonic; None: not yet since the start

    async def voice(self, message: OutboundMessage) -> Path | None:
        """The audio file of `message`'s text read aloud, made now or found made before;
        None when nothing of it can be spoken or the speech could not be made (logged: the
        text then goes alone). Never raises for the provider or the file."""
        settings = self._settings
        spoken = cut(speakable(message.text), settings.max_chars)
        what = f"reply {message.outbox_id}" if message.outbox_id is not None else "a reply"
        if not spoken:
            logger.info("{}: nothing in it to speak (code or tables only); text only", what)
            return None
        key = "\0".join((settings.model, settings.voice, spoken)).encode()
        stem = VOICE_FOLDER / hashlib.sha256(key).hexdigest()[:32]
        root = self._workspace.root
        try:
            kept = await asyncio.to_thread(self._kept, stem)
        except OSError as exc:
            logger.warning("{}: the kept speech could not be read ({}); made again", what, exc)
            kept = None
        if kept is not None:
            logger.info("{}: spoken before, kept as {}", what, kept)
            return root / kept
        audio = await self._made(what, spoken, len(message.text))
        if audio is None:
            return None
        suffix = _suffix(audio)
        if suffix is None:
            logger.warning(
                "{}: {} answered no OGG/Opus or MP3 audio ({} bytes, starting {!r}); text only",
                what,
                settings.model,
                len(audio),
                audio[:8],
            )
            return None
        path = stem.with_suffix(suffix)
        try:
            await asyncio.to_thread(self._workspace.replace, path, audio)
        except OSError as exc:
            logger.warning("{}: the speech could not be kept ({}); text only", what, exc)
            return None
        await self._prune_now_and_then()
        return root / path

    def _kept(self, stem: Path) -> Path | None:
        """The audio kept under `stem` (either format), if a non-empty file is there; found,
        it counts as used now (kept `KEEP_SPOKEN` more)."""
        for suffix in (".ogg", ".mp3"):
            try:
                fd, info = self._workspace.open_file(stem.with_suffix(suffix))
            except FileNotFoundError:
                continue
            try:
                if info.st_size:
                    os.utime(fd)
                    return stem.with_suffix(suffix)
            finally:
                os.close(fd)
        return None

    async def _prune_now_and_then(self) -> None:
        now = time.monotonic()
        if self._pruned_at is not None and now - self._pruned_at < _PRUNE_EVERY:
            return
        self._pruned_at = now
        try:
            removed = await asyncio.to_thread(self.prune, time.time())
        except OSError as exc:
            logger.warning("the spoken replies in {} could not be pruned: {}", VOICE_FOLDER, exc)
            return
        if removed:
            logger.info("removed {} spoken replies unused for {}", removed, KEEP_SPOKEN)

    def prune(self, now: float) -> int:
        """Remove the audio of replies not used for `KEEP_SPOKEN` before `now` (a time
        stamp); returns how many files went. Only the files this class names are touched,
        and never through a symlink. Blocking: run it in a thread.

        Raises:
            OSError: the folder cannot be read, or a file removed.
        """
        try:
            fd = self._workspace.open_dir(VOICE_FOLDER, follow=False)
        except FileNotFoundError:
            return 0
        removed = 0
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    if not _KEPT_NAME.fullmatch(entry.name):
                        continue
                    info = entry.stat(follow_symlinks=False)
                    old = now - info.st_mtime > KEEP_SPOKEN.total_seconds()
                    if old and stat.S_ISREG(info.st_mode):
                        os.unlink(entry.name, dir_fd=fd)
                        removed += 1
        finally:
            os.close(fd)
        return removed

    async def _made(self, what: str, spoken: str, total: int) -> bytes | None:
        settings = self._settings
        started = time.monotonic()
        try:
            audio = await retried(
                lambda: speak(
                    settings.model,
                    spoken,
                    voice=settings.voice,
                    api_key=settings.api_key,
                    api_base=settings.api_base,
                    seconds=settings.timeout,
                ),
                settings.retry,
                started + settings.max_total,
                f"speech {settings.model}",
            )
        except ProviderError as exc:
            logger.warning("{}: no speech made ({}); the text goes alone", what, exc)
            return None
        logger.info(
            "{} spoken by {} ({}) in {:.1f}s: {} of its {} characters, {} bytes of audio",
            what,
            settings.model,
            settings.voice,
            time.monotonic() - started,
            len(spoken),
            total,
            len(audio),
        )
        logger.debug("spoken for {}: {}", what, spoken)
        return audio


def _suffix(audio: bytes) -> str | None:
    if audio.startswith(_OGG):
        return ".ogg"
    return ".mp3" if audio.startswith(_MP3) else None


# ---- what of a reply is read aloud -------------------------------------------------------

_FENCE: Final = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})")
_TABLE_DELIMITER: Final = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
_INLINE: Final = (
    (re.compile(r"<!--.*?-->", re.S), ""),  # a comment
    (re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S), ""),  # inline code, however fenced
    (re.compile(r"!\[[^\]]*\]\([^)]*\)"), ""),  # an image
    (re.compile(r"\[([^\]]*)\]\([^)]*\)"), r"\1"),  # a link: its text
    (re.compile(r"<?https?://[^\s<>]*[^\s<>.,;:!?)\]'\"]>?"), ""),  # a bare address
    (re.compile(r"(\*\*|__|~~)(?=\S)(.+?)(?<=\S)\1"), r"\2"),  # bold, struck out
    (re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])"), r"\1"),  # italic
    (re.compile(r"(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)"), r"\1"),
)
_LINE_MARKS: Final = re.compile(r"^\s{0,3}(#{1,6}\s+|>\s?|[-*+]\s+)")
_RULE: Final = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")
_PARAGRAPH: Final = re.compile(r"\n\s*\n")
_LOOSE_STOP: Final = re.compile(r"\s+([.,;:!?])")  # left where code or an address was
_SENTENCE_END: Final = re.compile(r"[.!?…](?:[\"'”’)\]]*)(?=\s|$)|\n\s*\n")


def speakable(text: str) -> str:
    """What of a Markdown reply is read aloud: its prose, without code blocks, inline code,
    tables, images, links' addresses, bare URLs, comments, rules and the marks of headings,
    quotes, lists and emphasis; blanks collapsed, paragraphs kept apart. Empty when nothing
    of it can be spoken."""
    lines: list[str] = []
    fence: str | None = None
    source = text.splitlines()
    index = 0
    while index < len(source):
        line = source[index]
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            index += 1
            continue
        if opened:
            fence = opened.group(1)
            index += 1
            continue
        following = source[index + 1] if index + 1 < len(source) else ""
        if "|" in line and "|" in following and _TABLE_DELIMITER.match(following):
            index += 2
            while index < len(source) and "|" in source[index] and source[index].strip():
                index += 1
            lines.append("")
            continue
        lines.append("" if _RULE.match(line) else line)
        index += 1
    prose = "\n".join(lines)
    for pattern, replacement in _INLINE:
        prose = pattern.sub(replacement, prose)
    prose = "\n".join(_item(line) for line in prose.split("\n"))
    paragraphs = (_LOOSE_STOP.sub(r"\1", " ".join(p.split())) for p in _PARAGRAPH.split(prose))
    return "\n\n".join(p for p in paragraphs if any(c.isalnum() for c in p))


def _item(line: str) -> str:
    """A line without the mark of a heading, quote or list item; a heading or an item ends
    a sentence (a pause, read aloud) where it has no stop of its own."""
    bare = _LINE_MARKS.sub("", line)
    if bare != line and bare.strip() and bare.rstrip()[-1].isalnum():
        return bare.rstrip() + "."
    return bare


def cut(text: str, limit: int) -> str:
    """`text`, or its beginning of at most `limit` characters ending with a sentence (or a
    paragraph) where one ends in its second half, else with a word there, else mid-word."""
    if len(text) <= limit:
        return text
    window = text[:limit]
    ends = [m.end() for m in _SENTENCE_END.finditer(window + " ")]
    ends = [end for end in ends if limit // 2 <= end <= limit]
    if ends:
        return window[: ends[-1]].rstrip()
    space = window.rfind(" ")
    if text[limit : limit + 1].isspace():
        space = limit
    return (window[:space] if space >= limit // 2 else window).rstrip()
