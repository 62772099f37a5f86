"""The `people` section: whether each person has their own memory and folder."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from nanobot.config._section import Section, lowered


class PeopleConfig(Section):
    """`isolation`: `person` (each person their own USER.md, memory, folder, search and
    jobs) or `shared` (one workspace for all, as before); None (the key left out): `person`
    for a new install, `shared` for one whose store already holds conversations (see
    `nanobot.people.shared_mode`). `owner`: the platform id (`telegram:123`) the heartbeat
    runs as."""

    isolation: Literal["shared", "person"] | None = None
    owner: str | None = None

    @field_validator("isolation", mode="before")
    @classmethod
    def _word(cls, value: object) -> object:
        return lowered(value)

    @field_validator("owner")
    @classmethod
    def _owner(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        channel, colon, user = value.strip().partition(":")
        if not colon or not channel or not user or " " in value.strip():
            raise ValueError("must be a platform user id, channel:user_id (e.g. telegram:123456)")
        return value.strip()
