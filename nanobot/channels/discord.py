"""The Discord channel: discord.py's gateway in, Markdown split to 2000 characters out.

In: discord.py keeps the gateway connection (heartbeats, and RESUME after a dropped
connection, on which Discord replays every event that was missed). Each message discord.py
dispatches goes straight into its chat's lane (`nanobot.lanes.Lanes`: nothing awaited first,
so nothing is dropped or reordered) and is taken from there: files fetched within the inbox's
limit (only if `intake` admits the sender), then `intake`, which journals it. Discord has no
acknowledgement and never delivers a message again: one that arrives while the gateway stops
is still journaled (and answered after the restart); only a stranger's, which would need a
pairing code (intake says CLOSED), is dropped with a warning. While a store failure pauses
intake, messages and presses wait (`_pause.Pause`; a chat's later messages behind them) and
are handed over once intake takes them again; the files of a message intake does not take
are deleted. What was sent while nanobot
was away (stopped, or between two gateway sessions) is fetched from the chats' history at
the start of each session and taken in each chat's lane like any other message; see
`_discord_catch_up` for which chats and how far back. Message ids are Discord's snowflakes,
unique across the platform and growing with time.

Chats: a DM, a guild channel or a thread, each by its channel id. A thread has its own id, so
it is its own session (see `_discord_inbound`).

Button presses (component interactions) are acknowledged the moment they arrive (Discord
wants that within 3 s, whatever else is going on), then handed to `intake` like a message
(`InboundMessage.press`); one the gate does not take is told so, to the presser only. Any
press on any message is taken, whether or not this process posted it: the buttons work
after a restart. Other interactions (slash commands) are not ours and are left alone.

Out: Discord renders Markdown itself, so replies are only split (`split_discord`, code fences
closed and reopened). A streamed reply is posted early and edited at most once per
`stream_interval`; the final message edits it to exactly its first part. A card (a message
with buttons) and an edit of an earlier message go out the same way (`Replies`, with the
sender as its `CardOutlet`) and return the id of the message that shows the buttons; an
`answer` to a press is an ephemeral follow-up. A chat `@<user id>` is the DM with that user.
A spoken reply is an audio attachment (OGG/Opus, which Discord plays in the chat) on a
message that holds its text where the text is one message, else before the text's messages.

Two clients: replies go out through one that only logs in (the REST API), and the gateway
connection is another's, held only while this process holds the channel's intake `role`:
in a cluster every member delivers, and one at a time takes messages in.

Servers: discord.py has no option for them. An `api_base` or `gateway_url` other than
Discord's is set on the process-wide `Route.BASE` / `DiscordWebSocket.DEFAULT_GATEWAY` while
`run()` runs, and put back when it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Protocol

import aiohttp
import discord
from loguru import logger

from nanobot.bus.events import (
    ChatRef,
    InboundMessage,
    Outbound,
    OutboundMessage,
    StreamUpdate,
    Typing,
)
from nanobot.channels import _discord_inbound as inbound
from nanobot.channels._discord_catch_up import CatchUp
from nanobot.channels._discord_client import Client, intents, point_at
from nanobot.channels._discord_send import QUIET, Sender
from nanobot.channels._pause import Pause
from nanobot.channels._replies import Replies
from nanobot.channels._settings import BotSettings
from nanobot.channels._typing import DELAY as TYPING_DELAY
from nanobot.channels._typing import TypingIndicator
from nanobot.channels.base import (
    SOLO,
    Channel,
    ChannelRefused,
    ChannelUnreachable,
    DeliveryError,
    InboxPolicy,
    Intake,
    IntakeHistory,
    IntakePort,
    OutboxPort,
    Role,
    Undeliverable,
    discard_files,
    read_outgoing,
)
from nanobot.channels.render import split_discord
from nanobot.lanes import Lanes
from nanobot.tasks import TaskSet

STREAM_INTERVAL = 1.0  # seconds between two edits of a streamed reply
TAKE_GRACE = 5.0  # seconds messages already received may still be taken when stopping
TYPING_INTERVAL = 8.0  # Discord shows "typing…" for about 10 s
GUILD_READY_TIMEOUT = 2.0  # discord.py waits this long after the last GUILD_CREATE
MAX_RATE_LIMIT_WAIT = 60.0  # a longer 429 wait fails the delivery (the manager retries later)
AUTHENTICATION_FAILED = 4004  # the gateway's close code for a token it does not take
_REJECTED = (
    "channels.discord.token was rejected by Discord ({}): reset it under Bot → Token in the "
    "Discord Developer Portal and set the new one"
)

# What the presser is told when the gate does not take a press.
NOT_APPROVER = "Only an approver can decide this."
NOT_ALLOWED = "You are not allowed to use this bot yet."
_REFUSED_PRESS = {
    Intake.REFUSED: NOT_APPROVER,
    Intake.CLOSED: NOT_APPROVER,
    Intake.PAIRING: NOT_ALLOWED,
}


class DiscordSettings(BotSettings, Protocol):
    """The `channels.discord` config section, as far as this channel reads it."""

    @property
    def gateway_url(self) -> str: ...
    @property
    def allow_from(self) -> Sequence[str]: ...


class _Voices:
    """The Sender as `Replies` sends spoken replies with it (a `VoiceOutlet`): the audio,
    read from the workspace (confined to it), as an attachment."""

    def __init__(self, sender: Sender, inbox: InboxPolicy) -> None:
        self._sender = sender
        self._inbox = inbox

    def caption_fits(self, part: str) -> bool:
        return True  # a part is at most a message's 2000 characters, as is a caption

    async def send_voice(
        self, chat: ChatRef, audio: Path, *, caption: str | None, reply_to: str | None
    ) -> int:
        try:
            data = await read_outgoing(self._inbox, audio)
        except OSError as exc:
            raise Undeliverable(f"the voice note {audio} cannot be read: {exc}") from exc
        return await self._sender.send_file(
            chat, data, f"reply{audio.suffix}", text=caption, reply_to=reply_to
        )


class DiscordChannel(Channel):
    """Discord via a bot account. See the module docstring."""

    name = "discord"

    def __init__(
        self,
        config: DiscordSettings,
        intake: IntakePort,
        inbox: InboxPolicy,
        *,
        stream_interval: float = STREAM_INTERVAL,
        typing_interval: float = TYPING_INTERVAL,
        typing_delay: float = TYPING_DELAY,
        outbox: OutboxPort | None = None,
        guild_ready_timeout: float = GUILD_READY_TIMEOUT,
        role: Role = SOLO,
    ) -> None:
        """`role`: whether this process holds the gateway connection (in a cluster, one
        member at a time does; every member delivers)."""
        super().__init__(intake)
        self._config = config
        self._role = role
        self._inbox = inbox
        self._guild_ready_timeout = guild_ready_timeout
        self._sender = Sender()
        self._presses = inbound.Presses()
        self._pause = Pause(self.name)
        self._cut_off = 0  # takes cancelled mid-message (stopping), this connection
        self._replies = Replies(
            self._sender,
            split_discord,
            interval=stream_interval,
            name=self.name,
            outbox=outbox,
            cards=self._sender,
            voices=_Voices(self._sender, inbox),
        )
        self._typing = TypingIndicator(
            self._sender.typing, typing_interval, delay=typing_delay, name=self.name
        )

    # ---- running --------------------------------------------------------------------

    async def run(self, ready: Callable[[], None]) -> None:
        """Log in, then hold the gateway connection whenever this process holds the intake
        role. Replies go out through a client of their own, logged in and never connected to
        the gateway, so that every member of a cluster delivers. `ready()` is called once
        the first gateway session began, or, in a cluster, once another member is found
        holding the connection."""
        token = self._config.token.get_secret_value()
        if not token:
            raise ChannelRefused("channels.discord.token is empty: set the bot's token")
        await self._replies.recover()  # before `ready()`: nothing is delivered before that
        announced = False

        def deliverable() -> None:
            nonlocal announced
            if not announced:
                announced = True
                ready()

        restore = point_at(self._config.api_base, self._config.gateway_url)
        rest = discord.Client(
            intents=discord.Intents.none(),
            allowed_mentions=QUIET,
            max_ratelimit_timeout=MAX_RATE_LIMIT_WAIT,
        )
        try:
            try:
                await rest.login(token)
            except discord.LoginFailure:  # 401 on logging in
                raise ChannelRefused(_REJECTED.format("401 Unauthorized")) from None
            except (aiohttp.ClientError, discord.DiscordServerError) as exc:
                raise ChannelUnreachable(
                    f"Discord's API at {self._config.api_base} did not answer: {exc}"
                ) from exc
            self._sender.client = rest
            self._typing.start()
            await self._role.hold(partial(self._connect, token, deliverable), standby=deliverable)
        finally:
            self._sender.client = None
            await self._typing.stop()
            await rest.close()
            restore()

    async def _connect(self, token: str, ready: Callable[[], None]) -> None:
        """Hold one gateway connection (with its RESUMEs and new sessions) and take what
        it brings, until cancelled."""
        self._cut_off = 0
        intake = self.intake
        catch_up = CatchUp(
            intake if isinstance(intake, IntakeHistory) else None,
            allow_from=self._config.allow_from,
            guilds=self._config.group_policy != "disabled",
            take=self._take,
        )
        await catch_up.load()  # before connecting: what came after is fetched
        lanes: Lanes[int] = Lanes(name="discord-inbound")

        sessions = 0

        def connected(client: discord.Client) -> None:
            nonlocal sessions
            sessions += 1
            if sessions == 1:
                logger.info("discord connected as {}", client.user)
            # Also after a new IDENTIFY (not a RESUME): events in between are not replayed.
            catch_up.ready(client, lanes)
            if sessions == 1:
                ready()

        def arrived(message: discord.Message) -> None:
            if lanes.closed:
                logger.warning(
                    "discord: a message arrived as the channel stopped; fetched at the next start"
                )
            else:
                lanes.add(message.channel.id, self._take(client, message))

        pressing = TaskSet("discord-presses")

        def pressed(interaction: discord.Interaction) -> None:
            message = inbound.press_of(interaction)
            if message is None:  # not a button press (a slash command): not ours
                return
            if lanes.closed:  # stopping: the presser sees "interaction failed", may press again
                logger.warning("discord: a button press arrived as the channel stopped; ignored")
            else:
                pressing.spawn(
                    self._press(interaction, message), name=f"discord-press-{message.press}"
                )

        client = Client(
            ready=connected,
            catch_up=catch_up,
            message=arrived,
            press=pressed,
            intents=intents(),
            allowed_mentions=QUIET,
            guild_ready_timeout=self._guild_ready_timeout,
            max_ratelimit_timeout=MAX_RATE_LIMIT_WAIT,
        )
        try:
            await client.start(token)
        except discord.LoginFailure:  # 401 on logging in
            raise ChannelRefused(_REJECTED.format("401 Unauthorized")) from None
        except (aiohttp.ClientError, discord.DiscordServerError, discord.GatewayNotFound) as exc:
            raise ChannelUnreachable(f"Discord's gateway did not answer: {exc}") from exc
        except discord.ConnectionClosed as exc:
            if exc.code == AUTHENTICATION_FAILED:  # the token was reset while connected
                raise ChannelRefused(_REJECTED.format("gateway closed with 4004")) from None
            raise
        except discord.PrivilegedIntentsRequired as exc:
            raise ChannelRefused(
                "Discord refused the Message Content intent: enable it for the bot under "
                "Bot → Privileged Gateway Intents in the Discord Developer Portal"
            ) from exc
        finally:
            await self._stop(client, catch_up, lanes, pressing)

    async def _stop(
        self, client: discord.Client, catch_up: CatchUp, lanes: Lanes[int], pressing: TaskSet
    ) -> None:
        """Stop taking messages and presses (within TAKE_GRACE), record how far messages
        were taken, then disconnect."""
        stopping = datetime.now(UTC)  # what is sent from now on is fetched next time
        _, lost, _ = await asyncio.gather(
            catch_up.close(), self._close_lanes(lanes), pressing.close(grace=TAKE_GRACE)
        )
        # A take cut off mid-message (waiting out a paused intake, say) is lost as well.
        await catch_up.stopped(stopping, lost=lost + self._cut_off)
        await client.close()
        self._presses.forget()

    @staticmethod
    async def _close_lanes(lanes: Lanes[int]) -> int:
        """Give the lanes up to TAKE_GRACE to take what they hold (Discord never delivers a
        message again), then cancel them (a take is cancelled mid-message); the messages
        still waiting then are logged (the next start fetches them from the history) and
        counted."""
        lost = await lanes.close(grace=TAKE_GRACE)
        if lost:
            logger.warning(
                "discord: {} message(s) were still waiting to be taken when the channel "
                "stopped; they are fetched at the next start",
                lost,
            )
        return lost

    async def _take(self, client: discord.Client, message: discord.Message) -> bool:
        """Hand one message to intake, waiting while it is paused; whether intake decided on
        it (took or refused it), rather than it being lost to an error. Runs in its chat's
        lane: never raises."""
        taken = False
        received = inbound.Received(None)
        try:
            received = await inbound.read(message, client, self._inbox, self.intake)
            outcome = Intake.REFUSED
            if received.message is not None:
                outcome = await self._pause.hand_over(partial(self.intake, received.message))
            taken = True
            await self._settle(message, received, outcome)
        except asyncio.CancelledError:
            if not taken:
                self._cut_off += 1
                logger.warning(
                    "discord: stopped while taking message {}; it is fetched at the next start",
                    message.id,
                )
            raise
        except Exception:  # noqa: BLE001 - a lane must survive one bad message
            logger.exception("discord: message {} could not be taken; it is lost", message.id)
        finally:
            if not taken:
                discard_files(a.path for a in received.saved)
        return taken

    async def _press(self, interaction: discord.Interaction, message: InboundMessage) -> None:
        """Acknowledge a press first (the 3 s rule), then hand it to intake, which journals
        it; a press the gate does not take is told why, to the presser only."""
        await self._presses.acknowledge(interaction)
        outcome = await self._pause.hand_over(partial(self.intake, message))
        refusal = _REFUSED_PRESS.get(outcome)
        if refusal is not None:
            await self._presses.answer(str(interaction.id), refusal)

    async def _settle(
        self, message: discord.Message, received: inbound.Received, outcome: Intake
    ) -> None:
        """Drop the files of a message not taken; tell the sender about refused files: once
        the gate let the message in, or when a refused file was all it had for us."""
        if outcome is Intake.CLOSED:
            logger.warning(
                "discord: message {} from a user without access arrived while stopping; "
                "no pairing code is sent now (Discord does not deliver it again)",
                message.id,
            )
        accepted = outcome is Intake.ACCEPTED
        if not accepted and received.saved:
            await asyncio.to_thread(discard_files, [a.path for a in received.saved])
        told = accepted or (received.message is None and received.addressed)
        if received.refusals and told:
            chat, text = inbound.chat_ref(message), "\n".join(received.refusals)
            try:
                await self._sender.send(chat, text, reply_to=str(message.id))
            except DeliveryError as exc:
                logger.warning(
                    "discord: could not tell chat {} about a file: {}", chat.chat_id, exc
                )

    # ---- delivering -------------------------------------------------------------------

    async def deliver(self, item: Outbound) -> str | None:
        match item:
            case Typing():
                await self._typing.update(item)
            case StreamUpdate():
                await self._replies.stream(item)
            case OutboundMessage(kind="answer"):
                if item.reply_to is not None:
                    await self._presses.answer(item.reply_to, item.text)
            case OutboundMessage() if (
                item.kind == "card" or item.buttons or item.edits is not None or item.replaces
            ):
                return await self._replies.send(item)
            case OutboundMessage():
                await self._replies.send(item)
        return None
