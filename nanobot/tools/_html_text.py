"""The readable text of an HTML page: title first, then headings and paragraphs.

Built on the standard library's tolerant `html.parser`. What is not content (scripts,
styles, navigation, embedded media) is dropped; block elements become paragraph breaks and
headings keep a Markdown-style marker so the page's structure survives. CPU-bound on large
pages, so callers run it in a thread.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

_SKIPPED = frozenset(
    {"script", "style", "noscript", "nav", "template", "svg", "canvas", "iframe", "head", "object"}
)
_HEADINGS = {f"h{level}": level for level in range(1, 7)}
_BLOCKS = frozenset(
    {
        "address", "article", "aside", "blockquote", "dd", "details", "div", "dl", "dt",
        "figcaption", "figure", "footer", "form", "header", "hr", "main", "ol", "p", "section",
        "summary", "table", "tr", "ul",
    }
)  # fmt: skip
_SPACES = re.compile(r"\s+")


def html_to_text(page: str) -> str:
    """Readable text of `page`: its title, a blank line, then the body's text."""
    parser = _TextExtractor()
    parser.feed(page)
    parser.close()
    return parser.text()


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._title: list[str] = []
        self._parts: list[str] = []
        self._in_title = False
        self._skipping = 0  # depth inside elements whose content is dropped
        self._in_pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in _SKIPPED:
            self._skipping += 1
        elif self._skipping:
            return
        elif tag in _HEADINGS:
            self._break("\n\n")
            self._parts.append("#" * _HEADINGS[tag] + " ")
        elif tag == "li":
            self._break("\n")
            self._parts.append("- ")
        elif tag in ("br", "td", "th"):
            self._break("\n" if tag == "br" else " ")
        elif tag == "pre":
            self._break("\n\n")
            self._in_pre += 1
        elif tag in _BLOCKS:
            self._break("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in _SKIPPED:
            self._skipping = max(0, self._skipping - 1)
        elif self._skipping:
            return
        elif tag == "pre":
            self._in_pre = max(0, self._in_pre - 1)
            self._break("\n\n")
        elif tag in _HEADINGS or tag in _BLOCKS:
            self._break("\n\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self._title.append(data)
        elif self._skipping:
            return
        elif self._in_pre:
            self._parts.append(data)
        else:
            text = _SPACES.sub(" ", data)
            if not self._parts or self._parts[-1].endswith(("\n", "- ", "# ")):
                text = text.lstrip()
            if text:
                self._parts.append(text)

    def _break(self, separator: str) -> None:
        if not self._parts or (separator == " " and self._parts[-1][-1:].isspace()):
            return
        self._parts.append(separator)

    def text(self) -> str:
        body = "".join(self._parts)
        body = re.sub(r"[ \t]+\n", "\n", body)
        body = re.sub(r"\n{3,}", "\n\n", body).strip()
        title = " ".join("".join(self._title).split())
        return f"{title}\n\n{body}" if title and body else title or body
