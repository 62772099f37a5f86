"""The chat commands (`/new`, `/stop`, `/status`, ...) and button presses: what each does,
and the answer it gets. A command is answered at once, never as a turn."""

from __future__ import annotations

from typing import Final

from loguru import logger

from nanobot.agent._spend_commands import budget_command, usage_command
from nanobot.agent.loop import AgentLoop
from nanobot.agent.subagents import Subagents
from nanobot.bus.events import InboundMessage
from nanobot.media.speech import SPOKEN_CHANNELS, VoiceReplies
from nanobot.recall import EVERYTHING, Scope
from nanobot.store.chats import VoiceMode
from nanobot.tools.base import ToolError
from nanobot.tools.memory_search import MemoryRecall

HELP = (
    "I'm nanobot, your assistant. Just write to me. Commands:\n"
    "/new - start a fresh conversation (the old one is kept)\n"
    "/stop - stop what I'm doing, background tasks included\n"
    "/tasks - background tasks in this chat and their state\n"
    "/status - model, tokens used, context fill and state\n"
    "/approvals - what waits for your approval, and the saved rules\n"
    "/approve ID [once|chat|always], /deny ID - decide on a request (the card's buttons do it)\n"
    "/voice [on|off|auto] - spoken replies here: always, never, or when you sent a voice note\n"
    "/search TEXT - find TEXT in past conversations and the memory files\n"
    "/usage - what you spent today and this month, and what is left of your budgets\n"
    "/budget [raise USD today|month [ID|all|cron|heartbeat]] - the budgets (approvers raise)\n"
    "/help - this message"
)

# What `/voice <word>` chooses (None: the channel's default again), and how each mode reads.
VOICE_WORDS: Final[dict[str, VoiceMode | None]] = {
    "on": "always",
    "off": "off",
    "auto": "when_spoken",
    "default": None,
}
_VOICE_MODES: Final[dict[VoiceMode, str]] = {
    "always": "on (every reply comes as a voice note too)",
    "when_spoken": "auto (a voice note is answered with one)",
    "off": "off (text only)",
}
_WORD: Final[dict[VoiceMode, str]] = {m: w for w, m in VOICE_WORDS.items() if m is not None}
NO_TTS: Final = (
    'Spoken replies need `tts.model` in the config (docs/channels.md, "Spoken replies").'
)


async def answer(
    message: InboundMessage,
    loop: AgentLoop,
    subagents: Subagents | None,
    voices: VoiceReplies | None = None,
    recall: MemoryRecall | None = None,
) -> str:
    """Do what the command (or press) `message` says, in its session; the answer for it.
    `voices`: the chats' choice of spoken replies (None: none are made here). `recall`: the
    memory search (None: `/search` says it is not offered here).

    Raises:
        StoreError: what it had to read or change could not be.
    """
    key = message.session_key
    approver = loop.approver
    match message.command:
        case "approve" | "deny" | "approvals":
            text = (
                await approver.command(message)
                if approver is not None
                else "Approvals are not used here."
            )
        case "new":
            await loop.new_session(key)
            if approver is not None:
                await approver.new_session(key)
            text = "Started a new conversation. The old one is kept."
        case "stop":
            cancelled = subagents.cancel_session(key) if subagents else 0
            text = _stopped(loop.abort(key), cancelled)
        case "tasks":
            text = (
                subagents.describe(key)
                if subagents is not None
                else "Background tasks run in the gateway only: `nanobot agent` starts none, "
                "so there are none here."
            )
        case "status":
            text = await loop.status(key)
        case "voice":
            text = await _voice(message, voices)
        case "search":
            text = await _search(message, recall, loop)
        case "usage":
            text = await usage_command(message, loop)
        case "budget":
            text = await budget_command(message, loop)
        case None:  # a press of a button that is none of ours (forged, or very old)
            logger.info("{}: a press with unknown data was ignored", message.chat.channel)
            text = "This button does nothing."
        case _:
            text = HELP
    return text


async def _voice(message: InboundMessage, voices: VoiceReplies | None) -> str:
    """`/voice`: show the chat's choice of spoken replies, or change it."""
    channel = message.chat.channel
    if channel not in SPOKEN_CHANNELS or (voices is not None and not voices.offered(channel)):
        return "Spoken replies are sent on Telegram and Discord only."
    if voices is None:
        return NO_TTS
    words = message.text.split()[1:]
    word = words[0].lower() if words else None
    if word is not None and (word not in VOICE_WORDS or len(words) > 1):
        return "Say /voice on, /voice off or /voice auto (or /voice to see the setting)."
    if word is None:
        chosen, default = await voices.mode(message)
        whose = "chosen here" if chosen is not None else "the channel's default"
        return (
            f"Spoken replies here: {_VOICE_MODES[chosen or default]}, {whose}. The channel's "
            f"default is {_WORD[default]}. /voice on, /voice off or /voice auto changes it."
        )
    mode = VOICE_WORDS[word]
    await voices.choose(message, mode)
    if mode is None:
        default = voices.default(message.chat.channel)
        return f"Spoken replies here: as the channel's default, {_VOICE_MODES[default]}."
    return f"Spoken replies here: {_VOICE_MODES[mode]}."


async def _search(message: InboundMessage, recall: MemoryRecall | None, loop: AgentLoop) -> str:
    """`/search TEXT`: what `memory_search` would find for TEXT in this chat (a group sees
    only its own conversation; with people kept apart, a private chat its person's)."""
    if recall is None:
        return "Search is not offered here."
    query = message.text.split(maxsplit=1)[1] if len(message.text.split(maxsplit=1)) > 1 else ""
    if not query.strip():
        return "Say /search and the words to look for, e.g. /search deploy script."
    acting = await loop.acting_as(
        message.chat.channel, message.sender_id, message.session_key, private=message.is_private
    )
    scope = acting.scope
    if scope is None:
        scope = EVERYTHING if message.is_private else Scope(frozenset({message.session_key}))
    try:
        return await recall.search(query, scope=scope, files=acting.root)
    except ToolError as exc:
        return f"Cannot search for that: {exc}."


def _stopped(turn: bool, tasks: int) -> str:
    if not tasks:
        return "Stopped." if turn else "Nothing is running."
    what = "1 background task" if tasks == 1 else f"{tasks} background tasks"
    return f"Stopped the reply and {what}." if turn else f"Stopped {what}."
