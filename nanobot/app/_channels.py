"""The chat channels from the config: what they need to start, who may talk on each, and
the channels themselves (their libraries imported only when enabled). Part of the
composition root (`nanobot.app`).
"""

from __future__ import annotations

from nanobot.channels.base import SOLO, Channel, InboxPolicy, IntakePort, OutboxPort
from nanobot.cluster import Cluster
from nanobot.cluster import intake as intake_role
from nanobot.config import Config
from nanobot.errors import ConfigError
from nanobot.gate import ChannelRules
from nanobot.people import People


def check_channels(config: Config, *, terminal: bool) -> None:
    """What the gateway's chat channels need to start: a token for each enabled one, a
    `tts.model` for spoken replies, and at least one enabled when no terminal is attached
    (nobody could talk to nanobot).

    Raises:
        ConfigError: the reason, and how to fix it.
    """
    file = f"{config.source}: " if config.source is not None else ""
    for name, where in (("telegram", "from @BotFather"), ("discord", "from the developer portal")):
        section = getattr(config.channels, name)
        if section.enabled and not section.token.get_secret_value().strip():
            raise ConfigError(
                f"{file}channels.{name} is enabled but its token is empty: set "
                f"channels.{name}.token (the bot's token, {where}) or "
                f"NANOBOT_CHANNELS__{name.upper()}__TOKEN, or set enabled: false"
            )
    for name in ("telegram", "discord"):
        mode = getattr(config.channels, name).voice_replies
        if mode != "off" and config.tts.model is None:
            raise ConfigError(
                f"{file}channels.{name}.voice_replies is {mode}, but no tts.model is set to "
                "speak with: set tts.model (e.g. openai/tts-1), or voice_replies: off"
            )
    if not terminal and not channel_rules(config):
        raise ConfigError(
            f"{file}no chat channel is enabled and no terminal is attached, so nobody could "
            "talk to nanobot: enable one, e.g. channels: {telegram: {enabled: true, token: "
            '"<from @BotFather>", allow_from: [<your user id>]}} (see config.example.yaml), '
            "or run `nanobot agent` to chat in this terminal"
        )


def channel_rules(config: Config) -> dict[str, ChannelRules]:
    rules = {}
    for name in ("telegram", "discord"):
        section = getattr(config.channels, name)
        if section.enabled:
            rules[name] = ChannelRules(frozenset(section.allow_from), section.group_policy)
    return rules


def build_channels(
    config: Config,
    intake: IntakePort,
    outbox: OutboxPort | None = None,
    *,
    cluster: Cluster | None = None,
    people: People | None = None,
) -> list[Channel]:
    """The enabled chat channels (their libraries are imported only when enabled), taking
    messages in through `intake` and keeping `outbox` told where each reply stands; with
    `cluster`, a channel's polling or gateway connection runs while this member holds its
    intake role (always, without). With `people` kept apart, each sender's files go to
    their own folder's inbox."""
    channels: list[Channel] = []
    workspace = config.workspace_path
    inbox = workspace / "inbox"
    telegram = config.channels.telegram
    if telegram.enabled:
        from nanobot.channels.telegram import TelegramChannel

        policy = InboxPolicy(inbox, int(telegram.max_file_mb * 1024 * 1024), workspace, people)
        role = cluster.role(intake_role("telegram")) if cluster is not None else SOLO
        channels.append(TelegramChannel(telegram, intake, policy, outbox=outbox, role=role))
    discord = config.channels.discord
    if discord.enabled:
        from nanobot.channels.discord import DiscordChannel

        policy = InboxPolicy(inbox, int(discord.max_file_mb * 1024 * 1024), workspace, people)
        role = cluster.role(intake_role("discord")) if cluster is not None else SOLO
        channels.append(DiscordChannel(discord, intake, policy, outbox=outbox, role=role))
    return channels
