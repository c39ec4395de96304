"""What the engine refuses, and why."""

from __future__ import annotations


class EngineError(Exception):
    """A request the engine refuses; the message is for the user."""


class EngineStopping(Exception):
    """The engine is stopping (or stopped): it takes no new message. Not an EngineError: the
    request was fine, and may be sent again once aiops is back (the server answers 503)."""


STOPPING = "aiops is shutting down"
