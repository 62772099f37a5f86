"""Markdown rendered as Telegram HTML, and replies split to each platform's size."""

from __future__ import annotations

import random
import re
from html.parser import HTMLParser

import pytest

from nanobot.channels.render import (
    TELEGRAM_LIMIT,
    _split_atoms,
    plain_text,
    split_discord,
    split_plain,
    split_telegram,
    telegram_html,
    visible_length,
)

# --- checkers -------------------------------------------------------------------------------

ATTRIBUTES: dict[str, frozenset[str]] = {
    "b": frozenset(),
    "i": frozenset(),
    "u": frozenset(),
    "s": frozenset(),
    "a": frozenset({"href"}),
    "code": frozenset({"class"}),
    "pre": frozenset(),
    "blockquote": frozenset({"expandable"}),
    "tg-spoiler": frozenset(),
}
ENTITIES = frozenset({"lt", "gt", "amp", "quot"})


class TelegramChecker(HTMLParser):
    """Collects what Telegram's HTML parser would refuse: unknown tags or attributes, bad
    nesting, unbalanced tags, unknown entities, and bare `<`, `>` or `&` in text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.open: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        parent = self.open[-1] if self.open else ""
        if tag not in ATTRIBUTES or not names <= ATTRIBUTES[tag]:
            self.problems.append(f"<{tag} {names}> is not allowed")
        if tag == "a" and names != {"href"}:
            self.problems.append("<a> without href")
        if tag == "code" and names and (parent != "pre" or not dict(attrs)["class"]):
            self.problems.append("a code class outside pre")
        if parent in ("code", "pre") and not (parent == "pre" and tag == "code"):
            self.problems.append(f"<{tag}> inside <{parent}>")
        if tag in ("a", "blockquote") and tag in self.open:
            self.problems.append(f"nested <{tag}>")
        self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.problems.append(f"self-closing <{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open[-1] != tag:
            self.problems.append(f"</{tag}> does not close {self.open}")
        else:
            self.open.pop()

    def handle_entityref(self, name: str) -> None:
        if name not in ENTITIES:
            self.problems.append(f"&{name};")

    def handle_data(self, data: str) -> None:
        if set(data) & set("<>&"):
            self.problems.append(f"unescaped text {data!r}")

    def handle_comment(self, data: str) -> None:
        self.problems.append("a comment")

    def handle_decl(self, decl: str) -> None:
        self.problems.append("a declaration")


def telegram_problems(markup: str) -> list[str]:
    checker = TelegramChecker()
    checker.feed(markup)
    checker.close()
    if checker.open:
        checker.problems.append(f"unclosed {checker.open}")
    if "<" in re.sub(r"<[^<>]*>", "", markup) or re.search(r"&(?!#?\w+;)", markup):
        checker.problems.append("bare < or & in text")
    return checker.problems


def joined_by_whitespace(whole: str, pieces: list[str]) -> bool:
    """True if `whole` is exactly `pieces` in order, with only whitespace before, between and
    after them: what a splitter may drop is the separator at each split and blank pieces."""
    pattern = r"\s*" + r"\s*".join(map(re.escape, pieces)) + r"\s*"
    return re.fullmatch(pattern, whole) is not None


def fences_balanced(part: str) -> bool:
    """A ``` line opens a block (if nothing after the info has a backtick); a bare run of at
    least as many backticks closes it."""
    marker = 0
    for line in part.split("\n"):
        stripped = line.strip(" \t")
        run = len(stripped) - len(stripped.lstrip("`"))
        if not marker and run >= 3 and "`" not in stripped[run:]:
            marker = run
        elif marker and run >= marker and stripped == "`" * run:
            marker = 0
    return marker == 0


def without_added_fences(part: str) -> list[str]:
    """The ways `part` can read once the fence lines a splitter may add are removed: a
    reopening ```info line at its start and a closing ``` line at its end."""
    first, _, rest = part.partition("\n")
    heads = [part, rest] if rest and re.fullmatch(r"`{3,}[^`]*", first) else [part]
    variants = []
    for head in heads:
        body, _, last = head.rpartition("\n")
        variants.append(head)
        if re.fullmatch(r"`{3,}", last):
            variants.append(body)
    return variants


