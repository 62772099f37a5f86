"""The proxy the environment names for a URL."""

from __future__ import annotations

import pytest

from nanobot.proxies import env_proxy


@pytest.mark.parametrize(
    ("env", "url", "proxy"),
    [
        ({}, "http://localhost:8000/v1", None),
        ({"HTTP_PROXY": "http://proxy:3128"}, "http://gpu-box:8000/v1", "http://proxy:3128"),
        ({"HTTP_PROXY": "http://proxy:3128"}, "https://api.openai.com/v1", None),
        ({"HTTPS_PROXY": "http://proxy:3128"}, "https://api.openai.com/v1", "http://proxy:3128"),
        ({"ALL_PROXY": "http://proxy:3128"}, "https://api.openai.com/v1", "http://proxy:3128"),
        (
            {"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "localhost,gpu-box"},
            "http://gpu-box:8000/v1",
            None,
        ),
    ],
)
def test_env_proxy(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str, proxy: str | None
) -> None:
    for scheme in ("http", "https", "all", "no"):
        monkeypatch.delenv(f"{scheme}_proxy", raising=False)
        monkeypatch.delenv(f"{scheme.upper()}_PROXY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert env_proxy(url) == proxy
