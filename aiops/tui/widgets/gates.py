"""The gates inbox: every pending approval from every session, oldest first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.content import Content
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from aiops.tui.format import one_line, time_left
from aiops.tui.keys import bindings_for


class GatesInbox(OptionList):
    """Pending gates; keys answer the highlighted one."""

    PANE = "gates"
    BINDINGS = bindings_for("gates")
    HELP = """\
## Gates inbox

Every tool call the policy says to **ask** about waits here, from every client (console, API,
chat UIs, Slack, swarm, MCP), oldest first: client kind and session, tool and operation, tables
for database calls, a one-line summary and the time left before it times out (`∞`: it waits).

- **a** approve once · **s** approve for the session (the same tool, operation and tables pass
  without asking until restart) · **d** deny · **x** deny and cancel the turn that asked
- **enter** opens the gate: full arguments (SQL highlighted) and what the session was doing.

A new gate rings the bell, shows a notification and the count in the header; **ctrl+g** jumps here
from anywhere. A gate answered elsewhere (API, MCP, timeout) leaves the inbox at once.
"""

    class Decision(Message):
        """The operator answered a gate here."""

        def __init__(self, gate_id: str, decision: str, scope: str = "once", stop: bool = False) -> None:
            super().__init__()
            self.gate_id = gate_id
            self.decision = decision
            self.scope = scope
            self.stop_turn = stop

    class DetailsRequested(Message):
        def __init__(self, gate_id: str) -> None:
            super().__init__()
            self.gate_id = gate_id

    def __init__(self, short_id: Callable[[str | None], str] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.gates: dict[str, dict[str, Any]] = {}
        self._short_id = short_id or (lambda sid: sid or "?")

    def on_mount(self) -> None:
        self.set_interval(1, self._tick)
        self.rebuild()

    def on_resize(self) -> None:
        self.rebuild()

    # -- data --

    def ordered(self) -> list[dict[str, Any]]:
        return sorted(self.gates.values(), key=lambda g: g.get("created_at") or 0)

    def set_gates(self, gates: list[dict[str, Any]]) -> None:
        self.gates = {g["id"]: dict(g) for g in gates}
        self.rebuild()

    def add(self, gate: dict[str, Any]) -> None:
        self.gates[gate["id"]] = dict(gate)
        self.rebuild()

    def remove(self, gate_id: str) -> bool:
        if self.gates.pop(gate_id, None) is None:
            return False
        self.rebuild()
        return True

    # -- drawing --

    def _prompt(self, g: dict[str, Any], width: int) -> Content:
        who = f"{g.get('client_kind', '?')} {self._short_id(g.get('session_id'))}"
        what = f"{g.get('tool', '?')} {g.get('operation', '')}"
        left = time_left(g.get("expires_at"))
        head = f"⚑ {who} · {what}"
        pad = max(1, width - len(head) - len(left))
        lines = [Content.assemble((head, "bold"), " " * pad, left)]
        if g.get("tables"):
            lines.append(Content("  " + one_line(", ".join(g["tables"]), width - 2)))
        summary = str(g.get("summary") or "")
        # The summary repeats tool and operation; what follows the first ": " is the interesting part.
        _, sep, rest = summary.partition(": ")
        lines.append(Content.styled("  " + one_line(rest if sep else summary, width - 2), "dim"))
        out = lines[0]
        for line in lines[1:]:
            out = Content.assemble(out, "\n", line)
        return out

    def rebuild(self) -> None:
        if not self.is_mounted:
            return
        width = max(20, (self.scrollable_content_region.width or 40) - 3)
        current = self.highlighted_option.id if self.highlighted_option is not None else None
        index = self.highlighted or 0
        gates = self.ordered()
        with self.app.batch_update():
            if gates:
                self.set_options(Option(self._prompt(g, width), id=g["id"]) for g in gates)
            else:
                self.set_options([Option(Content.styled("No gate is waiting.", "dim italic"), disabled=True)])
            if gates:
                ids = [g["id"] for g in gates]
                self.highlighted = ids.index(current) if current in ids else min(index, len(ids) - 1)
        self.border_title = f"Gates ({len(gates)})" if gates else "Gates"

    def _tick(self) -> None:
        if any(g.get("expires_at") for g in self.gates.values()):
            width = max(20, (self.scrollable_content_region.width or 40) - 3)
            for g in self.ordered():
                try:
                    self.replace_option_prompt(g["id"], self._prompt(g, width))
                except Exception:  # noqa: BLE001 - removed meanwhile
                    pass

    def highlight_oldest(self) -> None:
        if self.option_count:
            self.highlighted = 0

    # -- actions --

    def _current(self) -> str | None:
        opt = self.highlighted_option
        return opt.id if opt is not None and opt.id in self.gates else None

    def _decide(self, decision: str, scope: str = "once", stop: bool = False) -> None:
        gid = self._current()
        if gid is None:
            self.notify("no gate is pending", timeout=2)
            return
        self.post_message(self.Decision(gid, decision, scope, stop))

    def action_approve(self) -> None:
        self._decide("approve")

    def action_approve_session(self) -> None:
        self._decide("approve", "session")

    def action_deny(self) -> None:
        self._decide("deny")

    def action_deny_stop(self) -> None:
        self._decide("deny", stop=True)

    def action_details(self) -> None:
        gid = self._current()
        if gid is not None:
            self.post_message(self.DetailsRequested(gid))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id in self.gates:
            self.post_message(self.DetailsRequested(event.option.id))
