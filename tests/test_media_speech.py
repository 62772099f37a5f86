"""Replies spoken: what of a reply is read aloud (tables of Markdown), where it is cut, the
real litellm speech API against the fake OpenAI server's `/audio/speech` (OGG/Opus kept in
the workspace, retries, failures, confinement), which replies a chat wants spoken, and the
`/voice` command, with the store on both backends."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from nanobot.agent import commands
from nanobot.bus.events import Attachment, ChatRef, InboundMessage, OutboundMessage
from nanobot.media.speech import (
    KEEP_SPOKEN,
    Speaker,
    SpeechSettings,
    VoiceReplies,
    cut,
    speakable,
)
from nanobot.providers.provider import RetryPolicy
from nanobot.store import Database
from nanobot.store.chats import ChatSettings, VoiceMode
from nanobot.workspace import Workspace
from tests.fakes import audio
from tests.fakes.llm import AuthError, FakeLLM, ServerError
from tests.test_loop import make_parts

MODEL = "openai/tts-1"
CHAT = ChatRef("telegram", "42")


@pytest.fixture
def logs() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="DEBUG", format="{level} {message}")
    yield lines
    logger.remove(sink)


# ---- what is read aloud -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markdown", "spoken"),
    [
        ("Hello **Anna**, it is *sunny* today.", "Hello Anna, it is sunny today."),
        (
            "Run this:\n\n```bash\nrm -rf build\nmake\n```\n\nThen it works.",
            "Run this:\n\nThen it works.",
        ),
        ("~~~\ncode in tildes\n~~~\nAfter.", "After."),
        ("An unclosed fence\n```python\nprint('never said')", "An unclosed fence"),
        ("Call `make test` first, then `make`.", "Call first, then."),
        (
            "Prices:\n\n| item | cost |\n|------|-----:|\n| tea | 2 |\n| cake | 4 |\n\nCheap!",
            "Prices:\n\nCheap!",
        ),
        ("a | b\n--- | ---\n1 | 2\nDone.", "Done."),
        ("See [the docs](https://example.com/docs) or https://example.com/x.", "See the docs or."),
        ("![a chart](chart.png)Figures above.", "Figures above."),
        (
            "# Plan\n\n- buy milk\n- call Anna\n\n> note this",
            "Plan.\n\nbuy milk. call Anna.\n\nnote this.",
        ),
        ("Before\n\n---\n\nAfter <!-- hidden -->", "Before\n\nAfter"),
        ("2 * 3 * 4 = 24 and snake_case_name stay", "2 * 3 * 4 = 24 and snake_case_name stay"),
        ("```\nonly code\n```", ""),
        ("| a | b |\n|---|---|\n| 1 | 2 |", ""),
        ("`x` `y`", ""),
    ],
)
def test_code_tables_and_marks_are_never_spoken(markdown: str, spoken: str) -> None:
    assert speakable(markdown) == spoken


SENTENCES = "One two three. Four five six! Seven eight nine ten eleven twelve."


@pytest.mark.parametrize(
    ("text", "limit", "kept"),
    [
        (SENTENCES, 100, SENTENCES),
        (SENTENCES, 40, "One two three. Four five six!"),
        (SENTENCES, 20, "One two three."),
        ("First paragraph\n\nsecond one goes on", 25, "First paragraph"),
        ("word " * 20, 23, "word word word word"),  # no sentence ends: a word does
        ("x" * 50, 10, "x" * 10),  # nor a word
        ("Short. " + "y" * 40, 30, "Short. " + "y" * 23),  # a stop too early is not taken
    ],
)
def test_a_long_reply_is_cut_where_a_sentence_ends(text: str, limit: int, kept: str) -> None:
    assert cut(text, limit) == kept
    assert len(cut(text, limit)) <= limit


# ---- the speech ---------------------------------------------------------------------------


def speaker(tmp_path: Path, fake: FakeLLM, **settings: object) -> Speaker:
    options: dict[str, object] = {
        "model": MODEL,
        "voice": "nova",
        "api_base": fake.base_url,
        "api_key": "test-key",
        "retry": RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02),
    }
    options.update(settings)
    return Speaker(SpeechSettings(**options), Workspace(tmp_path))  # type: ignore[arg-type]


def reply(text: str, outbox_id: int = 7) -> OutboundMessage:
    return OutboundMessage(CHAT, text, outbox_id=outbox_id, speak=True)


async def test_a_reply_is_spoken_as_ogg_opus_and_kept(
    tmp_path: Path, fake_llm: FakeLLM, logs: list[str]
) -> None:
    speech = speaker(tmp_path, fake_llm)
    path = await speech.voice(reply("It is **sunny**; take `sunscreen` along."))
    assert path is not None and path.parent == tmp_path / "outbox" / "voice"
    assert path.suffix == ".ogg" and audio.duration(path.read_bytes())
    (request,) = fake_llm.speech_requests
    assert (request.model, request.voice, request.response_format) == ("tts-1", "nova", "opus")
    assert request.input == "It is sunny; take along."
    assert request.headers["Authorization"] == "Bearer test-key"
    assert any("reply 7 spoken by openai/tts-1 (nova)" in line for line in logs)
    assert not any("sunny" in line for line in logs if not line.startswith("DEBUG"))
    # Its delivery taken up again after a restart: not paid for twice.
    assert await speech.voice(reply("It is **sunny**; take `sunscreen` along.", 8)) == path
    assert len(fake_llm.speech_requests) == 1
    # Another voice is other audio.
    other = await speaker(tmp_path, fake_llm, voice="alloy").voice(reply("It is sunny."))
    assert other is not None and other != path


async def test_a_long_reply_is_spoken_up_to_the_limit(tmp_path: Path, fake_llm: FakeLLM) -> None:
    text = " ".join(f"Sentence number {n} is here." for n in range(200))
    assert await speaker(tmp_path, fake_llm, max_chars=300).voice(reply(text)) is not None
    (request,) = fake_llm.speech_requests
    assert len(request.input) <= 300 and request.input.endswith("is here.")
    assert text.startswith(request.input)


async def test_nothing_to_speak_makes_no_request(tmp_path: Path, fake_llm: FakeLLM) -> None:
    assert await speaker(tmp_path, fake_llm).voice(reply("```\nls -la\n```")) is None
    assert fake_llm.speech_requests == []


async def test_transient_failures_are_retried_then_the_text_goes_alone(
    tmp_path: Path, fake_llm: FakeLLM, warnings: list[str]
) -> None:
    fake_llm.script_for("tts-1", ServerError(503))
    assert await speaker(tmp_path, fake_llm).voice(reply("Hello there.")) is not None
    assert len(fake_llm.speech_requests) == 2

    fake_llm.script_for("tts-1", *[ServerError(500)] * 3)
    assert await speaker(tmp_path, fake_llm).voice(reply("Something else.", 9)) is None
    assert len(fake_llm.speech_requests) == 5
    assert any(
        "reply 9: no speech made" in line and "the text goes alone" in line for line in warnings
    )
    assert len(list((tmp_path / "outbox" / "voice").iterdir())) == 1  # nothing half-kept


async def test_a_refused_key_is_not_retried(tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.script_for("tts-1", AuthError())
    assert await speaker(tmp_path, fake_llm).voice(reply("Hello.")) is None
    assert len(fake_llm.speech_requests) == 1


async def test_the_audio_is_kept_inside_the_workspace_only(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    # The model's shell can leave a symlink where the audio goes: nothing is written through
    # it, and nothing is sent.
    workspace, outside = tmp_path / "ws", tmp_path / "elsewhere"
    (workspace / "outbox").mkdir(parents=True)
    outside.mkdir()
    (workspace / "outbox" / "voice").symlink_to(outside)
    assert await speaker(workspace, fake_llm).voice(reply("Hello.")) is None
    assert list(outside.iterdir()) == []


async def test_audio_unused_for_a_week_is_removed_as_new_audio_is_made(
    tmp_path: Path, fake_llm: FakeLLM
) -> None:
    speech = speaker(tmp_path, fake_llm)
    used = await speech.voice(reply("Used again today."))
    assert used is not None
    folder = tmp_path / "outbox" / "voice"
    stale, theirs = folder / f"{'a' * 32}.ogg", folder / "notes.ogg"
    for path in (stale, theirs):
        path.write_bytes(b"OggS")
    week_ago = time.time() - KEEP_SPOKEN.total_seconds() - 60
    for path in (used, stale, theirs):
        os.utime(path, (week_ago, week_ago))
    assert await speech.voice(reply("Used again today.", 8)) == used  # used: kept a week more

    fresh = await speaker(tmp_path, fake_llm).voice(reply("Something new."))  # after a start
    assert fresh is not None
    assert sorted(p.name for p in folder.iterdir()) == sorted([used.name, fresh.name, "notes.ogg"])
    stale.write_bytes(b"OggS")
    os.utime(stale, (week_ago, week_ago))
    await speech.voice(reply("Newer still."))
    assert stale.exists(), "looked again within the hour"
    assert speech.prune(time.time() + KEEP_SPOKEN.total_seconds() + 120) == 4  # all but theirs


# ---- which replies are spoken, and /voice --------------------------------------------------


def message(text: str = "hi", *kinds: str, chat: ChatRef = CHAT) -> InboundMessage:
    files = tuple(Attachment(k, Path(f"/ws/inbox/{k}.ogg"), duration=2.0) for k in kinds)  # type: ignore[arg-type]
    return InboundMessage.from_chat(chat, "42", text, "m1", attachments=files)


# The channel's default, the chat's choice, the kinds of the message's files: spoken?
SPOKEN: list[tuple[VoiceMode, VoiceMode | None, tuple[str, ...], bool]] = [
    ("off", None, ("voice",), False),
    ("when_spoken", None, ("voice",), True),
    ("when_spoken", None, ("video_note",), True),
    ("when_spoken", None, ("audio",), False),  # anyone's voice: not the sender speaking
    ("when_spoken", None, ("photo", "voice"), True),
    ("when_spoken", None, (), False),
    ("always", None, (), True),
    ("off", "always", (), True),
    ("always", "off", ("voice",), False),
    ("off", "when_spoken", ("voice",), True),
]


async def test_which_replies_are_spoken(db: Database) -> None:
    chats = ChatSettings(db)
    for number, (default, chosen, kinds, speaks) in enumerate(SPOKEN):
        chat = ChatRef("telegram", str(number))
        voices = VoiceReplies(chats, {"telegram": default, "discord": "off"})
        if chosen is not None:
            await chats.set_voice(chat, chosen, by="42")
        case = (default, chosen, kinds)
        assert await voices.speaks(message("hi", *kinds, chat=chat)) is speaks, case


async def test_nowhere_else_is_a_reply_spoken(db: Database) -> None:
    voices = VoiceReplies(ChatSettings(db), {"telegram": "always"})
    terminal = message(chat=ChatRef("terminal", "local"))
    unsent = InboundMessage.from_chat(CHAT, "42", "hi", "m2", deliver=False)
    assert not await voices.speaks(terminal) and not await voices.speaks(unsent)


async def test_the_voice_command(tmp_path: Path, fake_llm: FakeLLM, db: Database) -> None:
    loop = (await make_parts(tmp_path, fake_llm, db)).loop
    voices = VoiceReplies(ChatSettings(db), {"telegram": "when_spoken", "discord": "off"})

    async def say(text: str, chat: ChatRef = CHAT) -> str:
        return await commands.answer(message(text, chat=chat), loop, None, voices)

    assert await say("/voice") == (
        "Spoken replies here: auto (a voice note is answered with one), the channel's "
        "default. The channel's default is auto. /voice on, /voice off or /voice auto "
        "changes it."
    )
    assert (
        await say("/voice ON") == "Spoken replies here: on (every reply comes as a voice note too)."
    )
    assert await voices.speaks(message("typed"))
    assert (await say("/voice")).startswith(
        "Spoken replies here: on (every reply comes as a voice note too), chosen here."
    )
    assert await say("/voice off") == "Spoken replies here: off (text only)."
    assert not await voices.speaks(message("spoken", "voice"))
    assert (
        await say("/voice auto") == "Spoken replies here: auto (a voice note is answered with one)."
    )
    assert await say("/voice default") == (
        "Spoken replies here: as the channel's default, auto (a voice note is answered with one)."
    )
    assert await ChatSettings(db).voice(CHAT) is None
    # Another chat keeps its own; a topic of this chat shares it.
    await say("/voice on", ChatRef("telegram", "43"))
    assert await ChatSettings(db).voice(ChatRef("telegram", "43", "5")) == "always"
    assert await ChatSettings(db).voice(CHAT) is None

    assert await say("/voice loud") == (
        "Say /voice on, /voice off or /voice auto (or /voice to see the setting)."
    )
    assert await say("/voice", ChatRef("terminal", "local")) == (
        "Spoken replies are sent on Telegram and Discord only."
    )
    unset = await commands.answer(message("/voice on"), loop, None, None)
    assert unset == commands.NO_TTS
    at_the_terminal = message("/voice", chat=ChatRef("terminal", "local"))
    assert (await commands.answer(at_the_terminal, loop, None, None)).endswith("Discord only.")
    assert "/voice [on|off|auto]" in await say("/help")
