"""The terminal channel: an interactive chat on stdin/stdout, a channel like the others.

Lines typed go through the gate, the journal and the bus like a chat message; replies come
back through the outbox (`/status`, `/help`, `/tasks`, `/new` and `/stop` are the chat
commands every channel has). At a terminal (stdin and stdout both one) the person types at a
prompt that stays on the last line (`_terminal_prompt`): replies, streamed as they are
written, and log lines print above it; each Enter sends what was typed, a paste included
(one message, however many lines); Ctrl-C stops the running turn (twice at the prompt quits;
only with `own_interrupts`, else it stops the gateway), and a message typed while a turn runs
steers it. Otherwise each line of stdin is a separate message answered in order before the
next is sent, and only replies are printed, so scripts get clean output. At EOF or `/exit`
the channel sets `ended`; whoever runs it stops then.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, TextIO

from loguru import logger

from nanobot.bus.events import (
    COMMANDS,
    ChatRef,
    InboundMessage,
    Outbound,
    OutboundMessage,
    StreamUpdate,
    Typing,
)
from nanobot.channels._terminal_input import Input, TooLong, open_lines
from nanobot.channels.base import Channel, Intake, IntakePort
from nanobot.channels.render import plain_text, telegram_html
from nanobot.tasks import TaskSet

if TYPE_CHECKING:
    from nanobot.channels._terminal_prompt import Prompt

NAME = "terminal"
USER = "local"  # the person at the terminal: the owner, allowed by the gate's rules
EXIT_COMMANDS = frozenset({"/exit", "/quit"})
HELP = "Type a message; /help lists the commands"
PROMPT = "you> "


class TerminalChannel(Channel):
    """The chat at this process's own terminal, talking in `session` (the chat's own
    session, `terminal:local`, when None)."""

    name = NAME

    def __init__(
        self,
        intake: IntakePort,
        *,
        session: str | None = None,
        own_interrupts: bool = True,
        out: TextIO | None = None,
    ) -> None:
        super().__init__(intake)
        self.chat = ChatRef(NAME, USER)
        self.ended = asyncio.Event()
        self._session = session
        self._own_interrupts = own_interrupts
        self._out = out or sys.stdout
        # Read once: reading stdin as a pipe hands the file to the event loop, which closes it.
        self._typed = sys.stdin.isatty()
        self._interactive = self._typed and self._out.isatty()
        self._live = self._out.isatty()
        self._screen: Prompt | None = None  # the prompt, while it is up: output goes above it
        self._turns = 0  # turns running in this chat (from the typing signals)
        self._shown: dict[str, str] = {}  # stream id -> its text printed so far
        self._line_open = False
        self._waiting: str | None = None  # piped: the message whose answer is awaited
        self._answered = asyncio.Event()
        self._interrupts = 0
        self._tasks = TaskSet("terminal")
        self._keys: dict[str, str] = {}  # the open card's answers: word or letter -> data
        self._posted = 0  # ids of what was printed, for edits to name

    async def run(self, ready: Callable[[], None]) -> None:
        """Read messages until EOF, `/exit` or a second Ctrl-C at the prompt, then set
        `ended` and wait to be cancelled."""
        source = self._open_prompt() if self._interactive else await open_lines()
        event_loop = asyncio.get_running_loop()
        interrupts = self._own_interrupts and self._interactive
        try:
            ready()
            if interrupts:  # the prompt takes Ctrl-C as a key; this is for `kill -INT`
                event_loop.add_signal_handler(signal.SIGINT, self._on_interrupt)
            if self._interactive:
                # In the gateway, this chat is one channel of several: leaving it stops them all.
                ending = (
                    "/exit quits; Ctrl-C stops the reply"
                    if interrupts
                    else "/exit or Ctrl-C stops the whole gateway, its other channels too"
                )
                self._write(f"nanobot — session {self._session_key}. {HELP}; {ending}.\n")
            await self._read_messages(source)
            self._close(source)  # the terminal is itself again while the rest stops
            self.ended.set()
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self._close(source)
            if interrupts:
                event_loop.remove_signal_handler(signal.SIGINT)
            await self._tasks.close()

    def _open_prompt(self) -> Input:
        # Imported here: prompt_toolkit is for a person at a terminal, and costs the
        # start-up time of every other command that imports this module.
        from nanobot.channels._terminal_prompt import Prompt

        on_ctrl_c = self._on_interrupt if self._own_interrupts else self._stop_gateway
        self._screen = Prompt(PROMPT, on_interrupt=on_ctrl_c)
        return self._screen

    def _close(self, source: Input) -> None:
        self._screen = None
        source.close()

    @property
    def _session_key(self) -> str:
        return self._session or self.chat.session_key

    async def _read_messages(self, source: Input) -> None:
        while not self.ended.is_set():
            try:
                text = await _next_message(source, self.ended)
            except TooLong as refused:
                self._notice(f"(Not sent: {refused}.)\n")
                continue
            if text is None or text.strip() in EXIT_COMMANDS:
                return
            self._interrupts = 0
            answer = self._keys.get(text.strip().lower())
            if answer is not None:
                self._keys.clear()
                await self._send(answer, press=True)
            elif _unknown_command(text):
                self._write(f"Unknown command {text.split()[0]}: /help lists the commands.\n")
            elif text.strip():
                await self._send(text)

    async def _send(self, text: str, *, press: bool = False) -> None:
        message_id = uuid.uuid4().hex
        message = (
            InboundMessage.from_press(
                self.chat,
                USER,
                text,
                message_id,
                message_id=message_id,
                sender_name=USER,
                session=self._session,
            )
            if press
            else InboundMessage.from_chat(
                self.chat, USER, text, message_id, sender_name=USER, session=self._session
            )
        )
        if not self._interactive:  # piped: answered in order, one after another
            self._waiting = message.message_id
            self._answered.clear()
        taken = await self.intake(message)
        if taken is Intake.ACCEPTED and not self._interactive:
            await self._answered.wait()
        self._waiting = None

    async def deliver(self, item: Outbound) -> str | None:
        match item:
            case StreamUpdate() if self._live:
                shown = self._shown.get(item.stream_id, "")
                if item.text.startswith(shown) and len(item.text) > len(shown):
                    self._write(item.text[len(shown) :])
                    self._shown[item.stream_id] = item.text
                    self._line_open = True
            case OutboundMessage():
                self._print(item)
                self._posted += 1
                return str(self._posted)
            case Typing():  # a turn started or ended here
                self._turns = max(0, self._turns + (1 if item.active else -1))
                if not item.active and not self._turns and self._waiting is not None:
                    self._answered.set()
        return None

    def _print(self, message: OutboundMessage) -> None:
        if message.buttons:  # a card: each answer by its word, or the word's first letter
            words = {_answer_word(b.data): b.data for b in message.buttons}
            self._keys = {**words, **{word[0]: data for word, data in words.items()}}
            choices = " ".join(f"[{word[0]}]{word[1:]}" for word in words)
            # Cards are written in Markdown for the chat platforms: shown here as plain text.
            text = plain_text(telegram_html(message.text))
            message = replace(message, text=f"{text}\nAnswer: {choices}")
            self._answered.set()  # piped: the answer is the next line
        elif message.replaces is not None:
            self._keys.clear()  # decided (or expired): no answer is taken any more
            message = replace(message, text=plain_text(telegram_html(message.text)))
        shown = self._shown.pop(message.stream_id, None) if message.stream_id else None
        if shown is not None and message.text.startswith(shown):
            self._write(message.text[len(shown) :] + "\n")
        else:
            self._end_line()
            self._write(message.text + "\n")
        self._line_open = False
        if message.kind == "progress":
            return
        if self._waiting is not None and message.reply_to == self._waiting:
            self._answered.set()

    def _on_interrupt(self) -> None:
        if self._turns:
            self._tasks.spawn(self._send("/stop"), name="terminal-stop")
            return
        self._interrupts += 1
        if self._interrupts >= 2:
            self.ended.set()
        else:
            self._end_line()
            self._write("(Ctrl-C again or /exit to quit)\n")

    def _stop_gateway(self) -> None:
        """Ctrl-C at the prompt in the gateway: what it is without a prompt, SIGINT to the
        gateway. The prompt ends too, so that the terminal sends a second Ctrl-C itself
        (which exits at once) while the gateway stops."""
        signal.raise_signal(signal.SIGINT)
        if self._screen is not None:
            self._screen.end()

    def _notice(self, text: str) -> None:
        """`text` for the person typing: on the terminal they type at, also when the replies
        go elsewhere (stdout redirected to a file)."""
        if self._screen is None and not self._live and self._typed:
            with contextlib.suppress(OSError):
                sys.stderr.write(text)
                sys.stderr.flush()
            return
        self._write(text)

    def _end_line(self) -> None:
        if self._line_open:
            self._write("\n")
            self._line_open = False

    def _write(self, text: str) -> None:
        if self._screen is not None:
            self._screen.write(text)
            return
        try:
            self._out.write(text)
            self._out.flush()
        except OSError as exc:  # the terminal went away; nothing to show it on
            logger.debug("terminal output failed: {}", exc)


def _answer_word(data: str) -> str:
    """The word a card's button stands for: `once`, `chat`, `always` (from `/approve ID
    SCOPE …`) or `deny`."""
    words = data.split()
    return words[2] if words[0] == "/approve" and len(words) > 2 else words[0].lstrip("/")


async def _next_message(source: Input, ended: asyncio.Event) -> str | None:
    """The next message, or None at EOF or once `ended` is set (the read is cancelled and
    awaited: a prompt has given the terminal back when this returns).

    Raises:
        TooLong: the message was refused whole, not cut (too long, or cut by the terminal).
    """
    message = asyncio.ensure_future(source.next())
    stop = asyncio.ensure_future(ended.wait())
    try:
        await asyncio.wait({message, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not message.done():
            message.cancel()
        await asyncio.wait({message, stop})
    if message.cancelled():
        return None
    return message.result()


def _unknown_command(text: str) -> bool:
    """Whether `text` is a /word that names no command (answered here: a model call for a
    typo would cost money and say nothing useful). A path such as /etc/hosts is text."""
    word = text.strip().split(maxsplit=1)[0] if text.strip() else ""
    name = word[1:].lower()
    return word.startswith("/") and name.isidentifier() and name not in COMMANDS