def rejoins(whole: str, parts: list[str], at: int = 0) -> bool:
    """True if `whole[at:]` is `parts` in order, each less the fences a splitter added,
    with only whitespace before, between and after them."""
    rest = whole[at:]
    gap = len(rest) - len(rest.lstrip())
    if not parts:
        return at + gap == len(whole)
    return any(
        whole.startswith(body, at + skip) and rejoins(whole, parts[1:], at + skip + len(body))
        for body in without_added_fences(parts[0])
        for skip in range(gap + 1)
    )


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def check_telegram_split(markup: str, limit: int) -> list[str]:
    chunks = split_telegram(markup, limit)
    for chunk in chunks:
        assert telegram_problems(chunk) == [], chunk
        assert 0 < visible_length(chunk) <= limit
        assert plain_text(chunk).strip()
    assert joined_by_whitespace(plain_text(markup), [plain_text(chunk) for chunk in chunks])
    return chunks


def check_plain_split(text: str, limit: int) -> list[str]:
    pieces = split_plain(text, limit)
    assert all(0 < utf16(piece) <= limit and piece.strip() for piece in pieces)
    assert joined_by_whitespace(text, pieces)
    return pieces


def check_discord_split(markdown: str, limit: int) -> list[str]:
    parts = split_discord(markdown, limit)
    for part in parts:
        assert 0 < len(part) <= limit
        assert fences_balanced(part), part
    assert rejoins(markdown.replace("\r\n", "\n"), parts)
    return parts


@pytest.mark.parametrize(
    "markup",
    [
        "<b>x",
        "x</b>",
        "<b><i>x</b></i>",
        "<p>x</p>",
        "<br/>",
        '<a title="t">x</a>',
        "<code><b>x</b></code>",
        '<code class="language-py">x</code>',
        "<blockquote><blockquote>x</blockquote></blockquote>",
        "a & b",
        "a < b",
        "&nbsp;",
    ],
)
def test_the_checker_catches_what_telegram_refuses(markup: str) -> None:
    assert telegram_problems(markup) != []


# --- rendering ------------------------------------------------------------------------------

