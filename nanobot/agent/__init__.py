"""The agent: turns, context and memory."""
