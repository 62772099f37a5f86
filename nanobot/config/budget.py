"""The budget section: what nanobot may spend on model calls, and when it says so."""

from __future__ import annotations

from pydantic import Field, field_validator

from nanobot.config._section import Section
from nanobot.config.agent import model_advice

_USD = Field(None, ge=0)


class PersonBudget(Section):
    """What one person may spend (USD); None: no such cap."""

    daily: float | None = _USD
    monthly: float | None = _USD


class PeriodBudget(Section):
    """A daily cap (USD) of turns nobody started in a chat (cron jobs, the heartbeat)."""

    daily: float | None = _USD


class BudgetConfig(Section):
    """Caps on spend, in USD of model calls; every cap is off (None) unless set. Days and
    months are those of the top-level `timezone` (else UTC)."""

    daily: float | None = _USD  # everything the install spends in a day
    monthly: float | None = _USD
    person: PersonBudget = Field(default_factory=PersonBudget)  # each person, by default
    people: dict[str, PersonBudget] = Field(default_factory=dict)  # by platform user id
    max_cost: float | None = _USD  # one turn, all its model calls
    max_tokens: int | None = Field(None, gt=0)  # one turn, prompt and completion tokens
    cron: PeriodBudget = Field(default_factory=PeriodBudget)
    heartbeat: PeriodBudget = Field(default_factory=PeriodBudget)
    warn_at: float = Field(0.8, gt=0, le=1)  # share of a cap at which a warning is sent
    degrade_to: str | None = None  # past warn_at, calls use this (cheaper) model

    @field_validator("degrade_to")
    @classmethod
    def _model_names_its_provider(cls, model: str | None) -> str | None:
        if model is None or not model.strip():
            return None
        advice = model_advice(model)
        if advice is not None:
            raise ValueError(advice[0])
        return model

    @field_validator("people", mode="before")
    @classmethod
    def _ids_as_text(cls, value: object) -> object:
        # A Telegram id written bare in YAML is an int.
        return {str(k): v for k, v in value.items()} if isinstance(value, dict) else value

    @property
    def configured(self) -> bool:
        """Whether any cap is set (else nothing is checked before a call)."""
        people = any(p.daily is not None or p.monthly is not None for p in self.people.values())
        return people or any(
            v is not None
            for v in (
                self.daily,
                self.monthly,
                self.person.daily,
                self.person.monthly,
                self.max_cost,
                self.max_tokens,
                self.cron.daily,
                self.heartbeat.daily,
            )
        )
