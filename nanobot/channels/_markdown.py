"""Markdown to Telegram's HTML subset, through markdown-it-py's syntax tree.

Telegram accepts a handful of tags (b, i, u, s, a href, code, pre, blockquote, tg-spoiler)
and refuses a whole message whose HTML it cannot parse, so every piece of the model's text is
escaped and only tags from that set are produced. Raw HTML in the Markdown is text: the
model's `<b>` is shown as written, never obeyed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

SAFE_SCHEMES = frozenset({"http", "https", "mailto", "tg", "ftp"})
RULE = "———"
MAX_NESTING = 40

_SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*):")
_LANGUAGE = re.compile(r"[\w+#.-]{1,32}")
_WRAP = {"strong": "b", "em": "i", "s": "s"}
_BREAKS = frozenset({"softbreak", "hardbreak"})


class _Parser(MarkdownIt):
    """CommonMark plus tables and strikethrough, raw HTML and reference definitions off,
    every link target accepted.

    With raw HTML off, `<` is ordinary text everywhere, so a stray `<br>` line cannot start an
    HTML block that would swallow the Markdown after it. markdown-it refuses a `javascript:`
    link by not parsing it at all, which would show the whole `[text](url)` source; accepting
    every target lets the renderer drop an unsafe URL and keep the text.
    """

    def __init__(self) -> None:
        super().__init__("commonmark", {"html": False, "maxNesting": MAX_NESTING})
        self.enable(["strikethrough", "table"])
        # A reference definition (`[1]: https://…`) renders as nothing; unused, its URL would
        # vanish. Shown as text, nothing is lost.
        self.disable("reference")

    def validateLink(self, url: str) -> bool:
        return True


_PARSER = _Parser()


def escape(text: str) -> str:
    """Text as Telegram HTML: `&`, `<` and `>` become the entities Telegram knows."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape_attribute(text: str) -> str:
    """Text for a double-quoted attribute value: `escape` plus `&quot;`."""
    return escape(text).replace('"', "&quot;")


def to_telegram_html(markdown: str) -> str:
    """Render Markdown as Telegram HTML: blocks separated by a blank line, no outer tags.

    Never raises on any input; the result only holds tags Telegram accepts, balanced, and
    every character of text outside them is escaped.
    """
    tokens = _PARSER.parse(markdown)
    if any(token.level >= MAX_NESTING - 1 for token in tokens):
        # markdown-it silently skips whatever lies deeper than its nesting limit.
        return escape(markdown.replace("\r\n", "\n").strip())
    return _blocks(SyntaxTreeNode(tokens).children, "\n\n", quoted=False)


def _blocks(nodes: Sequence[SyntaxTreeNode], separator: str, *, quoted: bool) -> str:
    rendered = (_block(node, quoted=quoted) for node in nodes)
    return separator.join(block for block in rendered if block)


def _block(node: SyntaxTreeNode, *, quoted: bool) -> str:
    render = _BLOCK_RENDERERS.get(node.type)
    # Anything else (html_block if raw HTML is ever enabled) shows its source as text.
    return render(node, quoted) if render else escape(node.content.rstrip("\n"))


def _paragraph(node: SyntaxTreeNode, quoted: bool) -> str:
    return _inline(node.children[0].children)


def _heading(node: SyntaxTreeNode, quoted: bool) -> str:
    text = _inline(node.children[0].children)
    return f"<b>{text}</b>" if text else ""


def _quote(node: SyntaxTreeNode, quoted: bool) -> str:
    inner = _blocks(node.children, "\n\n", quoted=True)
    # Telegram cannot nest blockquotes; an inner quote reads fine inside the outer one.
    return inner if quoted or not inner else f"<blockquote>{inner}</blockquote>"


def _rule(node: SyntaxTreeNode, quoted: bool) -> str:
    return RULE


def _code(node: SyntaxTreeNode, quoted: bool) -> str:
    if not node.content.strip():
        return ""
    body = escape(node.content.removesuffix("\n"))
    words = node.info.split(maxsplit=1)
    if words and _LANGUAGE.fullmatch(words[0]):
        return f'<pre><code class="language-{words[0]}">{body}</code></pre>'
    return f"<pre><code>{body}</code></pre>"


