"""The sections of what starts turns on its own: cron jobs and the heartbeat."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator

from nanobot.config._section import Section, duration


class CronConfig(Section):
    enabled: bool = True
    catch_up_window: timedelta = timedelta(hours=1)

    @field_validator("catch_up_window", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        # The syntax of `nanobot cron add --every` (nanobot.durations).
        return duration(value)


class ChatTarget(Section):
    """A chat to send to: the channel and its chat id (a Discord channel id, a Telegram chat id)."""

    channel: Literal["telegram", "discord"]
    chat_id: str

    @field_validator("chat_id", mode="before")
    @classmethod
    def _id_as_string(cls, value: object) -> object:
        return str(value) if isinstance(value, int) else value


class HeartbeatConfig(Section):
    enabled: bool = False
    interval_minutes: float = Field(30, gt=0)
    deliver_to: ChatTarget | None = None
