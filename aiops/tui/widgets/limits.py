"""The rate-limits pane: calls in the window per session and tool type, disabled types flagged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from aiops.engine.events import RateInfo
from aiops.tui.keys import bindings_for


class LimitsTable(DataTable[Any]):
    PANE = "limits"
    BINDINGS = bindings_for("limits")
    HELP = """\
## Rate limits

Per session and tool type: the calls made in the sliding window against the limit from
limits.toml. A rule with `auto_disable = true` switches the tool type off for a session that
exceeds it; such rows say **DISABLED** and the model is told an operator must re-enable them.

**e** re-enables the highlighted row's tool type for its session (with a fresh window);
**r** reads the usage again.
"""

    class EnableRequested(Message):
        def __init__(self, session_id: str, tool_type: str) -> None:
            super().__init__()
            self.session_id = session_id
            self.tool_type = tool_type

    class RefreshRequested(Message):
        pass

    def __init__(self, short_id: Callable[[str | None], str] | None = None, **kw: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self._short_id = short_id or (lambda sid: sid or "?")
        self.usage_rows: list[RateInfo] = []

    def on_mount(self) -> None:
        self.add_column("sess", key="session")
        self.add_column("type", key="type")
        self.add_column("calls", key="used")
        self.add_column("state", key="state")
        self.show_usage([])

    def show_usage(self, rows: list[RateInfo]) -> None:
        current = self.cursor_row
        self.usage_rows = list(rows)
        self.clear()
        for r in self.usage_rows:
            state = Text("DISABLED", "bold red") if r.disabled else (
                Text("full", "yellow") if r.used >= r.limit else Text("ok"))
            self.add_row(self._short_id(r.session_id), r.tool_type,
                         f"{r.used}/{r.limit} in {r.window_seconds:g}s", state,
                         key=f"{r.session_id}\x1f{r.tool_type}")
        if self.usage_rows:
            self.move_cursor(row=min(current, len(self.usage_rows) - 1))
        self.border_subtitle = ("no tool type is rate limited for any session yet" if not self.usage_rows else
                                f"{sum(1 for r in self.usage_rows if r.disabled)} disabled")

    def action_enable(self) -> None:
        if not self.usage_rows or self.cursor_row < 0 or self.cursor_row >= len(self.usage_rows):
            self.notify("no row selected", timeout=2)
            return
        r = self.usage_rows[self.cursor_row]
        if not r.disabled:
            self.notify(f"{r.tool_type} is not disabled for session {self._short_id(r.session_id)}",
                        timeout=3)
            return
        self.post_message(self.EnableRequested(r.session_id, r.tool_type))

    def action_refresh(self) -> None:
        self.post_message(self.RefreshRequested())
