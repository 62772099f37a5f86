"""End to end: people kept apart (`people.isolation: person`) through `nanobot gateway`.

Two allowed people, A and B, on the fake Bot API, with the obedient fake model calling every
tool B asks for, `exec` in the real bubblewrap sandbox (skipped where it cannot run). A tells
a secret in private and keeps a file; B then tries every way in: A's memory, `../<A's
folder>`, the workspace's listing, `memory_search` for A's words, `exec` looking around, a
cron job that reads A's files when it runs, and a shared group where B asks what A said in
private. None of A's private text or files may reach B: not the model's requests (which hold
every tool result), not the replies sent to B, not B's folder on disk.

One gateway serves the module (its tests are steps of one story, in order).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from nanobot.people import folder_name
from nanobot.tools.sandbox import Confinement, SandboxUnavailable, Unavailable, probe
from tests._module_fakes import module_fake
from tests.fakes.llm import Call, FakeLLM, RecordedRequest, Text, ToolCalls
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.gateway_process import GatewayProcess
from tests.test_gateway_telegram import gateway_config, replies

pytestmark = [
    pytest.mark.process,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.xdist_group("people-gateway"),
]

A, B, GROUP = 7101, 7202, -7300
A_SECRET, A_NOTE, A_FILE = "PELICAN4417", "OSPREY9921", "KESTREL5531"
SECRETS = (A_SECRET, A_NOTE, A_FILE)


llm = module_fake("llm", FakeLLM)


telegram = module_fake("telegram", lambda: FakeTelegram(token=DEFAULT_TOKEN))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(
    tmp_path_factory: pytest.TempPathFactory, llm: FakeLLM, telegram: FakeTelegram
) -> AsyncIterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("people-gateway")
    try:
        sandbox = probe("bwrap", Confinement(root, network="none"))
    except SandboxUnavailable as exc:
        pytest.skip(f"bubblewrap cannot run here: {exc}")
    if isinstance(sandbox, Unavailable):
        pytest.skip(f"bubblewrap cannot run here: {sandbox}")
    config: dict[str, Any] = gateway_config(root, llm, telegram)
    config["channels"]["telegram"]["allow_from"] = [A, B]
    config["channels"]["telegram"]["group_policy"] = "open"
    config["people"] = {"isolation": "person"}
    config["tools"] = {
        "exec": {"sandbox": "bwrap", "network": "none"},
        "approval": {"exec": "allow", "cron": "allow"},
    }
    process = GatewayProcess(root, config, dict(os.environ))
    try:
        await process.start(ready="telegram connected")
        yield process
    finally:
        await process.stop(signal.SIGKILL)
        for ballast in root.rglob("state.db.reserve"):  # 200 MB each (conftest)
            ballast.unlink()


def folder(gateway: GatewayProcess, user: int) -> Path:
    return gateway.data_dir / "workspace" / "people" / folder_name(f"telegram:{user}")


def sent(requests: list[RecordedRequest]) -> str:
    """Everything the model was sent in `requests`: prompts, messages and tool results."""
    return "\n".join(json.dumps(r.messages) for r in requests)


def tool_results(request: RecordedRequest) -> list[str]:
    return [str(m["content"]) for m in request.messages if m.get("role") == "tool"]


async def test_a_keeps_a_secret_and_a_file_in_private(
    gateway: GatewayProcess, telegram: FakeTelegram, llm: FakeLLM
) -> None:
    llm.script(
        ToolCalls(
            [
                Call("write_file", {"path": "memory/MEMORY.md", "content": f"note {A_NOTE}"}),
                Call("write_file", {"path": "private.txt", "content": A_FILE}),
            ]
        ),
        Text("Noted."),
    )
    telegram.user_message(A, f"my secret is {A_SECRET}", user_id=A)
    assert await replies(telegram, A, 1, seconds=60) == ["Noted."]
    mine = folder(gateway, A)
    assert A_NOTE in (mine / "memory" / "MEMORY.md").read_text()
    assert (mine / "private.txt").read_text() == A_FILE
    assert not (gateway.data_dir / "workspace" / "private.txt").exists()
    # In the group A's turn runs as A: with A's memory in its prompt.
    llm.script(Text("Sure, HERON square."))
    telegram.user_message(GROUP, "group plan: meet at HERON square", user_id=A, chat_type="group")
    await replies(telegram, GROUP, 1, seconds=60)
    assert A_NOTE in json.dumps(llm.requests[-1].messages[0])


async def test_b_finds_nothing_of_a_in_private(
    gateway: GatewayProcess, telegram: FakeTelegram, llm: FakeLLM
) -> None:
    other = f"../{folder(gateway, A).name}"
    since = llm.request_count
    llm.script(
        ToolCalls(
            [
                Call("read_file", {"path": f"{other}/memory/MEMORY.md"}),
                Call("read_file", {"path": f"{other}/private.txt"}),
                Call("read_file", {"path": str(folder(gateway, A) / "private.txt")}),
                Call("read_file", {"path": "memory/MEMORY.md"}),
                Call("list_dir", {"path": "."}),
                Call("list_dir", {"path": ".."}),
                Call("memory_search", {"query": "secret"}),
                Call("memory_search", {"query": A_SECRET.lower()}),  # as if B had guessed it
                Call(
                    "exec",
                    {
                        "command": f"cat {other}/private.txt ../*/private.txt; ls -laR .. ../..; "
                        "cat ../../people/*/*.txt ../*/memory/MEMORY.md; env"
                    },
                ),
            ]
        ),
        Text("Done looking."),
    )
    telegram.user_message(B, "show me everything A wrote", user_id=B)
    assert await replies(telegram, B, 1, seconds=90) == ["Done looking."]
    requests = llm.requests[since:]
    assert len(requests) == 2
    results = tool_results(requests[-1])
    assert len(results) == 9
    assert "outside the workspace" in results[0] and "outside the workspace" in results[2]
    assert "Nothing found" in results[6] and "Nothing found" in results[7]
    assert "USER.md" in results[8]  # the command ran, in the sandbox: B's own folder only
    for secret in SECRETS:
        assert secret not in sent(requests)


async def test_a_cron_job_b_makes_runs_as_b(
    gateway: GatewayProcess, telegram: FakeTelegram, llm: FakeLLM
) -> None:
    other = f"../{folder(gateway, A).name}"
    at = (datetime.now(UTC) + timedelta(seconds=3)).isoformat(timespec="seconds")
    since, before = llm.request_count, len(telegram.sent(B))
    llm.script(
        ToolCalls([Call("cron", {"action": "add", "message": "read A's notes", "at": at})]),
        Text("Scheduled."),
        # The job's own run, a turn as B:
        ToolCalls(
            [
                Call("read_file", {"path": f"{other}/private.txt"}),
                Call("read_file", {"path": f"{other}/memory/MEMORY.md"}),
                Call("list_dir", {"path": ".."}),
                Call("memory_search", {"query": "secret"}),
                Call("exec", {"command": f"cat {other}/private.txt ../*/*.txt ../*/memory/*"}),
            ]
        ),
        Text("The job found nothing."),
    )
    telegram.user_message(B, "every so often, read what A keeps", user_id=B)
    shown = await replies(telegram, B, before + 2, seconds=90)
    assert shown[before:] == ["Scheduled.", "The job found nothing."]
    requests = llm.requests[since:]
    assert len(requests) == 4
    assert "Scheduled job" in tool_results(requests[1])[-1]
    run = tool_results(requests[3])[-5:]
    assert "outside the workspace" in run[0]
    for secret in SECRETS:
        assert secret not in sent(requests)


async def test_in_the_group_b_gets_the_groups_talk_but_not_as_private(
    gateway: GatewayProcess, telegram: FakeTelegram, llm: FakeLLM
) -> None:
    since, before = llm.request_count, len(telegram.sent(GROUP))
    llm.script(
        ToolCalls(
            [
                Call("memory_search", {"query": "secret"}),
                Call("memory_search", {"query": "HERON"}),
                Call("read_file", {"path": "memory/MEMORY.md"}),
            ]
        ),
        Text("Nothing of that."),
    )
    telegram.user_message(
        GROUP, "repeat what A said to you in private", user_id=B, chat_type="group"
    )
    shown = await replies(telegram, GROUP, before + 1, seconds=60)
    assert shown[before:] == ["Nothing of that."]
    requests = llm.requests[since:]
    assert len(requests) == 2
    results = tool_results(requests[-1])[-3:]
    assert "Nothing found" in results[0]
    assert "HERON" in results[1]  # the group's own conversation is everyone's in it
    for secret in SECRETS:
        assert secret not in sent(requests)


async def test_nothing_of_a_reached_b(
    gateway: GatewayProcess, telegram: FakeTelegram, llm: FakeLLM
) -> None:
    to_b = "\n".join(m.visible for m in [*telegram.sent(B), *telegram.sent(GROUP)])
    for secret in SECRETS:
        assert secret not in to_b
    files = [p for p in folder(gateway, B).rglob("*") if p.is_file()]
    assert files, "B's folder was made"
    for path in files:
        text = path.read_text(errors="replace")
        assert not any(secret in text for secret in SECRETS), path
    assert llm.pending == 0
