"""The docs cannot drift: configuration.md names exactly the config model's keys, with its
defaults; config.example.yaml shows those defaults; every key the docs mention exists; and
every relative link and #anchor in README.md and docs/*.md leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from nanobot.config import Config, load

ROOT = Path(__file__).resolve().parent.parent
CONFIGURATION = ROOT / "docs" / "configuration.md"
EXAMPLE = ROOT / "config.example.yaml"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHANNELS = ("telegram", "discord")  # what `channels.<channel>` stands for

_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$", re.MULTILINE)
_ROW_KEY = re.compile(r"^\|\s*`([a-z_<>.]+)`\s*\|\s*(.*?)\s*\|")
_SECTIONS = tuple(Config.model_fields)
# A code span that names a config key: `agent.model`, `tools.exec.limits.*`, `log.json: true`.
_MENTION = re.compile(rf"^(?:{'|'.join(_SECTIONS)})(?:\.(?:[a-z_]+\*?|<[a-z]+>|\*))+")
_NOT_KEYS = (".py", ".md", ".lock", ".db", ".yaml", ".service", ".timer", ".reserve")


# --- Markdown as GitHub reads it -------------------------------------------------------


def _prose(text: str) -> str:
    """`text` without its fenced code blocks (each replaced by as many newlines)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (code, emphasis and links unwrapped) in lower
    case, punctuation dropped, each space a hyphen."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text).replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page has: its headings' slugs, repeats numbered as GitHub does."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for match in _HEADING.finditer(_prose(text)):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    """The targets of a page's links and images, outside code."""
    return [m.group(1) for m in _LINK.finditer(_CODE_SPAN.sub("", _prose(text)))]


def broken_links(page: Path) -> list[str]:
    """Each relative link or #anchor of `page` that leads nowhere, as `target: why`."""
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text("utf-8")):
            broken.append(f"{target}: no such anchor in {file.name}")
        elif anchor and file.suffix != ".md":
            broken.append(f"{target}: an anchor into a file that is not Markdown")
    return broken


def test_slugs_follow_githubs_rules() -> None:
    assert slug("Issue 2 — CLI start-up") == "issue-2--cli-start-up"
    assert slug("`channels`: Telegram and Discord") == "channels-telegram-and-discord"
    assert slug("After batching and claims at intake (2026-11-29)") == (
        "after-batching-and-claims-at-intake-2026-11-29"
    )
    assert slug("exec's sandbox") == "execs-sandbox"
    assert slug("The [link](x.md) and *emphasis*") == "the-link-and-emphasis"
    assert anchors("# Results\n```\n# not a heading\n```\n## Results\n") == {
        "results",
        "results-1",
    }


def test_links_are_found_outside_code_only() -> None:
    text = "See [a](a.md#x) and [b\nc](b.md).\n`[no](no.md)`\n```\n[no](no.md)\n```\n"
    assert links(text) == ["a.md#x", "b.md"]


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# There\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Here\n[ok](#here) [ok](other.md#there) [bad](#nowhere) [bad](other.md#gone) "
        "[bad](missing.md) [web](https://example.com/#x)\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        "#nowhere: no such anchor in page.md",
        "other.md#gone: no such anchor in other.md",
        "missing.md: no such file",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_leads_somewhere(page: Path) -> None:
    assert broken_links(page) == []


# --- The config model ------------------------------------------------------------------


def _section(annotation: object) -> type[BaseModel] | None:
    """The section model a field holds, if it holds one (not an optional value like
    `heartbeat.deliver_to`, which is one key)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def model_keys(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, type[BaseModel]]:
    """Every leaf key of the config (`agent.model`, `log.json`), with the section that has it."""
    found: dict[str, type[BaseModel]] = {}
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        inner = _section(field.annotation)
        if inner is None:
            found[key] = model
        else:
            found |= model_keys(inner, key + ".")
    return found


def documented() -> list[tuple[str, str]]:
    """configuration.md's key rows, `channels.<channel>` spelled out: (key, default cell)."""
    rows = []
    for line in CONFIGURATION.read_text(encoding="utf-8").splitlines():
        match = _ROW_KEY.match(line)
        if match:
            key, default = match.groups()
            names = CHANNELS if "<channel>" in key else ("",)
            rows += [(key.replace("<channel>", name), default) for name in names]
    return rows


def _field_name(section: type[BaseModel], key: str) -> str:
    leaf = key.rpartition(".")[2]
    return next(n for n, f in section.model_fields.items() if (f.alias or n) == leaf)


def test_configuration_describes_every_key_once() -> None:
    keys = [key for key, _ in documented()]
    assert sorted(keys) == sorted(set(keys)), "a key described twice"
    assert set(keys) == set(model_keys())


@pytest.mark.parametrize(("key", "cell"), documented(), ids=str)
def test_the_documented_default_is_the_models(key: str, cell: str) -> None:
    code = re.fullmatch(r"`([^`]*)`", cell)
    assert code is not None, f"{key}: give the default as one value in code, e.g. `null`"
    section = model_keys()[key]
    name = _field_name(section, key)
    leaf = key.rpartition(".")[2]
    given = section.model_validate({leaf: yaml.safe_load(code.group(1))})
    default = section.model_validate({})
    assert getattr(given, name) == getattr(default, name)


def test_the_example_shows_every_default() -> None:
    example = load(EXAMPLE).model_dump()
    defaults = Config().model_dump()
    assert _differences(example, defaults) == []


def _differences(given: Any, expected: Any, prefix: str = "") -> list[str]:
    if isinstance(given, dict) and isinstance(expected, dict):
        found = []
        for key in given.keys() | expected.keys():
            found += _differences(given.get(key), expected.get(key), f"{prefix}{key}.")
        return found
    return [] if given == expected else [f"{prefix.rstrip('.')}: {given!r} != {expected!r}"]


def _is_key(key: str, keys: set[str]) -> bool:
    """`key` is a leaf key, a section (`tools.exec`) or a pattern of keys
    (`tools.exec.limits.*`, `agent.subagent_*`)."""
    if key.endswith("*"):
        return any(k.startswith(key[:-1]) for k in keys)
    return key in keys or any(k.startswith(key + ".") for k in keys)


def mentions(text: str) -> set[str]:
    """The config keys a page names in code spans, `channels.<channel>` spelled out."""
    found = set()
    for span in _CODE_SPAN.finditer(_prose(text)):
        match = _MENTION.match(span.group(2).strip())
        if match is None or match.group(0).endswith(_NOT_KEYS):
            continue
        key = re.sub(r"<[a-z]+>", "<channel>", match.group(0))
        found |= {key.replace("<channel>", name) for name in CHANNELS} if "<" in key else {key}
    return found


def test_mentions_are_found_in_code_spans() -> None:
    text = (
        "`agent.model`, `tools.exec.network: none`, `channels.<name>.stream`, `cron.py`, "
        "`agent.subagent_*`, agent.x"
    )
    assert mentions(text) == {
        "agent.model",
        "agent.subagent_*",
        "tools.exec.network",
        "channels.telegram.stream",
        "channels.discord.stream",
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_key_the_docs_name_exists(page: Path) -> None:
    keys = set(model_keys())
    unknown = sorted(k for k in mentions(page.read_text("utf-8")) if not _is_key(k, keys))
    assert unknown == []


def test_keys_are_the_leaves_of_the_model() -> None:
    keys = model_keys()
    assert keys["log.json"].__name__ == "LogConfig"  # by its alias, not `json_`
    assert "heartbeat.deliver_to" in keys  # an optional section is one key
    assert "tools.exec" not in keys
    assert "tools.exec.limits.memory" in keys
