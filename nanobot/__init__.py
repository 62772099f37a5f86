"""nanobot: a personal AI assistant that lives in your chats."""

__version__ = "0.1.0"
