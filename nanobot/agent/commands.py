"""The chat commands (`/new`, `/stop`, `/status`, ...) and button presses: what each does,
and the answer it gets. A command is answered at once, never as a turn."""

from __future__ import annotations

from loguru import logger

from nanobot.agent.loop import AgentLoop
from nanobot.agent.subagents import Subagents
from nanobot.bus.events import InboundMessage

HELP = (
    "I'm nanobot, your assistant. Just write to me. Commands:\n"
    "/new - start a fresh conversation (the old one is kept)\n"
    "/stop - stop what I'm doing, background tasks included\n"
    "/tasks - background tasks in this chat and their state\n"
    "/status - model, tokens used, context fill and state\n"
    "/approvals - what waits for your approval, and the saved rules\n"
    "/approve ID [once|chat|always], /deny ID - decide on a request (the card's buttons do it)\n"
    "/help - this message"
)


async def answer(message: InboundMessage, loop: AgentLoop, subagents: Subagents | None) -> str:
    """Do what the command (or press) `message` says, in its session; the answer for it.

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
        case None:  # a press of a button that is none of ours (forged, or very old)
            logger.info("{}: a press with unknown data was ignored", message.chat.channel)
            text = "This button does nothing."
        case _:
            text = HELP
    return text


def _stopped(turn: bool, tasks: int) -> str:
    if not tasks:
        return "Stopped." if turn else "Nothing is running."
    what = "1 background task" if tasks == 1 else f"{tasks} background tasks"
    return f"Stopped the reply and {what}." if turn else f"Stopped {what}."
