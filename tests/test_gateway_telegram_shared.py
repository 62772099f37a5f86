"""End to end against one gateway for the whole module: the tests that only talk to a running
`nanobot gateway` (they neither stop, restart nor reconfigure it) share its start-up, each in
chats of its own. The tests that do any of that keep a gateway each
(`tests/test_gateway_telegram.py`).

Each test starts from a quiet gateway and leaves one: every reply it scripted consumed,
nothing still being answered (`quiet`); the fakes' records are read from where the test
began (`Since`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from tests._module_fakes import module_fake
from tests.fakes.llm import Call, FakeLLM, Hang, RecordedRequest, Text, ToolCalls
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram, RateLimited, ServerError
from tests.gateway_process import GatewayProcess
from tests.test_gateway_telegram import gateway_config, replies

# One worker runs them all (make test: --dist loadgroup), so one gateway serves them.
pytestmark = [
    pytest.mark.process,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.xdist_group("shared-gateway"),
]

ALLOWED = range(3001, 3100)  # one or two of these per test
STRANGERS = range(7001, 7100)
_allowed, _strangers, _groups = iter(ALLOWED), iter(STRANGERS), itertools.count(-100900, -1)


llm = module_fake("llm", FakeLLM)


telegram = module_fake("telegram", lambda: FakeTelegram(token=DEFAULT_TOKEN))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(
    tmp_path_factory: pytest.TempPathFactory, llm: FakeLLM, telegram: FakeTelegram
) -> AsyncIterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("shared-gateway")
    config = gateway_config(root, llm, telegram)
    config["channels"]["telegram"]["allow_from"] = list(ALLOWED)
    process = GatewayProcess(root, config, dict(os.environ))
    try:
        await process.start(ready="telegram connected")
        yield process
    finally:
        await process.stop(signal.SIGKILL)
    assert process.leaks() == []  # conftest audits it once, after the first test only


@dataclass
class Since:
    """What the fakes recorded since the test began."""

    llm: FakeLLM
    first: int

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.llm.requests[self.first :]


@pytest.fixture
def since(gateway: GatewayProcess, llm: FakeLLM) -> Iterator[Since]:
    """The test's view of the shared fakes; after it, the gateway must be quiet."""
    assert llm.pending == 0, "a test before left scripted replies unconsumed"
    yield Since(llm, llm.request_count)
    assert llm.pending == 0, "the test left scripted replies unconsumed"


def chat() -> int:
    """A private chat (its user's id) allowed in, that no other test uses."""
    return next(_allowed)


async def test_answers_a_private_message(
    gateway: GatewayProcess, telegram: FakeTelegram, llm: FakeLLM, since: Since
) -> None:
    alice = chat()
    llm.script(Text("Hello Alice!"))
    telegram.user_message(alice, "hi there", user_id=alice)
    assert await replies(telegram, alice, 1) == ["Hello Alice!"]
    assert since.requests[0].messages[-1]["content"].endswith("hi there")
    assert "sk-test-secret-key-123456" not in gateway.log()


async def test_a_slow_chat_does_not_delay_another(
    telegram: FakeTelegram, llm: FakeLLM, since: Since
) -> None:
    alice, bob = chat(), chat()
    llm.script(Hang(), Text("quick answer for Bob"))
    telegram.user_message(alice, "think about this for a long time", user_id=alice)
    await llm.wait_for_requests(since.first + 1, seconds=30)
    telegram.user_message(bob, "quick question", user_id=bob)
    assert await replies(telegram, bob, 1) == ["quick answer for Bob"]
    assert telegram.sent(alice) == []
    telegram.user_message(alice, "/stop", user_id=alice)
    assert await replies(telegram, alice, 1) == ["Stopped."]  # once: the turn adds none


