"""End to end: spoken replies through `nanobot gateway`, the fake Bot API, the fake Discord
and the fake OpenAI server's `/audio/transcriptions` and `/audio/speech`, as a user sees
them: a voice note answered with a voice note and its text, a typed message with text, a
chat's `/voice on`, a long reply, a speech service that fails, Discord's audio attachment.
One gateway serves them all, each test in chats of its own. (A crash mid-delivery is
played in process, on the real outbox: tests/test_channel_telegram.py.)
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests._module_fakes import module_fake
from tests.fakes import audio
from tests.fakes.discord import FakeDiscord
from tests.fakes.llm import FakeLLM, ServerError, Text
from tests.fakes.telegram import DEFAULT_TOKEN, FakeTelegram, SentMessage
from tests.gateway_process import GatewayProcess
from tests.test_gateway_telegram import gateway_config

pytestmark = [
    pytest.mark.process,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.xdist_group("voice-replies-gateway"),
]

TTS = "openai/tts-1"
ALLOWED = range(5101, 5150)
ADA = 515151
_chats = iter(ALLOWED)
_notes = itertools.count(1)


def config(root: Path, llm: FakeLLM, telegram: FakeTelegram) -> dict[str, Any]:
    settings = gateway_config(root, llm, telegram)
    settings["channels"]["telegram"] |= {
        "allow_from": list(ALLOWED),
        "voice_replies": "when_spoken",
    }
    endpoint = {"api_base": llm.base_url, "api_key": "sk-audio-secret-key-424242"}
    settings["transcription"] = {"model": "openai/whisper-1", **endpoint}
    settings["tts"] = {"model": TTS, "voice": "nova", "timeout": 20, **endpoint}
    return settings


llm = module_fake("llm", FakeLLM)


telegram = module_fake("telegram", lambda: FakeTelegram(token=DEFAULT_TOKEN))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def discord() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as fake:
        fake.add_user("ada", user_id=ADA)
        yield fake


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(
    tmp_path_factory: pytest.TempPathFactory,
    llm: FakeLLM,
    telegram: FakeTelegram,
    discord: FakeDiscord,
) -> AsyncIterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("voice-replies")
    settings = config(root, llm, telegram)
    settings["channels"]["discord"] = {
        "enabled": True,
        "token": "discord-bot-token-secret",
        "allow_from": [ADA],
        "api_base": discord.api_base,
        "gateway_url": discord.gateway_url,
        "voice_replies": "always",
    }
    process = GatewayProcess(root, settings, dict(os.environ))
    try:
        await process.start(ready="gateway started")
        await process.wait_log("telegram connected", seconds=60)
        await process.wait_log("discord connected", seconds=60)
        yield process
    finally:
        await process.stop(signal.SIGKILL)
    assert process.leaks() == []


def voice_note(llm: FakeLLM, telegram: FakeTelegram, chat: int, words: str) -> None:
    """`chat`'s user sends a voice note saying `words` (a real OGG/Opus file of its own)."""
    data = audio.ogg_opus(2.0 + next(_notes) / 10)
    llm.add_transcript(data, words)
    telegram.user_voice(chat, content=data, duration=2, user_id=chat)


async def settled(telegram: FakeTelegram, chat: int, count: int) -> list[SentMessage]:
    """The chat's messages once there are `count`, and no more come for a second."""
    await telegram.wait_for_sent(count, chat, seconds=60)
    with pytest.raises(TimeoutError):
        await telegram.wait_for(lambda: len(telegram.sent(chat)) > count, seconds=1.0)
    return telegram.sent(chat)


def spoken_audio(message: SentMessage) -> bytes:
    assert message.method == "sendVoice" and message.file is not None
    content = message.file.content
    assert content.startswith(b"OggS") and (audio.duration(content) or 0) > 0
    return content


