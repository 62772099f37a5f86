"""The digests of the config parts a cluster's members must share: equal for configs that
differ only where members may, different in exactly the part a setting belongs to, and
holding no secret."""

from __future__ import annotations

from typing import Any

import pytest

from nanobot.cluster.agreement import PARTS, agreement
from nanobot.config import Config

TOKEN = "123456:telegram-secret-token-abcdefghijklmnop"
SECRET = "webhook-secret_42"


def base() -> dict[str, Any]:
    return {
        "data_dir": "/srv/member1",
        "agent": {"model": "openai/gpt-4o-mini", "api_base": "http://llm:8000/v1"},
        "channels": {
            "telegram": {
                "enabled": True,
                "token": TOKEN,
                "allow_from": ["1", "2"],
                "webhook": {
                    "url": "https://bot.example.com/telegram",
                    "listen": "127.0.0.1:8443",
                    "secret_token": SECRET,
                },
            },
        },
        "store": {"url": "postgresql://nanobot:pw@db:5432/nanobot"},
    }


def digests(**changes: Any) -> dict[str, str]:
    """The agreement of `base()` with `changes` applied (keys: "a__b__c")."""
    settings = base()
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        place = settings
        for key in path:
            place = place.setdefault(key, {})
        place[last] = value
    return agreement(Config.model_validate(settings))


def test_every_part_has_a_short_digest() -> None:
    found = digests()
    assert list(found) == list(PARTS)
    assert all(len(d) == 16 and int(d, 16) >= 0 for d in found.values())
    assert len(set(found.values())) == len(PARTS)  # the part's name is in its digest


@pytest.mark.parametrize(
    "change",
    [
        {"data_dir": "/srv/member2"},
        {"channels__telegram__webhook__listen": "0.0.0.0:9000"},
        {"channels__telegram__allow_from": ["2", "1"]},  # the order does not matter
        {"store__url": "postgresql://nanobot:pw@10.0.0.5:5432/nanobot"},
        {"log__level": "DEBUG"},
        {"cluster__lease_seconds": 30},
        {"agent__api_key": "sk-another-key"},
        {"agent__max_iterations": 5},
        {"gateway__shutdown_timeout": 30},
        {"workspace": "/mnt/other"},  # compared apart, as a path
        {"channels__discord__token": "ignored while discord is disabled"},
        {"mcp__servers": {"gh": {"command": "gh-mcp", "timeout": 5, "startup_timeout": 9}}},
        {"transcription__api_key": "sk-another", "transcription__max_seconds": 60},
        {"tts__voice": "nova"},  # no speech model: no voice to agree on
        {"documents__max_chars": 4000, "documents__max_parallel": 4},
    ],
)
def test_what_members_may_set_apiece_changes_nothing(change: dict[str, Any]) -> None:
    plain = {"mcp__servers": {"gh": {"command": "gh-mcp"}}} if "mcp__servers" in change else {}
    assert digests(**change) == digests(**plain)


@pytest.mark.parametrize(
    ("change", "part"),
    [
        ({"agent__model": "anthropic/claude-sonnet-4-5"}, "model"),
        ({"agent__api_base": "http://other:8000/v1"}, "model"),
        ({"agent__transport": "direct"}, "model"),
        ({"agent__fallbacks": ["openai/gpt-4o"]}, "model"),
        ({"channels__telegram__token": "654321:another-token-abcdefghijklmnopq"}, "telegram"),
        ({"channels__telegram__allow_from": ["1"]}, "telegram"),
        ({"channels__telegram__approvers": ["1"]}, "telegram"),
        ({"channels__telegram__group_policy": "open"}, "telegram"),
        ({"channels__telegram__webhook__secret_token": "another-secret"}, "telegram"),
        ({"channels__telegram__webhook__url": None}, "telegram"),  # polling
        ({"channels__telegram__enabled": False}, "telegram"),
        ({"channels__discord__enabled": True, "channels__discord__token": "d"}, "discord"),
        ({"tools__exec__enabled": False}, "tools"),
        ({"tools__exec__sandbox": "none"}, "tools"),
        ({"tools__restrict_to_workspace": False}, "tools"),
        ({"tools__approval__exec": "allow"}, "approvals"),
        ({"tools__approval__unattended": "deny"}, "approvals"),
        ({"tools__approval__timeout": "5m"}, "approvals"),
        ({"cron__enabled": False}, "schedule"),
        ({"heartbeat__enabled": True}, "schedule"),
        ({"timezone": "Europe/Berlin"}, "schedule"),
        ({"mcp__servers": {"gh": {"command": "gh-mcp"}}}, "mcp"),
        ({"mcp__servers": {"gh": {"command": "gh-mcp", "env": {"GH_TOKEN": "t"}}}}, "mcp"),
        ({"mcp__servers": {"gh": {"command": "gh-mcp", "sandbox": "none"}}}, "mcp"),
        ({"mcp__servers": {"gh": {"url": "https://gh.example/mcp", "approval": "allow"}}}, "mcp"),
        ({"transcription__model": "openai/whisper-1"}, "media"),
        ({"tts__model": "openai/tts-1"}, "media"),
        ({"documents__enabled": False}, "media"),
        ({"channels__telegram__voice_replies": "when_spoken"}, "media"),
    ],
)
def test_a_setting_changes_the_digest_of_its_part_alone(change: dict[str, Any], part: str) -> None:
    before, after = digests(), digests(**change)
    assert [p for p in PARTS if before[p] != after[p]] == [part]


def test_no_secret_shows_in_the_digests() -> None:
    import hashlib

    text = repr(digests())
    server = {"url": "https://gh.example/mcp", "headers": {"Authorization": "Bearer h-secret"}}
    text += repr(digests(mcp__servers={"gh": server}))
    for secret in (TOKEN, SECRET, "pw", "Bearer h-secret"):
        assert secret not in text
        assert hashlib.sha256(secret.encode()).hexdigest()[:16] not in text