async def test_steering_mid_turn(telegram: FakeTelegram, llm: FakeLLM, since: Since) -> None:
    alice = chat()
    llm.script(
        ToolCalls(
            [
                Call("exec", {"command": "sleep 2"}, id="slow"),
                Call("exec", {"command": "echo never"}, id="skipped"),
            ]
        ),
        Text("Switching to your new request."),
    )
    telegram.user_message(alice, "run two commands", user_id=alice)
    await llm.wait_for_requests(since.first + 1, seconds=30)
    telegram.user_message(alice, "actually, do something else", user_id=alice)
    assert await replies(telegram, alice, 1) == ["Switching to your new request."]
    second = since.requests[1].messages
    results = {m["tool_call_id"]: m["content"] for m in second if m["role"] == "tool"}
    assert results["skipped"] == "Skipped due to queued user message."
    assert second[-1]["content"].endswith("actually, do something else")


async def test_pairing_lets_a_stranger_in_without_a_restart(
    gateway: GatewayProcess, telegram: FakeTelegram, llm: FakeLLM, since: Since
) -> None:
    eve = next(_strangers)
    telegram.user_message(eve, "hello?", user_id=eve, first_name="Eve")
    (notice,) = await replies(telegram, eve, 1)
    code = notice.split("nanobot pairing approve ")[1].split()[0]
    assert since.requests == []
    assert f"user {eve}" in gateway.log()
    approve = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nanobot",
        "pairing",
        "approve",
        code,
        env=gateway.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await approve.communicate()
    assert approve.returncode == 0, err.decode()
    assert "Approved Eve" in out.decode()
    llm.script(Text("Welcome, Eve."))
    telegram.user_message(eve, "hello again", user_id=eve, first_name="Eve")
    assert (await replies(telegram, eve, 2))[-1] == "Welcome, Eve."


async def test_group_messages_need_a_mention(
    telegram: FakeTelegram, llm: FakeLLM, since: Since
) -> None:
    group, alice = next(_groups), chat()
    telegram.user_message(
        group, "just chatting among humans", user_id=alice, chat_type="supergroup"
    )
    llm.script(Text("You called?"))
    telegram.user_message(
        group, "@nanobot_test_bot what's up?", user_id=alice, chat_type="supergroup"
    )
    assert await replies(telegram, group, 1) == ["You called?"]
    assert len(since.requests) == 1
    assert "what's up?" in since.requests[0].messages[-1]["content"]


async def test_long_replies_and_tricky_markup_arrive_whole(
    telegram: FakeTelegram, llm: FakeLLM, since: Since
) -> None:
    alice = chat()
    tricky = "a < b && c > d, mail <ada@example.com>, 2 * 3 * 4, *unbalanced, AT&T"
    paragraphs = [f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 12 for i in range(40)]
    answer = tricky + "\n\n" + "\n\n".join(paragraphs)
    llm.script(Text(answer))
    telegram.user_message(alice, "write a lot", user_id=alice)
    await telegram.wait_for(
        lambda: "Paragraph 39" in "".join(m.visible for m in telegram.sent(alice)), seconds=30
    )
    sent = telegram.sent(alice)
    assert len(sent) >= 3
    assert all(len(m.visible.encode("utf-16-le")) // 2 <= 4096 for m in sent)
    visible = " ".join(m.visible for m in sent)
    assert "a < b && c > d" in visible
    assert "ada@example.com" in visible
    assert "2 * 3 * 4, *unbalanced, AT&T" in visible
    for i in range(40):
        assert f"Paragraph {i}:" in visible


async def test_rate_limits_and_server_errors_are_ridden_out(
    telegram: FakeTelegram, llm: FakeLLM, since: Since
) -> None:
    alice = chat()
    telegram.fail_next("sendMessage", RateLimited(retry_after=1))
    telegram.fail_next("sendMessage", ServerError(500))
    llm.script(Text("Eventually."))
    telegram.user_message(alice, "hello", user_id=alice)
    assert await replies(telegram, alice, 1) == ["Eventually."]
    await asyncio.sleep(1)
    assert [m.visible for m in telegram.sent(alice)] == ["Eventually."]  # exactly once
