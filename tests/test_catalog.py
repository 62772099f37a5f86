"""litellm's model list, read without litellm: windows, prices and vision as litellm says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nanobot.providers.catalog import DEFAULT_CONTEXT_WINDOW, UNKNOWN, Catalog, Prices
from nanobot.providers.litellm_provider import _litellm

MODELS = [
    "gpt-4o-mini",
    "openai/gpt-4o-mini",
    "openai/o3-mini",
    "gemini/gemini-2.5-pro",
    "ollama/llama3",
    "anthropic/claude-sonnet-4-5",
    "deepseek/deepseek-chat",
]


@pytest.mark.parametrize("model", MODELS)
def test_agrees_with_litellm(model: str) -> None:
    litellm = _litellm()
    info = Catalog.shipped().info(model)
    theirs = litellm.get_model_info(model)
    window = theirs.get("max_input_tokens") or theirs.get("max_tokens")
    assert info.context_window == window
    assert info.vision is bool(theirs.get("supports_vision"))
    assert info.prices is not None
    for prompt in (1_000, 300_000):
        expected = sum(
            litellm.cost_per_token(model=model, prompt_tokens=prompt, completion_tokens=500)
        )
        assert info.prices.cost(prompt, 500) == pytest.approx(expected)


@pytest.mark.parametrize("model", ["openai/unknown-model-x", "nobody/gpt-4o-mini", 'a"b', ""])
def test_unknown_models(model: str) -> None:
    assert Catalog.shipped().info(model) is UNKNOWN
    assert UNKNOWN.context_window == DEFAULT_CONTEXT_WINDOW
    assert UNKNOWN.prices is None


def write(path: Path, entries: dict[str, object], *, indent: int | None = 4) -> Path:
    path.write_text(json.dumps(entries, indent=indent), encoding="utf-8")
    return path


ENTRIES: dict[str, object] = {
    "sample_spec": {"max_input_tokens": "max input tokens"},
    "m-1": {
        "litellm_provider": "acme",
        "max_input_tokens": 1000,
        "input_cost_per_token": 1e-06,
        "output_cost_per_token": 2e-06,
        "input_cost_per_token_above_200k_tokens": 2e-06,
        "output_cost_per_token_above_200k_tokens": 4e-06,
        "supports_vision": True,
        "nested": {"m-2": {"max_input_tokens": 1}},
    },
    "m-2": {"litellm_provider": "other", "max_tokens": 2000},
    "acme/m-3": {"litellm_provider": "acme", "max_input_tokens": 3000, "input_cost_per_token": 0},
}


@pytest.mark.parametrize("indent", [4, None])
def test_entries_of_a_file(tmp_path: Path, indent: int | None) -> None:
    catalog = Catalog(write(tmp_path / "list.json", ENTRIES, indent=indent))
    one = catalog.info("acme/m-1")  # by its name, as the entry is the same provider's
    assert one.context_window == 1000
    assert one.vision is True
    assert one.prices == Prices(1e-06, 2e-06, ((200_000, 2e-06, 4e-06),))
    assert one.prices.cost(200_000, 10) == pytest.approx(0.2 + 2e-05)
    assert one.prices.cost(200_001, 10) == pytest.approx(200_001 * 2e-06 + 4e-05)
    assert catalog.info("m-2").context_window == 2000  # max_tokens when no max_input_tokens
    assert catalog.info("m-2").prices is None
    assert catalog.info("acme/m-2") is UNKNOWN  # another provider's model of that name
    assert catalog.info("acme/m-3").prices is None  # no output price: not priced
    assert catalog.info("sample_spec").context_window == DEFAULT_CONTEXT_WINDOW


def test_a_missing_file_is_an_empty_list(tmp_path: Path) -> None:
    assert Catalog(tmp_path / "nothing.json").info("gpt-4o-mini") is UNKNOWN
    assert Catalog(None).info("gpt-4o-mini") is UNKNOWN


def test_the_file_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = Catalog(write(tmp_path / "list.json", ENTRIES))
    reads: list[Path] = []
    read_bytes = Path.read_bytes

    def counting(path: Path) -> bytes:
        reads.append(path)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counting)
    for model in ("m-1", "m-2", "m-1", "nope"):
        catalog.info(model)
    assert len(reads) == 1


@pytest.mark.process
def test_found_and_read_without_importing_litellm() -> None:
    probe = (
        "import sys\n"
        "from nanobot.providers.catalog import Catalog\n"
        "assert Catalog.shipped().info('openai/gpt-4o-mini').context_window == 128000\n"
        "assert 'litellm' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
