"""Chat channels: adapters between platforms and the agent."""
