"""aiops: a terminal-first operator console for a multi-client AI agent."""

__version__ = "0.1.0"
