"""What the members of a cluster must agree on: the parts of the config that decide how a
message is answered, so that which member takes a session never changes who may talk, which
model answers, what a tool may do or what runs on schedule.

Each part is digested on its own, so that members that disagree are told in which parts
without a value being shown. A digest holds no secret and gives none away: a token enters it
as its SHA-256, and the part as a whole is keyed-hashed (HMAC-SHA-256, cut to 64 bits).
Everything else in the config may differ between members: the data dir, logging, the address
a Telegram webhook is served on, timeouts and limits, the store's URL (one database can be
reached by several names), `cluster.lease_seconds`. The workspace must be one shared place
too, but its path may differ per machine where the same storage is mounted elsewhere; it is
compared apart from these (`Member.workspace`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Final

from pydantic import SecretStr

from nanobot.config import Config, DiscordConfig, TelegramConfig

PARTS: Final = ("model", "telegram", "discord", "tools", "approvals", "schedule", "mcp", "media")
"""The parts, in the order they are named."""

_KEY: Final = b"nanobot cluster agreement 1"


def agreement(config: Config) -> dict[str, str]:
    """Each part of `PARTS` -> the digest of `config`'s settings in it.

    - model: agent.model, transport, api_base and fallbacks
    - telegram, discord: whether enabled; if so the token, allow_from, approvers,
      group_policy and api_base; Telegram's webhook url and secret_token (or polling),
      Discord's gateway_url
    - tools: tools.restrict_to_workspace and whether exec runs, in which sandbox, with which
      network and allowed hosts
    - approvals: every policy of tools.approval, its timeout and `unattended`
    - schedule: the time zone, whether cron runs, the heartbeat (on or off, its interval and
      where it delivers)
    - mcp: each server, by name: whether enabled, how it is started or reached (command,
      args, cwd, env; url, headers: values as their SHA-256), the tools offered, their
      approvals, sandbox and trust_annotations
    - media: the models that hear voice notes and speak replies (with their api_base,
      language, voice), whether documents are read, and each channel's voice_replies
    """
    agent, tools = config.agent, config.tools
    beat = config.heartbeat
    settings: dict[str, object] = {
        "model": [agent.model, agent.transport, agent.api_base, agent.fallbacks],
        "telegram": _telegram(config.channels.telegram),
        "discord": _discord(config.channels.discord),
        "tools": [
            tools.restrict_to_workspace,
            tools.exec.enabled,
            tools.exec.sandbox,
            tools.exec.network,
            tools.exec.allow_hosts,
        ],
        "approvals": [
            tools.approval.policies(),
            tools.approval.timeout.total_seconds(),
            tools.approval.unattended,
        ],
        "schedule": [
            config.timezone,
            config.cron.enabled,
            beat.enabled,
            beat.interval_minutes if beat.enabled else None,
            beat.deliver_to.model_dump() if beat.enabled and beat.deliver_to else None,
        ],
    }
    settings["mcp"] = _mcp(config)
    settings["media"] = _media(config)
    return {part: _digest(part, settings[part]) for part in PARTS}


def _mcp(config: Config) -> object:
    return [
        [
            name,
            server.enabled,
            server.command,
            server.args,
            server.cwd,
            sorted((key, _secret(value)) for key, value in server.env.items()),
            server.url,
            sorted((key.lower(), _secret(value)) for key, value in server.headers.items()),
            server.tools,
            server.approval,
            sorted(server.approval_tools.items()),
            server.sandbox,
            server.trust_annotations,
        ]
        for name, server in sorted(config.mcp.servers.items())
    ]


def _media(config: Config) -> object:
    heard, tts, channels = config.transcription, config.tts, config.channels
    return [
        [heard.model, heard.api_base, heard.language] if heard.model else None,
        [tts.model, tts.api_base, tts.voice] if tts.model else None,
        config.documents.enabled,
        channels.telegram.voice_replies,
        channels.discord.voice_replies,
    ]


def _telegram(channel: TelegramConfig) -> object:
    if not channel.enabled:
        return False
    hook = channel.webhook
    intake = [hook.url, _secret(hook.secret_token)] if hook.url else "polling"
    return [*_channel(channel), intake]


def _discord(channel: DiscordConfig) -> object:
    if not channel.enabled:
        return False
    return [*_channel(channel), channel.gateway_url]


def _channel(channel: TelegramConfig | DiscordConfig) -> list[object]:
    return [
        _secret(channel.token),
        sorted(channel.allow_from),
        sorted(channel.approvers),
        channel.group_policy,
        channel.api_base,
    ]


def _secret(value: SecretStr | None) -> str | None:
    """A secret as it enters a digest: its SHA-256, never itself."""
    if value is None:
        return None
    return hashlib.sha256(value.get_secret_value().encode()).hexdigest()


def _digest(part: str, settings: object) -> str:
    text = json.dumps([part, settings], sort_keys=True, separators=(",", ":"))
    return hmac.new(_KEY, text.encode(), hashlib.sha256).hexdigest()[:16]
