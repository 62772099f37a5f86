"""discord.py's client as the Discord channel uses it: our event handlers (a session's start,
its loss and resumption, messages and button presses), the intents we ask for, and the
servers it talks to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import discord
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from nanobot.channels import _discord_inbound as inbound
from nanobot.channels._discord_catch_up import CatchUp


class Client(discord.Client):
    """discord.py's client with our event handlers: the session's start (READY), its loss
    and resumption (for the catch-up), messages and button presses."""

    def __init__(
        self,
        *,
        ready: Callable[[discord.Client], None],
        catch_up: CatchUp,
        message: Callable[[discord.Message], None],
        press: Callable[[discord.Interaction], None],
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self._when_ready, self._when_message = ready, message  # Client has a `_ready`
        self._when_pressed, self._catch_up = press, catch_up

    async def on_ready(self) -> None:
        self._when_ready(self)

    async def on_disconnect(self) -> None:
        self._catch_up.dropped()

    async def on_resumed(self) -> None:
        self._catch_up.resumed()

    async def on_message(self, message: discord.Message) -> None:
        if inbound.is_conversation(message):  # not our own echoes, nor other bots
            self._when_message(message)

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        self._when_pressed(interaction)


def intents() -> discord.Intents:
    """What the gateway sends us: messages with their content, not other people's typing."""
    wanted = discord.Intents.default()  # guilds, guild messages and DMs among them
    wanted.message_content = True  # privileged: enabled in the Developer Portal
    wanted.typing = False  # other people's typing is of no use here
    return wanted


def point_at(api_base: str, gateway_url: str) -> Callable[[], None]:
    """Send discord.py to these servers (process-wide: discord.py has no option for them);
    returns what puts the defaults back."""
    saved_base, saved_gateway = Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    base, gateway = api_base.rstrip("/"), yarl.URL(gateway_url)
    if base != saved_base.rstrip("/"):
        Route.BASE = base
    if gateway != saved_gateway:
        DiscordWebSocket.DEFAULT_GATEWAY = gateway

    def restore() -> None:
        Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = saved_base, saved_gateway

    return restore
