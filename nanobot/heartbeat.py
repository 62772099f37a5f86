"""The heartbeat: every so often, read HEARTBEAT.md and act on what it asks.

A file with nothing actionable in it (headings, comments, blank lines, empty checkboxes)
costs nothing: no model call is made. Otherwise the beat is handed to the gate as an inbound
event: one turn in the `heartbeat` session, which starts afresh each time (system prompt and
the file, no growing history), journaled like a chat message. A reply of HEARTBEAT_OK means
"nothing to report" and is delivered nowhere; anything else goes to the configured chat, and
nowhere if none is configured (never to a guessed chat). A beat that finds intake paused (the
state database failing) waits for it, as a cron run does.

A HEARTBEAT.md that the taint ledger marks (a turn that had read content from outside wrote
it) is handed over as data inside the untrusted-content markers, never as tasks to do; the
loop counts the beat's turn as having read it (its calls that would ask, ask).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

from loguru import logger

from nanobot.agent.taint import Ledger, as_data
from nanobot.bus.events import ChatRef, InboundMessage, TurnOutcome
from nanobot.bus.intake import EventIntake, once_taken
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


def actionable(text: str) -> bool:
    """Whether the file asks for anything: some line that is not a heading, a comment,
    blank, or an empty list item or checkbox."""
    return any(
        line.strip() and not _IDLE_LINE.match(line) for line in _COMMENTS.sub("", text).splitlines()
    )


class Heartbeat:
    """Runs `beat()` every `interval` seconds until cancelled; its answers go to `deliver_to`
    (nowhere when None)."""

    def __init__(
        self,
        file: Path,
        interval: float,
        intake: EventIntake,
        deliver_to: ChatRef | None,
        *,
        ledger: Ledger | None = None,
    ) -> None:
        self._file = file
        self._ledger = ledger
        self._folder = Workspace(file.parent)  # the workspace: the file is read confined to it
        self._interval = interval
        self._intake = intake
        self._deliver_to = deliver_to

    async def run(self) -> None:
        """Beat every `interval` seconds until cancelled. A beat that finds intake paused by
        a store failure is made again when intake says, not skipped."""
        while True:
            await asyncio.sleep(self._interval)
            try:
                await once_taken(self.beat, "heartbeat")
            except Exception:  # noqa: BLE001 - a task boundary: the next beat tries again
                logger.exception("heartbeat failed")

    async def beat(self) -> int | None:
        """One check; the journal row of the turn it started (None when nothing was due).

        Raises:
            IntakePaused: the beat could not be journaled.
        """
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
        tasks = text.strip()
        if self._ledger is not None:
            marked = await self._ledger.file_taint(self._file)
            if marked is not None:
                tasks = as_data(self._file.name, tasks, {self._file.name: marked})
        return await self._intake.submit(self.event(PROMPT.format(tasks=tasks)))

    def event(self, prompt: str) -> InboundMessage:
        """The inbound event of one beat asking `prompt`."""
        return InboundMessage.from_heartbeat(
            prompt, uuid.uuid4().hex, session=SESSION, quiet=OK, deliver_to=self._deliver_to
        )

    async def finished(self, message: InboundMessage, outcome: TurnOutcome) -> None:
        """Log how a beat ended (`OutcomeSink`)."""
        if not outcome.ok:
            logger.warning("heartbeat turn ended {}: {}", outcome.status, outcome.text or "")
        elif outcome.text is None:
            pass  # nothing to report (logged by the dispatcher), or sent by the message tool
        elif self._deliver_to is None:
            logger.info("heartbeat replied, but heartbeat.deliver_to is not set; not sent")