async def test_a_voice_note_is_answered_with_a_voice_note_and_its_text(
    gateway: GatewayProcess, llm: FakeLLM, telegram: FakeTelegram
) -> None:
    chat, before = next(_chats), len(llm.speech_requests)
    llm.script(Text("It will be **sunny** all day; no `umbrella` needed."))
    voice_note(llm, telegram, chat, "what is the weather like")
    [reply] = await settled(telegram, chat, 1)
    spoken_audio(reply)
    assert reply.visible == "It will be sunny all day; no umbrella needed."  # the caption
    assert reply.reply_to is not None  # it answers the note
    [speech] = llm.speech_requests[before:]
    assert (speech.model, speech.voice, speech.response_format) == ("tts-1", "nova", "opus")
    assert speech.input == "It will be sunny all day; no needed."  # code is never spoken
    assert llm.requests[-1].messages[-1]["content"].endswith("what is the weather like")


async def test_a_typed_message_gets_text_only_unless_the_chat_says_voice_on(
    gateway: GatewayProcess, llm: FakeLLM, telegram: FakeTelegram
) -> None:
    chat, before = next(_chats), len(llm.speech_requests)
    llm.script(Text("Typed answer."))
    telegram.user_message(chat, "just typing", user_id=chat)
    [typed] = await settled(telegram, chat, 1)
    assert (typed.method, typed.visible) == ("sendMessage", "Typed answer.")

    telegram.user_message(chat, "/voice on", user_id=chat)
    await telegram.wait_for_sent(2, chat, seconds=30)
    assert telegram.sent(chat)[1].visible.startswith("Spoken replies here: on")
    llm.script(Text("Now you hear me."))
    telegram.user_message(chat, "typing again", user_id=chat)
    *_, voiced = await settled(telegram, chat, 3)
    spoken_audio(voiced)
    assert voiced.visible == "Now you hear me."
    assert [r.input for r in llm.speech_requests[before:]] == ["Now you hear me."]
    telegram.user_message(chat, "/voice", user_id=chat)
    await telegram.wait_for_sent(4, chat, seconds=30)
    assert "chosen here" in telegram.sent(chat)[3].visible


async def test_a_long_reply_is_a_voice_note_then_its_text(
    gateway: GatewayProcess, llm: FakeLLM, telegram: FakeTelegram
) -> None:
    chat = next(_chats)
    text = " ".join(f"Point {n} is worth making." for n in range(60))  # over 1,024 characters
    llm.script(Text(text))
    voice_note(llm, telegram, chat, "tell me everything")
    voice, rest = await settled(telegram, chat, 2)
    spoken_audio(voice)
    assert voice.visible == "" and (rest.method, rest.visible) == ("sendMessage", text)


async def test_failing_speech_leaves_the_text_delivered_once(
    gateway: GatewayProcess, llm: FakeLLM, telegram: FakeTelegram
) -> None:
    chat, after = next(_chats), len(gateway.lines)
    llm.script_for(TTS, ServerError(500))  # agent.max_retries 0: not retried
    llm.script(Text("You still get the words."))
    voice_note(llm, telegram, chat, "are you there")
    [reply] = await settled(telegram, chat, 1)
    assert (reply.method, reply.visible) == ("sendMessage", "You still get the words.")
    await gateway.wait_log("no speech made", after=after)
    assert llm.pending == 0


async def test_discord_gets_an_audio_attachment_with_the_text(
    gateway: GatewayProcess, llm: FakeLLM, discord: FakeDiscord
) -> None:
    dm = discord.dm_channel(ADA)
    llm.script(Text("Hello from the speaker."))
    asked = discord.user_message(dm, "say hello", user_id=ADA)
    await discord.wait_for_sent(1, dm, seconds=60)
    [sent] = discord.sent(dm)
    assert sent.content == "Hello from the speaker." and sent.reply_to == asked
    [attached] = sent.attachments
    assert attached.filename == "reply.ogg" and attached.data.startswith(b"OggS")
    assert llm.speech_requests[-1].input == "Hello from the speaker."
