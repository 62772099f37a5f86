"""Tools the agent can call: the Tool port, the registry and the built-ins."""
