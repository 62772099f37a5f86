"""Test doubles for external services (LLM APIs, chat platforms)."""
