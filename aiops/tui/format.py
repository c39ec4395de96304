"""Small text helpers shared by the panes: ages, countdowns, one-line previews."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from aiops.engine.events import GateInfo

STATE_MARK = {"idle": "·", "running": "▶", "waiting": "⚑"}


def ago(ts: float | None, now: float | None = None) -> str:
    """Compact age for lists: "now", "5m", "3h", "2d"."""
    if not ts:
        return ""
    s = max(0, int((now or time.time()) - ts))
    if s < 60:
        return "now"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def time_left(expires_at: float | None, now: float | None = None) -> str:
    """"1:05" until a gate times out; "∞" when it waits until answered."""
    if not expires_at:
        return "∞"
    s = max(0, int(expires_at - (now or time.time())))
    return f"{s // 60}:{s % 60:02d}"


def one_line(text: str, width: int) -> str:
    flat = " ".join(str(text).split())
    if width <= 1:
        return flat[:width]
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


def args_preview(args: Any, width: int = 60) -> str:
    if isinstance(args, dict):
        for key in ("sql", "query", "statement", "q", "command"):
            v = args.get(key)
            if isinstance(v, str) and v.strip():
                return one_line(v, width)
        try:
            return one_line(json.dumps(args, ensure_ascii=False, default=str), width)
        except (TypeError, ValueError):
            pass
    return one_line(repr(args), width)


def sql_of(args: Any) -> str | None:
    if isinstance(args, dict):
        for key in ("sql", "query", "statement"):
            v = args.get(key)
            if isinstance(v, str) and v.strip():
                return v
    return None


def pretty_json(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def duration(ms: float | None) -> str:
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms:.0f} ms"
    return f"{ms / 1000:.1f} s"


def gate_outcome(info: GateInfo | Mapping[str, Any]) -> str:
    """How a gate was answered, in words: "approved for the session by ops", "timed out",
    "cancelled (session deleted)". "timeout by timeout" says one thing twice; "cancelled by
    client disconnected" reads as why, so it is put as why. `info`: a resolved gate, or the
    resolution keys of a stored gate record."""
    if not isinstance(info, GateInfo):
        info = GateInfo.from_dict(info)
    decision = str(info.decision or "")
    by = str(info.by or "")
    scope_txt = " for the session" if info.scope == "session" and decision == "approved" else ""
    by_txt = "" if not by or by == decision else (f" ({by})" if decision == "cancelled" else f" by {by}")
    return f"{'timed out' if decision == 'timeout' else decision}{scope_txt}{by_txt}"


def server_label(urls: list[str], wanted: bool) -> str:
    """The header's server field: the first URL and the other ports ("http://127.0.0.1:8080 +8443"),
    or why there is none."""
    if urls:
        return urls[0] + "".join(f" +{u.rsplit(':', 1)[-1]}" for u in urls[1:])
    return "server off" if not wanted else "server failed"
