"""The heartbeat: every so often, read HEARTBEAT.md and act on what it asks.

A file with nothing actionable in it (headings, comments, blank lines, empty checkboxes)
costs nothing: no model call is made. Otherwise one turn runs in the `heartbeat` session,
which starts afresh each time (system prompt and the file, no growing history). A reply of
HEARTBEAT_OK means "nothing to report" and is delivered nowhere; anything else goes to the
configured chat, and nowhere if none is configured (never to a guessed chat).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

from loguru import logger

from nanobot.agent.loop import AgentLoop, TurnRequest
from nanobot.workspace import ConfinementError, Workspace

OK = "HEARTBEAT_OK"
SESSION = "heartbeat"
PROMPT = (
    "This is a scheduled heartbeat check. Read the task list below (from HEARTBEAT.md in "
    "your workspace) and do what is due now. If there is nothing to do or report, reply "
    f"with exactly {OK}. Otherwise reply with what the user should know.\n\n"
    "--- HEARTBEAT.md ---\n{tasks}"
)

_COMMENTS = re.compile(r"<!--.*?-->", re.DOTALL)
_IDLE_LINE = re.compile(r"^\s*(#.*|[-*+]\s*\[\s?\]\s*|[-*+]\s*)$")

RunTurn = Callable[[str], Awaitable[str | None]]
Deliver = Callable[[str], Awaitable[None]]


def actionable(text: str) -> bool:
    """Whether the file asks for anything: some line that is not a heading, a comment,
    blank, or an empty list item or checkbox."""
    return any(
        line.strip() and not _IDLE_LINE.match(line) for line in _COMMENTS.sub("", text).splitlines()
    )


class Heartbeat:
    """Runs `beat()` every `interval` seconds until cancelled."""

    def __init__(
        self,
        file: Path,
        interval: float,
        run_turn: RunTurn,
        deliver: Deliver | None,
    ) -> None:
        self._file = file
        self._folder = Workspace(file.parent)  # the workspace: the file is read confined to it
        self._interval = interval
        self._run_turn = run_turn
        self._deliver = deliver

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.beat()
            except Exception:  # noqa: BLE001 - a task boundary: the next beat tries again
                logger.exception("heartbeat failed")

    async def beat(self) -> str | None:
        """One check; returns what was delivered (None when nothing was)."""
        try:
            data = await asyncio.to_thread(self._folder.read_bytes, self._file.name)
        except FileNotFoundError:
            return None
        except ConfinementError as exc:  # e.g. a symlink to a file outside the workspace
            logger.warning("heartbeat: ignoring {}: it {}", self._file, exc.reason)
            return None
        text = data.decode("utf-8", errors="replace")
        if not actionable(text):
            logger.debug("heartbeat: nothing to do")
            return None
        reply = (await self._run_turn(PROMPT.format(tasks=text.strip())) or "").strip()
        if not reply or reply == OK or reply.rstrip(".") == OK:
            logger.info("heartbeat: nothing to report")
            return None
        if self._deliver is None:
            logger.info("heartbeat replied, but heartbeat.deliver_to is not set; not sent")
            return None
        await self._deliver(reply)
        return reply


async def heartbeat_turn(loop: AgentLoop, prompt: str) -> str | None:
    """Run one heartbeat turn in a fresh `heartbeat` session; its reply text, if it finished."""
    await loop.new_session(SESSION)
    reply = await loop.handle(TurnRequest(SESSION, prompt, channel=SESSION, chat_id=SESSION))
    if reply is None or reply.result.status != "completed":
        return None
    return reply.text
