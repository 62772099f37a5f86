"""End to end: what a cluster of `nanobot gateway` processes on one PostgreSQL database
promises when one of them dies at the worst moment (issue 17 §3).

Three members with short leases (`cluster.lease_seconds: 2`), the fake Bot API's webhook
balanced to one of them (or, for the leader, polling). Each test kills a member with
SIGKILL where it hurts and checks, as a user would see it, that the work is finished by
another member exactly once: mid-tool (the tool is not run again), while sending a reply in
parts (no part twice), the polling leader, the schedule leader just before a cron job is due,
and an approval pressed on a member other than the one whose run waits for it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nanobot.store import Database
from nanobot.store._times import to_text
from tests.fakes.llm import Call, FakeLLM, Text, ToolCalls
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram
from tests.fakes.telegram import Hang as FakeHang
from tests.gateway_process import GatewayProcess
from tests.test_cluster_gateways import (
    Cluster,
    exited,
    fetch,
    holder_pid,
    member_config,
    replies_confirmed,
    texts,
)
from tests.test_gateway_approvals import card, execs, press, request_id, said, until
from tests.test_gateway_telegram import ALICE, BOB, GROUP, nanobot_cli

pytestmark = pytest.mark.process  # nanobot's own processes (tests/_layers.py)

LEASE = 2  # seconds: cluster.lease_seconds, short so that takeovers come quickly
CUT_OFF = "may have run in part or in whole"  # what a resumed turn tells the model
STANDBY = "another gateway plays the role intake:telegram"

Launch = Callable[..., Awaitable[Cluster]]


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(token=DEFAULT_TOKEN, webhook_retry=0.5) as fake:
        yield fake


@pytest.fixture
async def launch(
    tmp_path: Path, fake_llm: FakeLLM, telegram: FakeTelegram, postgres_url: str
) -> AsyncIterator[Launch]:
    """Start a cluster of `members` gateways with short leases; `change(config)` edits
    every member's config first (a webhook balanced to the first member unless removed).
    Every member still running after the test is killed."""
    started: list[GatewayProcess] = []

    async def start(
        members: int = 3, change: Callable[[dict[str, Any]], None] | None = None
    ) -> Cluster:
        workspace = tmp_path / "shared-workspace"
        processes = []
        for n in range(members):
            root = tmp_path / f"member{n}"
            root.mkdir()
            config = member_config(root, fake_llm, telegram, postgres_url, workspace)
            config["cluster"] = {"lease_seconds": LEASE}
            if change is not None:
                change(config)
            processes.append(GatewayProcess(root, config, dict(os.environ)))
        started.extend(processes)
        cluster = Cluster(processes, telegram)
        async with await Database.open(postgres_url):  # the schema, so all start at once
            pass
        await cluster.start(migrated=True)
        return cluster

    yield start
    for member in started:
        if member.process is not None and member.process.returncode is None:
            await member.stop(signal.SIGKILL)


def by_pid(cluster: Cluster, pid: int) -> GatewayProcess:
    (found,) = [m for m in cluster.members if m.process is not None and m.process.pid == pid]
    return found


def others(cluster: Cluster, member: GatewayProcess) -> list[GatewayProcess]:
    return [m for m in cluster.members if m is not member]


async def test_a_member_killed_mid_tool_has_its_turn_finished_without_the_tool_run_again(
    launch: Launch, telegram: FakeTelegram, fake_llm: FakeLLM, postgres_url: str, tmp_path: Path
) -> None:
    cluster = await launch()
    runs = tmp_path / "shared-workspace" / "runs.txt"
    command = "echo started >> runs.txt; sleep 30; echo finished >> runs.txt"
    fake_llm.script(
        ToolCalls([Call("exec", {"command": command}, id="slow")]),
        Text("The command was cut off; shall I run it again?"),
    )
    telegram.user_message(42, "run the slow thing", user_id=42)
    await until(runs.exists, seconds=30)  # the tool runs
    holder = by_pid(cluster, await holder_pid(postgres_url, "telegram:42"))
    await holder.kill()
    survivors = others(cluster, holder)
    await cluster.balance_to(survivors[0])

    await telegram.wait_for(lambda: len(telegram.sent(42)) == 1, seconds=30)
    await asyncio.sleep(1)  # anything doubled would have arrived by now
    assert [m.visible for m in telegram.sent(42)] == [
        "The command was cut off; shall I run it again?"
    ]
    assert runs.read_text().splitlines() == ["started"]  # not run again, nor finished
    assert fake_llm.request_count == 2
    resumed = fake_llm.requests[-1].messages
    assert resumed[-1]["role"] == "tool" and resumed[-1]["tool_call_id"] == "slow"
    assert CUT_OFF in resumed[-1]["content"]
    assert sum("resuming its turn" in m.log() for m in survivors) == 1


async def test_a_member_killed_while_sending_a_long_reply_leaves_the_rest_to_another(
    launch: Launch, telegram: FakeTelegram, fake_llm: FakeLLM, postgres_url: str
) -> None:
    cluster = await launch()
    paragraphs = [f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 12 for i in range(40)]
    fake_llm.script(Text("\n\n".join(paragraphs)))  # four Telegram messages
    telegram.user_message(42, "write a lot", user_id=42)
    await telegram.wait_for_sent(1, 42, seconds=30)
    telegram.fail_next("sendMessage", FakeHang(), chat_id=42)  # the second part hangs

    def posted() -> int:
        return sum(c.params.get("chat_id") == "42" for c in telegram.calls("sendMessage"))

    await telegram.wait_for(lambda: posted() >= 2, seconds=30)
    holder = by_pid(cluster, await holder_pid(postgres_url, "telegram:42"))
    await holder.kill()
    assert len(telegram.sent(42)) == 1
    survivors = others(cluster, holder)
    await cluster.balance_to(survivors[0])

    def whole() -> bool:
        return "Paragraph 39" in "".join(m.visible for m in telegram.sent(42))

    # Taken as soon as the dead member's session lease lapses, not once its beats are
    # missed for `ALONE` (45 s).
    await telegram.wait_for(whole, seconds=LEASE + 20)
    await asyncio.sleep(1)  # anything doubled would have arrived by now
    sent = [m.visible for m in telegram.sent(42)]
    assert [sum(f"Paragraph {i}:" in m for m in sent) for i in range(40)] == [1] * 40
    assert fake_llm.request_count == 1  # the reply was sent on, not written again
    assert sum("that a stopped member left unsent" in m.log() for m in survivors) == 1


async def role_holder(cluster: Cluster, url: str, role: str) -> GatewayProcess:
    """The member the lease of `role` names (its holder, or the last one if it lapsed)."""
    rows = await fetch(
        url,
        "SELECT m.pid FROM leases l JOIN members m ON m.id = l.holder WHERE l.name = $1",
        role,
    )
    (row,) = rows
    return by_pid(cluster, int(row["pid"]))


def polling(config: dict[str, Any]) -> None:
    del config["channels"]["telegram"]["webhook"]


async def test_the_polling_leader_killed_is_replaced_and_a_message_sent_meanwhile_answered_once(
    launch: Launch, telegram: FakeTelegram, postgres_url: str
) -> None:
    cluster = await launch(change=polling)
    await telegram.wait_for(lambda: telegram.polling, seconds=30)
    poller = await role_holder(cluster, postgres_url, "intake:telegram")
    survivors = others(cluster, poller)
    for member in survivors:
        await member.wait_log(STANDBY)
    telegram.user_message(41, "before", user_id=41)
    await telegram.wait_for(lambda: len(telegram.sent(41)) == 1, seconds=30)
    await replies_confirmed(postgres_url)

    await poller.kill()
    telegram.user_message(43, "meanwhile", user_id=43)  # Telegram keeps it for the next poll
    await telegram.wait_for(lambda: len(telegram.sent(43)) == 1, seconds=LEASE + 20)
    await asyncio.sleep(1)  # anything doubled would have arrived by now
    assert texts(telegram, 41) == ["before"] and texts(telegram, 43) == ["meanwhile"]
    assert sum("took the role intake:telegram" in m.log() for m in survivors) == 1
    assert telegram.conflicts == 0  # never two pollers at once
    assert await role_holder(cluster, postgres_url, "intake:telegram") in survivors


async def test_a_cron_job_due_while_its_schedule_leader_dies_runs_once(
    launch: Launch, telegram: FakeTelegram, fake_llm: FakeLLM, postgres_url: str
) -> None:
    cluster = await launch()
    leader = await role_holder(cluster, postgres_url, "schedule")
    due = datetime.now(UTC) + timedelta(seconds=12)  # the command takes a moment (more under load)
    await nanobot_cli(
        leader,
        "cron",
        "add",
        "--name",
        "stretch",
        "--message",
        "remind me to stretch",
        "--at",
        due.isoformat(),
        "--channel",
        "telegram",
        "--to",
        "42",
    )
    fake_llm.script(Text("Time to stretch!"))
    # The leader dies a second before the job is due, and nobody schedules for a lease.
    await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds() - 1))
    await leader.kill()
    survivors = others(cluster, leader)

    await telegram.wait_for(lambda: len(telegram.sent(42)) == 1, seconds=LEASE + 20)
    await asyncio.sleep(1)  # anything doubled would have arrived by now
    assert [m.visible for m in telegram.sent(42)] == ["Time to stretch!"]
    assert fake_llm.request_count == 1
    assert sum("took the role schedule" in m.log() for m in survivors) == 1
    assert "cron job" not in leader.log()  # it did not start before it died
    runs = await fetch(postgres_url, "SELECT status, delivery FROM cron_runs")
    assert [(r["status"], r["delivery"]) for r in runs] == [("ok", "delivered")]


def approvals_asked(config: dict[str, Any]) -> None:
    config["tools"] = {"approval": {"exec": "ask", "timeout": "10m"}}
    config["channels"]["telegram"]["approvers"] = [ALICE]


async def member_id(url: str, member: GatewayProcess) -> str:
    assert member.process is not None
    rows = await fetch(url, "SELECT id FROM members WHERE pid = $1", member.process.pid)
    return str(rows[0]["id"])


async def test_an_approval_pressed_on_another_member_lets_the_waiting_run_go_on_at_once(
    launch: Launch, telegram: FakeTelegram, fake_llm: FakeLLM, postgres_url: str, tmp_path: Path
) -> None:
    cluster = await launch(change=approvals_asked)
    fake_llm.script(execs("echo ran >> group-made.txt"), Text("Made it for the group."))
    telegram.user_message(
        GROUP, "@nanobot_test_bot make the file", user_id=BOB, chat_type="supergroup"
    )
    shown = await card(telegram, ALICE)  # in the approver's private chat: another session
    waiting = by_pid(cluster, await holder_pid(postgres_url, f"telegram:{GROUP}"))
    presser = others(cluster, waiting)[0]
    # Alice's session is the presser's, as if she had talked to it before (which member
    # takes a free session is a race): the press is answered there, not where the run waits.
    await fetch(
        postgres_url,
        "INSERT INTO leases (name, holder, token, acquired_at, expires_at)"
        " VALUES ($1, $2, 1, $3, $3)",
        f"session:telegram:{ALICE}",
        await member_id(postgres_url, presser),
        to_text(datetime.now(UTC) + timedelta(seconds=LEASE)),
    )
    await cluster.balance_to(presser)

    assert await press(telegram, shown, "Allow once") == "Decided."
    await said(telegram, GROUP, "Made it for the group.")  # long before the request expires
    await asyncio.sleep(1)  # anything doubled would have arrived by now
    done = [m for m in telegram.sent(GROUP) if m.visible == "Made it for the group."]
    assert len(done) == 1
    made = tmp_path / "shared-workspace" / "group-made.txt"
    assert made.read_text().splitlines() == ["ran"]
    decided = f"approval {request_id(shown)}: once by {ALICE}"
    assert decided in presser.log() and decided not in waiting.log()


async def test_a_dead_members_pending_approval_is_settled_by_the_member_that_takes_over(
    launch: Launch, telegram: FakeTelegram, fake_llm: FakeLLM, postgres_url: str, tmp_path: Path
) -> None:
    # The card waits in Alice's chat; the member whose run waits dies. The member that takes
    # the session over settles the request as a restart does: the card says so, the call is
    # reported as not run, and the turn goes on to its end there. Nothing waits 10 minutes.
    cluster = await launch(change=approvals_asked)
    fake_llm.script(execs("echo ran >> orphan.txt"), Text("It was not run; ask me again."))
    telegram.user_message(ALICE, "make the file", user_id=ALICE)
    shown = await card(telegram, ALICE)
    # Killed before it recorded the card as delivered, the member's card would be sent again
    # (a second card, the one edited): the case here is a card the store knows.
    await replies_confirmed(postgres_url)
    asking = by_pid(cluster, await holder_pid(postgres_url, f"telegram:{ALICE}"))
    await asking.kill()
    if cluster.balanced is asking:
        await cluster.balance_to(others(cluster, asking)[0])

    await said(telegram, ALICE, "It was not run; ask me again.", seconds=LEASE + 30)
    edited = next(m for m in telegram.sent(ALICE) if m.message_id == shown.message_id)
    assert "the gateway that asked stopped before it was approved" in edited.visible
    assert not edited.buttons
    resumed = fake_llm.requests[-1].messages
    assert resumed[-1]["role"] == "tool"
    assert (
        "Not run: the gateway that asked stopped before it was approved" in resumed[-1]["content"]
    )
    assert not (tmp_path / "shared-workspace" / "orphan.txt").exists()
    rows = await fetch(postgres_url, "SELECT state FROM approval_requests")
    assert [r["state"] for r in rows] == ["expired"]


async def test_a_member_stalled_past_its_lease_and_resumed_does_not_answer_again(
    launch: Launch, telegram: FakeTelegram, fake_llm: FakeLLM, postgres_url: str
) -> None:
    # SIGSTOP mid-model: another member takes the chat over once the lease lapses. The
    # stalled one is resumed while the other's turn is still mid-model: its own model answer
    # is there already and it would reply first, but the message is claimed by the other
    # member now, so its answer is refused. One answer, the taker's; every member alive.
    cluster = await launch()
    fake_llm.script(
        Text("From the stalled member.", delay=1),
        Text("From the member that took over.", delay=3),
    )
    telegram.user_message(77, "what time is it", user_id=77)
    await fake_llm.wait_for_requests(1, seconds=30)
    stalled = by_pid(cluster, await holder_pid(postgres_url, "telegram:77"))
    assert stalled.process is not None
    os.kill(stalled.process.pid, signal.SIGSTOP)
    try:
        if cluster.balanced is stalled:
            await cluster.balance_to(others(cluster, stalled)[0])
        await fake_llm.wait_for_requests(2, seconds=LEASE * 10)  # the taker's, mid-model
    finally:
        os.kill(stalled.process.pid, signal.SIGCONT)
    await said(telegram, 77, "From the member that took over.", seconds=30)
    await asyncio.sleep(LEASE * 2)  # its model answer arrives, its turn ends, it renews
    assert [m.visible for m in telegram.sent(77)] == ["From the member that took over."]
    assert exited(cluster) == {}
    telegram.user_message(77, "and now?", user_id=77)  # the cluster goes on answering
    await until(lambda: len(telegram.sent(77)) == 2, seconds=30)
