"""Launchers that wrap the task payload (🤗 Accelerate)."""
