"""The message tool: sends to the chat of the current turn, and only there."""

from __future__ import annotations

import asyncio

from nanobot.tools.base import ToolContext, current_context
from nanobot.tools.message import MessageTool
from nanobot.tools.registry import ToolRegistry


def chat(chat_id: str, outbox: list[tuple[str, str]]) -> ToolContext:
    async def send(text: str) -> None:
        outbox.append((chat_id, text))

    return ToolContext("telegram", chat_id, f"telegram:{chat_id}", "run-1", send=send)


async def test_sends_to_the_current_chat_and_records_it() -> None:
    outbox: list[tuple[str, str]] = []
    context = chat("42", outbox)
    token = current_context.set(context)
    try:
        result = await ToolRegistry([MessageTool()]).execute("message", {"text": "working on it"})
    finally:
        current_context.reset(token)
    assert not result.is_error
    assert outbox == [("42", "working on it")]
    assert context.sent == ["working on it"]


async def test_concurrent_turns_send_to_their_own_chats() -> None:
    outbox: list[tuple[str, str]] = []
    tools = ToolRegistry([MessageTool()])

    async def turn(chat_id: str) -> None:
        current_context.set(chat(chat_id, outbox))
        await asyncio.sleep(0)
        await tools.execute("message", {"text": f"hello {chat_id}"})

    async with asyncio.TaskGroup() as group:
        for chat_id in ("a", "b", "c"):
            group.create_task(turn(chat_id))
    assert sorted(outbox) == [("a", "hello a"), ("b", "hello b"), ("c", "hello c")]


async def test_no_chat_to_send_to_is_an_error() -> None:
    tools = ToolRegistry([MessageTool()])
    token = current_context.set(ToolContext("cron", "job", "cron:job", "run-2"))
    try:
        result = await tools.execute("message", {"text": "hi"})
    finally:
        current_context.reset(token)
    assert result.is_error
    assert "no chat to send a message to" in result.content


async def test_outside_a_turn_is_an_error() -> None:
    result = await ToolRegistry([MessageTool()]).execute("message", {"text": "hi"})
    assert result.is_error
    assert "during a conversation turn" in result.content


async def test_empty_text_is_refused() -> None:
    result = await ToolRegistry([MessageTool()]).execute("message", {"text": ""})
    assert result.is_error
    assert "text:" in result.content
