"""What a bot channel reads of its config section.

Channels must not import `nanobot.config`; these Protocols are the part of it they rely on,
and the config's models satisfy them as they are.
"""

from __future__ import annotations

from typing import Protocol


class Secret(Protocol):
    def get_secret_value(self) -> str: ...


class BotSettings(Protocol):
    """A bot account: its token, the platform's API server, and which group messages the
    bot answers ("open", "mention", ...)."""

    @property
    def token(self) -> Secret: ...
    @property
    def api_base(self) -> str: ...
    @property
    def group_policy(self) -> str: ...
