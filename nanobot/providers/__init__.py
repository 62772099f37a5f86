"""Models: the `LLMProvider` port, the provider (`provider.Provider`: retries, fallbacks,
tokens, context window, prices) and its transports (`litellm_provider`: litellm, the only
module that imports it; `openai_direct`: the direct OpenAI-compatible one)."""

from nanobot.providers.base import (
    Call,
    Completion,
    Delta,
    DeltaHandler,
    LLMProvider,
    Message,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSchema,
    Transport,
    Usage,
)

__all__ = [
    "Call",
    "Completion",
    "Delta",
    "DeltaHandler",
    "LLMProvider",
    "Message",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolSchema",
    "Transport",
    "Usage",
]
