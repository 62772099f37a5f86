"""The names MCP tools are offered under (`nanobot.mcp.names`): `<server>_<tool>`, valid for
the model APIs, unique within the server, and a clash that cannot be resolved refused."""

from __future__ import annotations

import hashlib
import re

import pytest

from nanobot.mcp.names import MAX_NAME, NameClash, offered_names

VALID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def digest(tool: str) -> str:
    return hashlib.sha256(tool.encode()).hexdigest()[:6]


@pytest.mark.parametrize(
    ("tool", "offered"),
    [
        ("echo", "fake_echo"),
        ("get-time", "fake_get-time"),
        ("Mixed_Case9", "fake_Mixed_Case9"),
        ("files.read", "fake_files_read"),  # replaced, and alone: no suffix needed
        ("read file", "fake_read_file"),
        ("café", "fake_caf_"),
    ],
)
def test_a_name_is_the_server_and_the_tool_made_valid(tool: str, offered: str) -> None:
    assert offered_names("fake", [tool]) == {offered: tool}


def test_names_that_need_no_change_keep_theirs_and_the_changed_one_gets_a_suffix() -> None:
    # Listed first, "x.y" would take "fake_x_y" if the unchanged name were not served first.
    names = offered_names("fake", ["x.y", "x_y", "x:y"])
    assert names == {
        "fake_x_y": "x_y",
        f"fake_x_y_{digest('x.y')}": "x.y",
        f"fake_x_y_{digest('x:y')}": "x:y",
    }


def test_a_long_name_is_cut_to_64_with_its_hash_and_stays_unique() -> None:
    long_a, long_b = "a" * 80, "a" * 79 + "b"
    names = offered_names("server", [long_a, long_b, "short"])
    assert set(names.values()) == {long_a, long_b, "short"}
    assert names["server_short"] == "short"
    cut = {name: tool for name, tool in names.items() if tool != "short"}
    for name, tool in cut.items():
        assert len(name) == MAX_NAME
        assert name.endswith(f"_{digest(tool)}")
        assert name.startswith("server_aaaa")
    assert len(cut) == 2


def test_a_name_of_exactly_64_is_kept_whole() -> None:
    tool = "t" * (MAX_NAME - len("fake_"))
    assert offered_names("fake", [tool]) == {f"fake_{tool}": tool}
    longer = tool + "t"
    (name,) = offered_names("fake", [longer])
    assert len(name) == MAX_NAME and name.endswith(digest(longer))


def test_every_offered_name_is_valid_whatever_the_server_lists() -> None:
    weird = ["", " ", "../../etc", "a" * 200, "名前", "tab\there", "émoji🙂", "x" * 64]
    names = offered_names("srv-1", weird)
    assert sorted(names.values()) == sorted(weird)
    assert all(VALID.fullmatch(name) for name in names)
    assert all(name.startswith("srv-1_") for name in names)


def test_a_tool_listed_twice_is_offered_once() -> None:
    assert offered_names("fake", ["echo", "echo"]) == {"fake_echo": "echo"}


def test_a_clash_the_suffix_cannot_resolve_is_refused_naming_both_tools() -> None:
    # The server lists a tool whose plain name is what another's suffixed name becomes.
    suffixed = f"x_y_{digest('x.y')}"
    with pytest.raises(NameClash) as refused:
        offered_names("fake", ["x_y", "x.y", suffixed])
    message = str(refused.value)
    assert f"fake_{suffixed}" in message
    assert "'x.y'" in message and f"'{suffixed}'" in message


def test_no_tools_no_names() -> None:
    assert offered_names("fake", []) == {}