RENDERED = [
    ("a < b", "a &lt; b"),
    ("<email@example.com>", '<a href="mailto:email@example.com">email@example.com</a>'),
    ("AT&T", "AT&amp;T"),
    # CommonMark decodes entities: the reader sees "&", as the model meant.
    ("&amp; and &", "&amp; and &amp;"),
    ("&lt;b&gt;", "&lt;b&gt;"),
    ("2 * 3 * 4", "2 * 3 * 4"),
    ("*bold", "*bold"),
    ("**bold* text", "*<i>bold</i> text"),
    ("_x and y", "_x and y"),
    ("snake_case_name", "snake_case_name"),
    ("a `b", "a `b"),
    ("~~s~ ~one~", "~~s~ ~one~"),
    ("**b** *i* _i_ ~~s~~ `c`", "<b>b</b> <i>i</i> <i>i</i> <s>s</s> <code>c</code>"),
    ("***x***", "<i><b>x</b></i>"),
    ("**a *b* c**", "<b>a <i>b</i> c</b>"),
    ("`<tag> & x`", "<code>&lt;tag&gt; &amp; x</code>"),
    (
        "```html\n<b>x</b> & y\n```",
        '<pre><code class="language-html">&lt;b&gt;x&lt;/b&gt; &amp; y</code></pre>',
    ),
    ("```\nplain\n```", "<pre><code>plain</code></pre>"),
    ('```"><b>\nx\n```', "<pre><code>x</code></pre>"),
    ("    <indented>", "<pre><code>&lt;indented&gt;</code></pre>"),
    ("```\n\n```", ""),
    ('[q](http://e.com/?a=1&b="x")', '<a href="http://e.com/?a=1&amp;b=%22x%22">q</a>'),
    ("[t & u](https://x.io)", '<a href="https://x.io">t &amp; u</a>'),
    ("[t](javascript:alert(1))", "t"),
    ("[t](JavaScript:alert(1))", "t"),
    ("[relative](/docs)", "relative"),
    ("[](https://x.io)", '<a href="https://x.io">https://x.io</a>'),
    ("[`code` **b**](https://x.io)", '<a href="https://x.io">code <b>b</b></a>'),
    ("<https://x.io/a?b&c>", '<a href="https://x.io/a?b&amp;c">https://x.io/a?b&amp;c</a>'),
    ("![cat](https://x.io/c.png)", '<a href="https://x.io/c.png">cat</a>'),
    ("![](https://x.io/c.png)", '<a href="https://x.io/c.png">https://x.io/c.png</a>'),
    ("<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;"),
    ("<b>not bold</b>", "&lt;b&gt;not bold&lt;/b&gt;"),
    ("<div>\n*still markdown*\n</div>", "&lt;div&gt;\n<i>still markdown</i>\n&lt;/div&gt;"),
    ("# Title *x*\ntext", "<b>Title <i>x</i></b>\n\ntext"),
    ("#", ""),
    ("one\ntwo  \nthree\\\nfour", "one\ntwo\nthree\nfour"),
    ("p1\n\n\n\np2", "p1\n\np2"),
    ("- a\n- b\n  - c\n    - d", "• a\n• b\n  • c\n    • d"),
    ("- a\n\n- b", "• a\n\n• b"),
    ("3. x\n4. y", "3. x\n4. y"),
    ("1) x\n   - y", "1. x\n   • y"),
    ("- item\n  ```\n  code\n    more\n  ```", "• item\n  <pre><code>code\n  more</code></pre>"),
    ("> q *i*", "<blockquote>q <i>i</i></blockquote>"),
    ("> a\n> > b", "<blockquote>a\n\nb</blockquote>"),
    ("---", "———"),
    ("a\n\n***\n\nb", "a\n\n———\n\nb"),
    ("| a | b |\n|:--|--:|\n| 1 | 22 |", "<pre>a |  b\n--+---\n1 | 22</pre>"),
    ("| x<y | & |\n|-|:-:|\n| **1** |", "<pre>x&lt;y | &amp;\n----+--\n1   |</pre>"),
    ("a\r\nb\r\n\r\nc", "a\nb\n\nc"),
    # Reference definitions are text: an unused one would otherwise hide its URL.
    ("see [1]\n\n[1]: https://x.io/a", "see [1]\n\n[1]: https://x.io/a"),
    ("", ""),
    ("  \n\t ", ""),
]


@pytest.mark.parametrize(("markdown", "expected"), RENDERED)
def test_markdown_renders_as_telegram_html(markdown: str, expected: str) -> None:
    rendered = telegram_html(markdown)
    assert rendered == expected
    assert telegram_problems(rendered) == []


VISIBLE = [
    ("a < b", "a < b"),
    ("<email@example.com>", "email@example.com"),
    ("AT&T", "AT&T"),
    ("Tom & Jerry <3 >_<", "Tom & Jerry <3 >_<"),
    ("2 * 3 * 4 and *unbalanced", "2 * 3 * 4 and *unbalanced"),
    ("snake_case_name and __init__", "snake_case_name and init"),
    ("`if a<b && c>d:`", "if a<b && c>d:"),
    ('<a href="x">link</a>', '<a href="x">link</a>'),
    ("emoji 😀 &#128512;", "emoji 😀 😀"),
    (">" * 30 + " deep", "deep"),
    # Deeper than markdown-it's nesting limit, which would skip it, the source is shown.
    ("- " * 30 + "deep <item>", "- " * 30 + "deep <item>"),
]


@pytest.mark.parametrize(("markdown", "expected"), VISIBLE)
def test_the_reader_sees_the_text_as_written(markdown: str, expected: str) -> None:
    assert plain_text(telegram_html(markdown)) == expected


