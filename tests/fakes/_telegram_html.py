"""Telegram's ``parse_mode=HTML``, as the Bot API server parses it (tdlib's ``parse_html``).

``parse_html(text)`` returns the visible text and the Bot API entities (offsets and
lengths in UTF-16 code units) or raises ``HtmlError`` whose message is Telegram's
reason, e.g. ``Unsupported start tag "foo" at byte offset 4`` (byte offsets are into
the UTF-8 text). Following tdlib: tags are a, b/strong, i/em, u/ins, s/strike/del,
code, pre, span class="tg-spoiler", tg-spoiler, tg-emoji emoji-id, blockquote
[expandable]; attributes may be unquoted; ``</>`` closes any tag; only &lt; &gt;
&amp; &quot; and numeric references are decoded (``&lt`` without ``;`` too).
Telegram keeps any other ``&`` literally; with ``strict=True`` (the default) such a
bare ``&`` is an error, because Telegram's docs require ``&amp;`` and a renderer that
forgets it also corrupts text like ``&lt;``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]
TAGS = frozenset(
    [
        "a",
        "b",
        "strong",
        "i",
        "em",
        "u",
        "ins",
        "s",
        "strike",
        "del",
        "code",
        "pre",
        "span",
        "tg-spoiler",
        "tg-emoji",
        "blockquote",
    ]
)
_SIMPLE = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "span": "spoiler",
    "tg-spoiler": "spoiler",
}
_NAMED = {b"lt": ord("<"), b"gt": ord(">"), b"amp": ord("&"), b"quot": ord('"')}
_SPACE = frozenset(b" \t\r\n\v\f\0")
_HEX = b"0123456789abcdefABCDEF"
_SURROGATES = (
    "Text contains invalid Unicode characters after decoding HTML entities, "
    "check for unmatched surrogate code units"
)


class HtmlError(ValueError):
    """Telegram's reason for rejecting the markup (what follows "can't parse entities: ")."""


@dataclass(frozen=True)
class Parsed:
    """The visible text and its entities, as Telegram stores the message."""

    text: str
    entities: list[JSON]


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, the unit of Telegram's limits and entity offsets."""
    return len(text.encode("utf-16-le")) // 2


@dataclass
class _Open:
    tag: str
    argument: str
    offset: int  # UTF-16 offset in the visible text
    start: int  # byte offset in the visible text