def _list(node: SyntaxTreeNode, quoted: bool) -> str:
    # markdown-it hides the paragraphs of a tight list: its items go one per line.
    loose = any(
        child.type == "paragraph" and not child.hidden
        for item in node.children
        for child in item.children
    )
    separator = "\n\n" if loose else "\n"
    first = int(node.attrs.get("start", 1))
    items = []
    for offset, item in enumerate(node.children):
        marker = f"{first + offset}. " if node.type == "ordered_list" else "• "
        body = _blocks(item.children, separator, quoted=quoted)
        items.append(marker + _indent(body, " " * len(marker)))
    return separator.join(items)


def _indent(text: str, pad: str) -> str:
    """Indent every line but the first, except inside `<pre>`, where spaces would be code."""
    lines = text.split("\n")
    depth = lines[0].count("<pre>") - lines[0].count("</pre>")
    out = [lines[0]]
    for line in lines[1:]:
        out.append(pad + line if line and depth == 0 else line)
        depth += line.count("<pre>") - line.count("</pre>")
    return "\n".join(out)


def _table(node: SyntaxTreeNode, quoted: bool) -> str:
    """A table as aligned plain text in `<pre>`: Telegram has no table markup.

    markdown-it gives every row as many cells as the header, each with an inline child.
    """
    rows = [
        [_plain(cell.children[0].children) for cell in row.children]
        for section in node.children
        for row in section.children
    ]
    header = node.children[0].children[0].children
    aligns = [str(cell.attrs.get("style", "")) for cell in header]
    widths = [max(len(row[column]) for row in rows) for column in range(len(aligns))]
    lines = [" | ".join(map(_align, row, widths, aligns)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return f"<pre>{escape(chr(10).join(lines))}</pre>"


def _align(text: str, width: int, style: str) -> str:
    if style.endswith("right"):
        return text.rjust(width)
    if style.endswith("center"):
        return text.center(width)
    return text.ljust(width)


def _inline(nodes: Sequence[SyntaxTreeNode], *, in_link: bool = False) -> str:
    return "".join(_span(node, in_link=in_link) for node in nodes)


def _span(node: SyntaxTreeNode, *, in_link: bool) -> str:
    kind = node.type
    if kind in _BREAKS:
        return "\n"
    if kind == "code_inline":
        # Telegram cannot nest code in a link, so there it is plain text.
        code = escape(node.content)
        return code if in_link else f"<code>{code}</code>"
    if kind in _WRAP:
        tag = _WRAP[kind]
        return f"<{tag}>{_inline(node.children, in_link=in_link)}</{tag}>"
    if kind == "link":
        label = _inline(node.children, in_link=True)
        return _link(str(node.attrs.get("href", "")), label, in_link=in_link)
    if kind == "image":
        source = str(node.attrs.get("src", ""))
        return _link(source, escape(_plain(node.children)), in_link=in_link)
    # text, and anything unexpected (html_inline if raw HTML is ever enabled): as written.
    return escape(node.content)


def _link(href: str, label: str, *, in_link: bool) -> str:
    scheme = _SCHEME.match(href)
    if in_link or scheme is None or scheme.group(1).lower() not in SAFE_SCHEMES:
        return label
    return f'<a href="{escape_attribute(href)}">{label or escape(href)}</a>'


_BLOCK_RENDERERS: dict[str, Callable[[SyntaxTreeNode, bool], str]] = {
    "paragraph": _paragraph,
    "heading": _heading,
    "fence": _code,
    "code_block": _code,
    "bullet_list": _list,
    "ordered_list": _list,
    "blockquote": _quote,
    "table": _table,
    "hr": _rule,
}


def _plain(nodes: Sequence[SyntaxTreeNode]) -> str:
    """The text a reader sees in inline nodes, without any formatting."""
    parts = []
    for node in nodes:
        if node.type in _BREAKS:
            parts.append(" ")
        elif node.children:
            parts.append(_plain(node.children))
        else:
            parts.append(node.content)
    return "".join(parts)