@pytest.mark.parametrize(
    ("markup", "length"),
    [
        ("", 0),
        ("abc", 3),
        ("<b>ab</b>", 2),
        ("a &lt; b", 5),
        ("&amp;amp;", 5),
        ('<a href="https://x.io/?a&amp;b">x</a>', 1),
        ("😀", 2),
        ("<i>😀x</i>", 3),
        ("&#128512;&#x1F600;", 4),
        ("é", 1),
        ("👍🏽", 4),
        ("line\nbreak", 10),
    ],
)
def test_visible_length_counts_utf16_units_of_the_visible_text(markup: str, length: int) -> None:
    assert visible_length(markup) == length


def test_plain_text_removes_tags_and_decodes_entities() -> None:
    markup = '<b>a</b> &lt;b&gt; &amp; &quot; <pre><code class="language-x">x</code></pre>'
    assert plain_text(markup) == 'a <b> & " x'


# --- splitting for Telegram ----------------------------------------------------------------

SPLITS = [
    ("", 10, []),
    ("  \n ", 10, []),
    ("short", 10, ["short"]),
    ("x" * 85 + "\n\n" + "y " * 9, 100, ["x" * 85, "y " * 9]),
    ("a" * 50 + "\n" + "b" * 40 + " " + "c" * 30, 100, ["a" * 50 + "\n" + "b" * 40, "c" * 30]),
    ("a" * 90 + "\n" + "b" * 5 + " " + "c" * 30, 100, ["a" * 90, "b" * 5 + " " + "c" * 30]),
    ("z" * 250, 100, ["z" * 100, "z" * 100, "z" * 50]),
    ("&amp;" * 15, 7, ["&amp;" * 7, "&amp;" * 7, "&amp;"]),
    ("😀" * 12, 11, ["😀" * 5, "😀" * 5, "😀" * 2]),
    ("😀" * 3, 3, ["😀", "😀", "😀"]),
    ("a" * 10 + "<b>bold</b>", 10, ["a" * 10, "<b>bold</b>"]),
    ("a" * 9 + "<b>bold</b>", 10, ["a" * 9 + "<b>b</b>", "<b>old</b>"]),
    ("<b>" + "a" * 10 + "</b> rest", 10, ["<b>" + "a" * 10 + "</b>", "rest"]),
    (
        "<b>alpha <i>beta gamma</i> delta</b>",
        12,
        ["<b>alpha <i>beta</i></b>", "<b><i>gamma</i> delta</b>"],
    ),
    (
        '<pre><code class="language-py">alpha = 1\nbeta = 2</code></pre>',
        12,
        [
            '<pre><code class="language-py">alpha = 1</code></pre>',
            '<pre><code class="language-py">beta = 2</code></pre>',
        ],
    ),
]


@pytest.mark.parametrize(("markup", "limit", "expected"), SPLITS)
def test_split_telegram(markup: str, limit: int, expected: list[str]) -> None:
    assert check_telegram_split(markup, limit) == expected


def test_a_split_link_keeps_its_target_in_every_chunk() -> None:
    opening = '<a href="https://x.io/?a=1&amp;b=%22q%22">'
    chunks = check_telegram_split(opening + "word " * 30 + "</a>", 50)
    assert len(chunks) == 3
    assert all(chunk.startswith(opening) and chunk.endswith("</a>") for chunk in chunks)


def test_a_long_code_block_stays_a_code_block_in_every_chunk() -> None:
    code = "\n".join(f"if x{i} < {i} and y & z:  # 😀" for i in range(400))
    markup = telegram_html(f"Here:\n\n```python\n{code}\n```\n\nDone.")
    chunks = check_telegram_split(markup, 4096)
    opening = '<pre><code class="language-python">'
    assert chunks[0].startswith("Here:\n\n" + opening)
    assert chunks[-1].endswith("</code></pre>\n\nDone.")
    assert all(opening in chunk and chunk.count("</code></pre>") == 1 for chunk in chunks)
    # Every split falls at a line break, so each chunk holds whole lines of code.
    assert all(plain_text(chunk).startswith("if x") for chunk in chunks[1:])


