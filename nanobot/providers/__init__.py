"""Model providers: the `LLMProvider` port and its litellm adapter."""

from nanobot.providers.base import (
    Completion,
    Delta,
    DeltaHandler,
    LLMProvider,
    Message,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSchema,
    Usage,
)

__all__ = [
    "Completion",
    "Delta",
    "DeltaHandler",
    "LLMProvider",
    "Message",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolSchema",
    "Usage",
]
