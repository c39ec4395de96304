"""One rate-limited tool type's use in one session: what the limiter reports and every view shows.

A module of its own, with nothing but the standard library, because the engine's events carry it
(`events.RateInfo` is this type) and `aiops.engine.events` must stay cheap to import: `aiops chat`
reads events without loading pydantic, which `aiops.gates.limits` needs for `limits.toml`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RateUsage:
    """One rate-limited tool type's use in one session."""

    session_id: str
    tool_type: str
    used: int
    limit: int
    window_seconds: float
    disabled: bool

    def to_dict(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "tool_type": self.tool_type, "used": self.used,
                "limit": self.limit, "window_seconds": self.window_seconds, "disabled": self.disabled}