def test_split_telegram_refuses_a_limit_that_cannot_hold_a_character() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        split_telegram("abc", 1)


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("", 5, []),
        ("aaa bbb", 4, ["aaa", "bbb"]),
        ("aaa bbb", 5, ["aaa", "bbb"]),  # a space anywhere before a word is cut
        ("😀" * 5, 3, ["😀"] * 5),
        ("x😀😀", 4, ["x😀", "😀"]),
        ("a\n\nb", 2, ["a", "b"]),
        ("<b>&amp;</b>", 5, ["<b>&a", "mp;</", "b>"]),
    ],
)
def test_split_plain_measures_utf16_and_never_splits_a_character(
    text: str, limit: int, expected: list[str]
) -> None:
    assert check_plain_split(text, limit) == expected


def test_a_refused_chunk_falls_back_to_its_plain_text_within_the_limit() -> None:
    markup = telegram_html("**Warning:** `a<b` & more\n\n" * 200)
    for chunk in check_telegram_split(markup, 300):
        fallback = plain_text(chunk)
        assert split_plain(fallback, 300) == [fallback]


# --- splitting for Discord -----------------------------------------------------------------

CODE = "intro\n\n```python\n" + "\n".join(f"value_{i} = {i}" for i in range(8)) + "\n```\n\noutro"

DISCORD = [
    ("", []),
    (" \n\n ", []),
    ("hello **world**", ["hello **world**"]),
    ("x" * 60 + "\n\n" + "y" * 10, ["x" * 60, "y" * 10]),
    ("a\r\nb", ["a\nb"]),
    ("w" * 150, ["w" * 64, "w" * 64, "w" * 22]),
    (
        CODE,
        [
            "intro\n\n```python\nvalue_0 = 0\nvalue_1 = 1\nvalue_2 = 2\n```",
            "```python\nvalue_3 = 3\nvalue_4 = 4\nvalue_5 = 5\nvalue_6 = 6\n```",
            "```python\nvalue_7 = 7\n```\n\noutro",
        ],
    ),
    # A split never leaves ``` at the start of a line where the source had it mid-line.
    ("a" * 58 + " ```python and more", ["a" * 58 + " ```py", "thon and more"]),
]


@pytest.mark.parametrize(("markdown", "expected"), DISCORD)
def test_split_discord(markdown: str, expected: list[str]) -> None:
    assert check_discord_split(markdown, 64) == expected


def test_a_discord_code_block_split_many_times_reopens_with_its_language() -> None:
    code = "\n".join(f"    print('{i}' * {i})  # <b> & ``" for i in range(300))
    markdown = f"# Report\n\nSome text.\n\n````js\n{code}\n````\n\nThe end."
    parts = check_discord_split(markdown, 2000)
    assert len(parts) > 3
    assert all(part.startswith("````js\n") for part in parts[1:])
    assert all(part.endswith("\n````") for part in parts[:-1])
    assert parts[-1].endswith("````\n\nThe end.")


@pytest.mark.parametrize(
    "markdown",
    [
        "```" + "x" * 100 + "`y",  # not a fence (a backtick in the info), longer than a part
        "```" + "x" * 100,  # an opening line longer than a part
        "```\ncode\n```" + " " * 100 + "\nafter",  # a closing line longer than a part
        "```\n" + "```x " * 40 + "\n```",  # ``` inside code, mid-line
        "text ```" * 30,
        "````\n```\n" + "code\n" * 30 + "````",  # a shorter run inside does not close
        "  ```py\n" + "  indented()\n" * 20 + "  ```",
    ],
)
def test_split_discord_keeps_fences_balanced_around_odd_backticks(markdown: str) -> None:
    assert len(check_discord_split(markdown, 64)) > 1


def test_split_discord_refuses_a_limit_too_small_for_fences() -> None:
    with pytest.raises(ValueError, match="at least 64"):
        split_discord("abc", 10)


# --- fuzz -----------------------------------------------------------------------------------

TRICKY = [*"*_~`<>&[]()#- \n|\\!", "**", "```", "~~", "&amp;", "<b>", "</i>", "😀", "> ", "1. "]
WORDS = ["a", "word", "snake_case", "AT&T", "x<y", "https://e.com/?a=1&b=2", "---", "é", "👍🏽"]