class _Parser:
    def __init__(self, source: str, strict: bool) -> None:
        self.src = source.encode()
        self.strict = strict
        self.out = bytearray()
        self.offset = 0
        self.entities: list[JSON] = []
        self.stack: list[_Open] = []
        self.bad_surrogate = False

    def at(self, i: int) -> int:
        return self.src[i] if i < len(self.src) else 0

    def entity(self, pos: int) -> tuple[int, int]:
        """Decode a character reference at ``pos``: (code point or 0, position after it)."""
        end, value = pos + 1, 0
        if self.at(end) == ord("#"):
            end += 1
            digits, base = (b"0123456789", 10)
            if self.at(end) == ord("x"):
                end, digits, base = end + 1, _HEX, 16
            start = end
            while self.at(end) and self.at(end) in digits:
                end += 1
            value = int(self.src[start:end], base) if end > start else 0
            if value == 0 or value >= 0x10FFFF or end - pos >= 10:
                return 0, pos
        else:
            while chr(self.at(end)).isascii() and chr(self.at(end)).isalpha():
                end += 1
            value = _NAMED.get(bytes(self.src[pos + 1 : end]), 0)
            if not value:
                return 0, pos
        return value, end + 1 if self.at(end) == ord(";") else end

    def append(self, code: int, into: bytearray) -> None:
        if 0xD800 <= code <= 0xDFFF:
            self.bad_surrogate = True
            return
        into += chr(code).encode()

    def parse(self) -> Parsed:
        i = 0
        while i < len(self.src):
            c = self.src[i]
            if c == ord("&"):
                code, after = self.entity(i)
                if code:
                    self.offset += 1 + (code > 0xFFFF)
                    self.append(code, self.out)
                    i = after
                    continue
                if self.strict:
                    raise HtmlError(f'Unescaped "&" at byte offset {i}; write it as "&amp;"')
            if c != ord("<"):
                if c & 0xC0 != 0x80:  # the first byte of a character
                    self.offset += 1 + (c >= 0xF0)  # 4 bytes: a surrogate pair
                self.out.append(c)
                i += 1
                continue
            i = self.end_tag(i) if self.at(i + 1) == ord("/") else self.start_tag(i)
        if self.stack:
            tag = self.stack[-1].tag
            raise HtmlError(f'Can\'t find end tag corresponding to start tag "{tag}"')
        if self.bad_surrogate:
            raise HtmlError(_SURROGATES)
        self.entities.sort(key=lambda e: (e["offset"], -e["length"]))
        return Parsed(self.out.decode(), self.entities)

    def start_tag(self, begin: int) -> int:
        """Parse ``<tag attr=value ...>`` at ``begin``; returns the index after ``>``."""
        i = begin + 1
        while self.at(i) not in _SPACE and self.at(i) != ord(">"):
            i += 1
        if not self.at(i):
            raise HtmlError(f"Unclosed start tag at byte offset {begin}")
        tag = self.src[begin + 1 : i].decode(errors="replace").lower()
        if tag not in TAGS:
            raise HtmlError(f'Unsupported start tag "{tag}" at byte offset {begin}')
        argument = ""
        while self.at(i) != ord(">"):
            while self.at(i) and self.at(i) in _SPACE:
                i += 1
            if self.at(i) != ord(">"):
                argument, i = self.attribute(tag, begin, i, argument)
        if tag == "span" and argument != "spoiler":
            raise HtmlError(f'Tag "span" must have class "tg-spoiler" at byte offset {begin}')
        self.stack.append(_Open(tag, argument, self.offset, len(self.out)))
        return i + 1

    def attribute(self, tag: str, begin: int, i: int, argument: str) -> tuple[str, int]:
        """Parse one ``name=value`` at ``i``: (the tag's argument after it, next index)."""
        name_start = i
        while self.at(i) not in _SPACE and self.at(i) not in b"=>":
            i += 1
        name = self.src[name_start:i].decode(errors="replace")
        if not name:
            raise HtmlError(f'Empty attribute name in the tag "{tag}" at byte offset {begin}')
        while self.at(i) and self.at(i) in _SPACE:
            i += 1
        if self.at(i) != ord("="):
            if tag == "blockquote" and name == "expandable":
                return "1", i
            raise HtmlError(
                "Expected equal sign in declaration of an attribute of the tag "
                f'"{tag}" at byte offset {begin}'
            )
        i += 1
        while self.at(i) and self.at(i) in _SPACE:
            i += 1
        if not self.at(i):
            raise HtmlError(f'Unclosed start tag "{tag}" at byte offset {begin}')
        value, i = self.attribute_value(i)
        if not self.at(i):
            raise HtmlError(f"Unclosed start tag at byte offset {begin}")
        return _argument(tag, name, value, argument), i

    def attribute_value(self, i: int) -> tuple[str, int]:
        value = bytearray()
        quote = self.at(i)
        if quote not in b"'\"":  # a name token: letters, digits, periods, hyphens
            start = i
            while chr(self.at(i)).isascii() and (chr(self.at(i)).isalnum() or self.at(i) in b".-"):
                i += 1
            if self.at(i) not in _SPACE and self.at(i) != ord(">"):
                raise HtmlError(f"Unexpected end of name token at byte offset {start}")
            return self.src[start:i].decode().lower(), i
        i += 1
        while self.at(i) and self.at(i) != quote:
            if self.at(i) == ord("&"):
                code, after = self.entity(i)
                if code:
                    self.append(code, value)
                    i = after
                    continue
            value.append(self.at(i))
            i += 1
        if self.at(i) == quote:
            i += 1
        return value.decode(errors="replace"), i

    def end_tag(self, begin: int) -> int:
        """Parse ``</tag>`` (or ``</>``) at ``begin``; returns the index after ``>``."""
        if not self.stack:
            raise HtmlError(f"Unexpected end tag at byte offset {begin}")
        i = begin + 2
        while self.at(i) not in _SPACE and self.at(i) != ord(">"):
            i += 1
        name = self.src[begin + 2 : i].decode(errors="replace")
        while self.at(i) and self.at(i) in _SPACE:
            i += 1
        if self.at(i) != ord(">"):
            raise HtmlError(f"Unclosed end tag at byte offset {begin}")
        top = self.stack.pop()
        if name and name != top.tag:
            raise HtmlError(
                f'Unmatched end tag at byte offset {begin}, expected "</{top.tag}>", '
                f'found "</{name}>"'
            )
        if self.offset > top.offset:
            self.close(top)
        return i + 1

    def close(self, top: _Open) -> None:
        """Emit the entity of a closed tag (tdlib merges <pre><code class> into one)."""
        span: JSON = {"offset": top.offset, "length": self.offset - top.offset}
        last = self.entities[-1] if self.entities else {}
        same = last.get("offset") == span["offset"] and last.get("length") == span["length"]
        if top.tag in _SIMPLE:
            self.entities.append({"type": _SIMPLE[top.tag], **span})
        elif top.tag == "a":
            url = top.argument or self.out[top.start :].decode(errors="replace")
            if url and (top.argument or ("." in url and " " not in url)):
                self.entities.append({"type": "text_link", **span, "url": url})
        elif top.tag == "blockquote":
            kind = "expandable_blockquote" if top.argument else "blockquote"
            self.entities.append({"type": kind, **span})
        elif top.tag == "tg-emoji":
            if not top.argument.isdigit() or not 0 < int(top.argument) < 2**63:
                raise HtmlError("Invalid custom emoji identifier specified")
            self.entities.append({"type": "custom_emoji", **span, "custom_emoji_id": top.argument})
        elif top.tag == "pre" and same and last["type"] == "code" and last.get("language"):
            last["type"] = "pre"
        elif top.tag == "pre":
            self.entities.append({"type": "pre", **span})
        elif same and last["type"] == "pre" and top.argument:  # <code> inside <pre>
            last["language"] = top.argument
        else:  # code; its language only counts inside <pre>
            language = {"language": top.argument} if top.argument else {}
            self.entities.append({"type": "code", **span, **language})


def _argument(tag: str, name: str, value: str, current: str) -> str:
    """The tag's argument (href, language, spoiler class, emoji id) after one attribute."""
    if tag == "a" and name == "href":
        return value
    if tag == "code" and name == "class" and value.startswith("language-"):
        return value.removeprefix("language-")
    if tag == "span" and name == "class" and value.startswith("tg-"):
        return value.removeprefix("tg-")
    if tag == "tg-emoji" and name == "emoji-id":
        return value
    if tag == "blockquote" and name == "expandable":
        return "1"
    return current


def parse_html(text: str, *, strict: bool = True) -> Parsed:
    """Parse Telegram HTML into visible text and entities; ``HtmlError`` if Telegram would not."""
    parsed = _Parser(text, strict).parse()
    for entity in parsed.entities:  # a language survives only on pre
        if entity["type"] == "code":
            entity.pop("language", None)
    return parsed
