"""The message bus: typed events between channels and the agent."""
