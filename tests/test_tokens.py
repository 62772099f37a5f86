"""Token counting with tiktoken from litellm's files: litellm's numbers, offline, no litellm."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nanobot.providers import Message
from nanobot.providers.litellm_provider import _litellm
from nanobot.providers.tokens import TokenCounter, encoding_name

CONVERSATION: list[Message] = [
    {"role": "system", "content": "You are nanobot. Be brief."},
    {"role": "user", "content": "Read notes/today.md, please. Ünïcödé and emoji 🙂 too."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "notes/today.md"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "read_file", "content": "- buy milk\n"},
    {"role": "user", "content": [{"type": "text", "text": "and this?"}]},
    {"role": "assistant", "content": "x" * 5000},  # longer than one chunk
]


@pytest.mark.parametrize("model", ["gpt-4o-mini", "gpt-4", "gpt-3.5-turbo"])
def test_counts_as_litellm_does(model: str) -> None:
    theirs = _litellm().token_counter(model=model, messages=CONVERSATION)
    counter = TokenCounter(f"openai/{model}")
    bound = counter.count(CONVERSATION)
    assert counter.load() and counter.exact
    ours = counter.count(CONVERSATION)
    assert abs(ours - theirs) <= 2  # chunk boundaries may split a token differently
    assert bound >= ours


# Texts with many tokens to a byte: digits, CJK, emoji, whitespace, code, invalid surrogates.
HARD = [
    "0123456789" * 50,
    "日本語のテキストとその翻訳。" * 20,
    "👩‍👩‍👧‍👦🏳️‍🌈" * 30,
    " \n\t " * 100,
    "def f(x):\n    return {'a': [x, x**2]}\n" * 20,
    "broken \ud800 surrogate",
    "",
]


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "openai/fake-model"])
def test_before_the_encoding_is_loaded_a_count_is_never_below_the_exact_one(model: str) -> None:
    # What the bound is for: a window it calls fitting does fit, without the encoding's
    # 40-75 MiB in memory.
    counter = TokenCounter(model)
    messages = [[{"role": "user", "content": text}] for text in HARD]
    messages.append(CONVERSATION)
    bounds = [counter.count(m) for m in messages]
    assert not counter.exact
    counter.load()
    assert counter.exact and not counter.load()  # loaded once
    for bound, exact in zip(bounds, (counter.count(m) for m in messages), strict=True):
        assert bound >= exact


def test_images_count_as_litellm_counts_them_at_auto_detail() -> None:
    image = {"type": "image_url", "image_url": {"url": "file:///nowhere/photo.jpg"}}
    part = {"type": "text", "text": "what is it?"}
    text = {"role": "user", "content": [part]}
    with_image = {"role": "user", "content": [part, image]}
    counter = TokenCounter("openai/gpt-4o-mini")
    counter.load()
    assert counter.count([with_image]) - counter.count([text]) == 85


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("openai/gpt-4o-mini", "o200k_base"),
        ("openrouter/openai/gpt-4o", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("openai/gpt-oss-120b", "o200k_harmony"),
        ("anthropic/claude-sonnet-4-5", "cl100k_base"),
        ("openai/fake-model", "cl100k_base"),
        ("text-davinci-001", "cl100k_base"),  # r50k_base is not shipped
    ],
)
def test_encoding_of_a_model(model: str, encoding: str) -> None:
    assert encoding_name(model) == encoding


def test_without_the_files_it_estimates_and_stays_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("no network")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    counter = TokenCounter("openai/gpt-4o-mini", tokenizers=tmp_path)
    counter.load()
    assert counter.count([{"role": "user", "content": "x" * 400}]) == 3 + 3 + 1 + 100


@pytest.mark.process
def test_counts_offline_and_without_importing_litellm(tmp_path: Path) -> None:
    probe = (
        "import socket, sys\n"
        "def refuse(*a, **k): raise AssertionError('no network')\n"
        "socket.getaddrinfo = refuse\n"
        "from nanobot.providers.tokens import TokenCounter\n"
        "for model in ('openai/gpt-4o', 'openai/fake-model'):\n"
        "    counter = TokenCounter(model)\n"
        "    counter.load()\n"
        "    assert counter.count([{'role': 'user', 'content': 'hi'}]) == 8\n"
        "assert 'litellm' not in sys.modules\n"
    )
    env = {"PATH": "", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}  # no tiktoken cache
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60, env=env)