def random_markdown(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(TRICKY + WORDS) for _ in range(size))


def random_document(rng: random.Random) -> str:
    """A long reply: prose, lists, code blocks, tables and very long words."""
    blocks = []
    for _ in range(rng.randint(5, 40)):
        kind = rng.choice(["prose", "list", "code", "table", "long", "tricky"])
        if kind == "prose":
            blocks.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 120))))
        elif kind == "list":
            blocks.append(
                "\n".join(f"- {rng.choice(WORDS)} **{rng.choice(WORDS)}**" for _ in range(9))
            )
        elif kind == "code":
            lines = (random_markdown(rng, rng.randint(0, 12)).replace("`", "'") for _ in range(30))
            blocks.append(f"```{rng.choice(['', 'python', 'c++'])}\n" + "\n".join(lines) + "\n```")
        elif kind == "table":
            blocks.append("| a | b<c |\n|---|:-:|\n" + "| x & y | 😀 |\n" * rng.randint(1, 20))
        elif kind == "long":
            blocks.append(rng.choice("xy😀") * rng.randint(100, 700))
        else:
            blocks.append(random_markdown(rng, rng.randint(1, 80)))
    return "\n\n".join(blocks)


def test_fuzz_short_tricky_markdown() -> None:
    rng = random.Random(20240611)
    for _ in range(400):
        markdown = random_markdown(rng, rng.randint(0, 60))
        markup = telegram_html(markdown)
        assert telegram_problems(markup) == [], (markdown, markup)
        check_telegram_split(markup, rng.randint(2, 40))
        check_discord_split(markdown, rng.randint(64, 120))
        check_plain_split(plain_text(markup), rng.randint(2, 30))


def test_fuzz_backtick_heavy_markdown_for_discord() -> None:
    rng = random.Random(99)
    pieces = ["`", "```", "````", "\n", "\n\n", " ", "\t", "word", "```py\n", "\n```\n", "y" * 30]
    for _ in range(300):
        markdown = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 150)))
        check_discord_split(markdown, rng.randint(64, 90))


def test_fuzz_long_documents() -> None:
    rng = random.Random(7)
    for _ in range(25):
        markdown = random_document(rng)
        markup = telegram_html(markdown)
        assert telegram_problems(markup) == []
        check_telegram_split(markup, rng.choice([4096, 500, 97]))
        check_discord_split(markdown, rng.choice([2000, 300, 64]))


def test_a_reply_that_fits_is_split_as_the_general_path_splits_it() -> None:
    rng = random.Random(4096)
    raw = ["<b>x", "</i>y", "a < b", "&amp;", "<br/>", "<!-- c -->", "&nbsp;", " ", "😀", "\n"]
    markups = [telegram_html(random_markdown(rng, rng.randint(0, 60))) for _ in range(300)]
    markups += ["".join(rng.choice(raw) for _ in range(rng.randint(0, 12))) for _ in range(300)]
    for markup in markups:
        for limit in (visible_length(markup), visible_length(markup) + 1, TELEGRAM_LIMIT):
            if limit >= 2:
                assert split_telegram(markup, limit) == _split_atoms(markup, limit), markup


def test_a_short_piece_is_split_at_a_word_not_inside_one() -> None:
    """As when a chunk the platform refused as too long is split again: its last fifth may
    hold no space, and a word must still not be cut (`a needl` / `e reply`)."""
    text = "aa " + "b" * 12  # the only space is early: before, the cut fell inside the b's
    assert split_plain(text, 12) == ["aa", "b" * 12]
    assert split_telegram(f"<b>{text}</b>", 12) == ["<b>aa</b>", f"<b>{'b' * 12}</b>"]
    long_words = "word " + "x" * 70 + " end"
    assert split_discord(long_words, 72) == ["word", "x" * 70, "end"]
    assert split_plain("x" * 30, 20) == ["x" * 20, "x" * 10]  # no break at all: cut
