"""Per-session limits: `limits.toml` and the sliding-window rate limiter for tool types.

The limiter is synchronous and loop-free: the engine calls `check` right before running a tool, on
the event loop, so no locking is needed. Refusals are returned as text because they become the
tool result the model reads.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from aiops.gates.rate_usage import RateUsage

log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RateRule(_Strict):
    calls: int = Field(gt=0)
    window_seconds: float = Field(gt=0)
    # Exceeding disables the tool type for that session until an operator re-enables it.
    auto_disable: bool = False


def _default_rates() -> dict[str, RateRule]:
    return {
        "db": RateRule(calls=20, window_seconds=60),
        "search": RateRule(calls=5, window_seconds=10),
        "extract": RateRule(calls=5, window_seconds=30),
        "drive": RateRule(calls=10, window_seconds=60),
        "llm_call": RateRule(calls=3, window_seconds=20),
        "agent_call": RateRule(calls=5, window_seconds=60),
    }


class LimitsConfig(_Strict):
    """The whole of `limits.toml`. `LimitsConfig()` equals the shipped default file.

    An empty `[rate]` table means no tool type is rate limited.
    """

    max_tool_iterations: int = Field(10, gt=0)
    max_agent_call_depth: int = Field(1, ge=0)
    # Wall-clock seconds one turn may take in all (model calls, tools, gates); 0: no limit. A model
    # answering a token every few seconds never trips its model's timeout, which counts silence.
    max_turn_seconds: float = Field(1800, ge=0)
    rate: dict[str, RateRule] = Field(default_factory=_default_rates)

    def to_toml_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="python")
        if float(data["max_turn_seconds"]).is_integer():
            data["max_turn_seconds"] = int(data["max_turn_seconds"])
        for rule in data["rate"].values():
            w = rule["window_seconds"]
            rule["window_seconds"] = int(w) if float(w).is_integer() else w
        return data


def _fmt_seconds(s: float) -> str:
    return f"{s:g}"


class RateLimiter:
    """Sliding window per (session, tool type). Tool types without a rule are unlimited.

    `on_change(session_id)` is called after a slot is consumed, a tool type is disabled or
    re-enabled, so the engine can publish fresh usage; its exceptions are logged, never raised
    into the tool call.
    """

    def __init__(
        self,
        config: LimitsConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        cfg = config or LimitsConfig()
        self._rules: dict[str, RateRule] = {k: v.model_copy() for k, v in cfg.rate.items()}
        self._base = cfg
        self._clock = clock
        self.on_change = on_change
        self._calls: dict[tuple[str, str], deque[float]] = {}
        self._disabled: set[tuple[str, str]] = set()

    # ---- rules ------------------------------------------------------------------------------------

    @property
    def config(self) -> LimitsConfig:
        """The current limits, including rules changed at runtime (for writing back)."""
        return self._base.model_copy(update={"rate": {k: v.model_copy() for k, v in self._rules.items()}})

    def rule(self, tool_type: str) -> RateRule | None:
        return self._rules.get(tool_type)

    def set_rule(self, tool_type: str, calls: int, window_seconds: float,
                 auto_disable: bool | None = None) -> RateRule:
        """Add or replace a rule; calls already made keep counting against the new window."""
        old = self._rules.get(tool_type)
        keep_auto = old.auto_disable if old else False
        rule = RateRule(calls=calls, window_seconds=window_seconds,
                        auto_disable=keep_auto if auto_disable is None else auto_disable)
        self._rules[tool_type] = rule
        return rule

    def remove_rule(self, tool_type: str) -> bool:
        """Make a tool type unlimited again; sessions disabled for it are re-enabled too."""
        removed = self._rules.pop(tool_type, None) is not None
        for key in [k for k in self._disabled if k[1] == tool_type]:
            self._disabled.discard(key)
            self._notify(key[0])
        return removed

    # ---- checking ---------------------------------------------------------------------------------

    def _window(self, key: tuple[str, str], rule: RateRule, now: float) -> deque[float]:
        calls = self._calls.setdefault(key, deque())
        # A call made exactly `window_seconds` ago no longer counts: its slot frees at window end.
        edge = now - rule.window_seconds
        while calls and calls[0] <= edge:
            calls.popleft()
        return calls

    def check(self, session_id: str, tool_type: str) -> str | None:
        """None (and one slot consumed) when the call may run, else the refusal text.

        A refused call consumes nothing.
        """
        key = (session_id, tool_type)
        if key in self._disabled:
            return (f"{tool_type} tools are disabled for this session after exceeding the rate limit; "
                    "they stay disabled until an operator re-enables them")
        rule = self._rules.get(tool_type)
        if rule is None:
            return None
        now = self._clock()
        calls = self._window(key, rule, now)
        if len(calls) < rule.calls:
            calls.append(now)
            self._notify(session_id)
            return None
        refusal = (f"rate limit exceeded: {rule.calls} calls in {_fmt_seconds(rule.window_seconds)} s "
                   f"for {tool_type}")
        if rule.auto_disable:
            self._disabled.add(key)
            self._notify(session_id)
            refusal += (f"; {tool_type} tools are now disabled for this session until an operator "
                        "re-enables them")
        return refusal

    def is_disabled(self, session_id: str, tool_type: str) -> bool:
        return (session_id, tool_type) in self._disabled

    def enable(self, session_id: str, tool_type: str) -> bool:
        """Re-enable a disabled tool type for one session, with a fresh window. True if it was off."""
        key = (session_id, tool_type)
        if key not in self._disabled:
            return False
        self._disabled.discard(key)
        # A fresh window: otherwise the very next call would exceed and disable it again.
        self._calls.pop(key, None)
        self._notify(session_id)
        return True

    def forget(self, session_id: str) -> None:
        """Drop all state of a deleted session."""
        for key in [k for k in self._calls if k[0] == session_id]:
            del self._calls[key]
        self._disabled = {k for k in self._disabled if k[0] != session_id}

    # ---- reporting --------------------------------------------------------------------------------

    def usage(self, session_id: str | None = None) -> list[RateUsage]:
        """One row per (session, limited tool type), sorted; for one session, every limited type.

        Without a session id, only sessions that have used a limited type (or are disabled) appear.
        """
        now = self._clock()
        if session_id is not None:
            sessions = [session_id]
        else:
            sessions = sorted({k[0] for k in self._calls} | {k[0] for k in self._disabled})
        rows: list[RateUsage] = []
        for sid in sessions:
            for tool_type in sorted(self._rules):
                rule = self._rules[tool_type]
                key = (sid, tool_type)
                used = len(self._window(key, rule, now)) if key in self._calls else 0
                if key in self._calls and not self._calls[key]:
                    del self._calls[key]
                rows.append(RateUsage(sid, tool_type, used, rule.calls, rule.window_seconds,
                                      key in self._disabled))
        if session_id is None:
            rows = [r for r in rows if r.used or r.disabled]
        return rows

    def _notify(self, session_id: str) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(session_id)
        except Exception:
            log.exception("rate limiter on_change callback failed")
