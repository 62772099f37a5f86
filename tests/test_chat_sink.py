"""What a turn shows in its chat: the answer as it is written, typing, progress texts."""

from __future__ import annotations

from nanobot.agent.chat_sink import STREAM_INTERVAL, ChatSink, StreamIds, streamer
from nanobot.agent.run import RunEvent, RunResult, RunState
from nanobot.agent.turn import Reply
from nanobot.bus.events import ChatRef, Outbound, OutboundMessage, StreamUpdate, Typing
from nanobot.bus.queue import MessageBus

CHAT = ChatRef("telegram", "1")


def drain(bus: MessageBus) -> list[Outbound]:
    queue = bus._channel("telegram")._queue
    items: list[Outbound] = []
    while not queue.empty():
        entry = queue.get_nowait()
        assert isinstance(entry, tuple)
        items.append(entry[0])
    return items


async def test_a_reply_streamed_in_quickly_goes_out_whole_and_a_slow_one_as_it_comes() -> None:
    bus = MessageBus()
    chat = ChatRef("telegram", "1")
    now = [100.0]
    listener = streamer(bus, chat, "m1", "s1", clock=lambda: now[0])

    def delta(text: str, after: float) -> None:
        now[0] += after
        listener(RunEvent("message_update", "run", "session", text=text))

    listener(RunEvent("message_start", "run", "session"))
    for word in ("The ", "whole ", "answer"):
        delta(word, 0.1)  # all within STREAM_INTERVAL of the first: nothing shown early
    assert bus.pending("telegram") == 0

    delta(" and", STREAM_INTERVAL)  # the answer has been arriving for a while: show it
    delta(" more", 0.1)  # too soon after that
    delta(" still", STREAM_INTERVAL)
    shown: list[str] = []
    bus.close_outbound()
    async for item in bus.outbound("telegram"):
        assert isinstance(item, StreamUpdate)
        assert (item.stream_id, item.reply_to) == ("s1", "m1")
        shown.append(item.text)
    assert shown == ["The whole answer and", "The whole answer and more still"]


async def test_a_shown_turn_types_once_started_sends_to_its_chat_and_hands_each_reply_on() -> None:
    bus = MessageBus()
    delivered: list[tuple[str | None, str]] = []

    async def deliver(reply: Reply, stream_id: str) -> None:
        delivered.append((reply.text, stream_id))

    sink = ChatSink(
        bus, CHAT, deliver, StreamIds("telegram-7"), shown=True, streamed=True, reply_to="m1"
    )
    assert sink.sends and sink.live
    assert drain(bus) == []  # waiting for a slot: no typing yet
    sink.started()
    sink.event(RunEvent("status", "run", "session", state=RunState.AWAITING_HUMAN))
    await sink.send("working on it")
    await sink.reply(Reply("first", RunResult("r1", "session", "completed", "first")))
    await sink.reply(Reply("second", RunResult("r2", "session", "completed", "second")))
    sink.stop()
    assert drain(bus) == [
        Typing(CHAT, active=True),
        Typing(CHAT, active=False),  # waiting for a person: nothing is being written
        OutboundMessage(CHAT, "working on it", kind="progress"),
    ]
    assert delivered == [("first", "telegram-7"), ("second", "telegram-7-1")]


async def test_an_unshown_turn_shows_nothing_and_its_answer_comes_whole() -> None:
    bus = MessageBus()

    async def deliver(reply: Reply, stream_id: str) -> None:
        raise AssertionError("no reply here")

    sink = ChatSink(
        bus, CHAT, deliver, StreamIds("telegram-7"), shown=False, streamed=True, reply_to=None
    )
    assert not sink.sends and not sink.live
    sink.started()
    sink.event(RunEvent("message_start", "run", "session"))
    sink.event(RunEvent("message_update", "run", "session", text="hi"))
    sink.stop()
    assert drain(bus) == []
