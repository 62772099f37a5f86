"""The gateway process's sections: its event loop and shutdown, its log, its cluster lease."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from nanobot.config._section import Section, duration, positive


class GatewayConfig(Section):
    shutdown_timeout: float = Field(10, gt=0)
    # uvloop where it is installed (it is a dependency except on Windows): the same asyncio
    # API, with less CPU per message; "asyncio" is the standard library's own loop.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # How long an enabled channel may be down (not connected) before `status --check`
    # reports the gateway unhealthy: long enough for the platform's brief outages.
    channel_down_limit: timedelta = timedelta(minutes=5)

    @field_validator("channel_down_limit", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return duration(value)

    _positive = field_validator("channel_down_limit")(positive)


class LogConfig(Section):
    level: Literal["TRACE", "DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    json_: bool = Field(False, alias="json")

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


class ClusterConfig(Section):
    """Several gateways on one store form a cluster: one member at a time plays each role
    (a channel's polling or gateway connection, the schedule of cron and the heartbeat)."""

    # Seconds a member keeps a role without renewing it (it renews every third of that):
    # when a member dies, another takes its roles over within this.
    lease_seconds: float = Field(10, ge=1, le=300)

    @property
    def lease(self) -> timedelta:
        return timedelta(seconds=self.lease_seconds)
