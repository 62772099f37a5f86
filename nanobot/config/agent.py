"""The agent's section: the model, its transport, and the limits of a turn and of subagents."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator

from nanobot.config._section import Section


class ModelPrice(Section):
    """What a model costs, in USD per million tokens (`agent.prices`)."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached: float | None = Field(None, ge=0)


class AgentConfig(Section):
    model: str = "openai/gpt-4o-mini"
    api_key: SecretStr | None = None
    api_base: str | None = None
    transport: Literal["auto", "litellm", "direct"] = "auto"
    fallbacks: list[str] = Field(default_factory=list)
    max_tokens: int = Field(4096, gt=0)
    temperature: float = Field(0.3, ge=0, le=2)
    max_iterations: int = Field(20, gt=0)
    max_concurrent_turns: int = Field(1000, gt=0)
    context_window: int | None = Field(None, gt=0)
    request_timeout: float = Field(120, gt=0)
    max_retries: int = Field(3, ge=0, le=10)
    retry_max_seconds: float = Field(60, gt=0)
    max_tool_rounds: int = Field(20, gt=0)
    max_tool_calls: int = Field(50, gt=0)
    max_parallel_tools: int = Field(1, gt=0)
    max_turn_seconds: float = Field(600, gt=0)
    queue_mode: Literal["steer", "follow_up"] = "steer"
    max_subagents: int = Field(4, ge=0)
    subagent_max_iterations: int = Field(15, gt=0)
    subagent_max_seconds: float = Field(300, gt=0)
    subagent_exec: bool = False  # background tasks may use exec (when tools.exec.enabled)
    steering_delivery: Literal["one", "all"] = "one"
    follow_up_delivery: Literal["one", "all"] = "one"
    # Characters of each prompt file or memory file in the system prompt, and of all together.
    prompt_file_chars: int = Field(20_000, ge=1000)
    prompt_total_chars: int = Field(60_000, ge=1000)
    # Per model, USD per million tokens, where neither the provider nor litellm's list
    # says what a call costs.
    prices: dict[str, ModelPrice] = Field(default_factory=dict)

    @field_validator("model")
    @classmethod
    def _model_names_its_provider(cls, model: str) -> str:
        return _model_id(model)

    @field_validator("api_base")
    @classmethod
    def _base_is_a_url(cls, url: str | None) -> str | None:
        # Without a scheme the first message failed after seconds of retries, "unavailable".
        if url is None or not url.strip():
            return None  # unset, as an empty variable in the environment says
        advice = base_advice(url)
        if advice is not None:
            raise ValueError(advice[0])
        return url

    @field_validator("fallbacks")
    @classmethod
    def _fallbacks_name_their_providers(cls, models: list[str]) -> list[str]:
        return [_model_id(model) for model in models]

    @model_validator(mode="after")
    def _direct_needs_a_base(self) -> Self:
        if self.transport == "direct" and not self.api_base:
            raise ValueError(
                "agent.transport: direct needs agent.api_base (the URL of an "
                "OpenAI-compatible API, e.g. http://localhost:8000/v1)"
            )
        return self


# What a model id without its provider most likely meant, by how it starts.
_USUAL_PROVIDERS = (
    (("gpt-", "o1", "o3", "o4", "chatgpt-"), "openai"),
    (("claude-",), "anthropic"),
    (("gemini-",), "gemini"),
    (("deepseek-",), "deepseek"),
    (("mistral-", "codestral-"), "mistral"),
    (("grok-",), "xai"),
)


def model_advice(model: str) -> tuple[str, str] | None:
    """What is wrong with a model id, and the id it most likely meant; None when it names
    its provider (`openai/gpt-4o`): litellm would guess the provider of a bare `gpt-4o`, and
    an OpenAI-compatible server's bare model name not at all."""
    provider, _, name = model.partition("/")
    if provider.strip() and name.strip():
        return None
    problem, example = "is not <provider>/<model>", "openai/gpt-4o"
    if model.strip() and "/" not in model:
        starts = model.strip().lower()
        guess = next((p for prefixes, p in _USUAL_PROVIDERS if starts.startswith(prefixes)), None)
        problem, example = "names no provider", f"{guess or 'openai'}/{model.strip()}"
    return (
        f"{model!r} {problem}: write <provider>/<model>, e.g. {example} "
        "(for an OpenAI-compatible server at agent.api_base: openai/<its model name>)",
        example,
    )


def base_advice(url: str) -> tuple[str, str] | None:
    """What is wrong with an endpoint's URL, and the URL it most likely meant; None for an
    http:// or https:// URL with a host."""
    scheme, _, rest = url.strip().partition("://")
    if scheme.lower() in ("http", "https") and rest.strip("/"):
        return None
    meant = f"http://{url.strip()}" if "://" not in url else "http://localhost:11434/v1"
    return f"{url!r} is not an http:// or https:// URL: e.g. {meant}", meant


def _model_id(model: str) -> str:
    advice = model_advice(model)
    if advice is not None:
        raise ValueError(advice[0])
    return model
