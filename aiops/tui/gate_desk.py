"""The console's side of pending gates: the inbox kept in step with the engine, the toast and bell
for a new gate, the jump to the inbox and back, the details screen, and the answer.

A jump to a gate remembers where the operator was; answering the gate brings them back there, so
that what they type next cannot land in the inbox and answer the next gate. Owned by the App, whose
message handlers delegate here (Textual collects `@on` handlers per class, so they stay on the App).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from aiops.engine import events as ev
from aiops.tui.format import gate_outcome, one_line
from aiops.tui.widgets.gates import GatesInbox

if TYPE_CHECKING:
    from textual.widget import Widget

    from aiops.tui.app import AiopsApp
    from aiops.tui.screens.modals import GateDetailsScreen

GATE_TOAST_SECONDS = 4  # the header badge stays as long as the gate does


class GateDesk:
    """Pending gates as the console shows and answers them."""

    def __init__(self, app: AiopsApp) -> None:
        self.app = app
        self.details: GateDetailsScreen | None = None
        # Where the operator was when they jumped to a gate (None: no jump to return from).
        self.return_to: Widget | None = None

    def set_gates(self, gates: list[ev.GateInfo]) -> None:
        app = self.app
        app.inbox.set_gates(gates)
        app.main.set_gate_count(len(app.inbox.gates))

    def opened(self, gate: ev.GateInfo) -> None:
        app = self.app
        app.inbox.add(gate)
        # On the terminal now, in a frame of the row alone (see `MainScreen.draw_now`).
        app.main.draw_now(app.inbox)
        if app.ring_bell:
            app.bell()
        # The row first; the count (header badge, tab label) and the toast follow after the next
        # frame. They change the layout (a wider label, a toast mounted): a frame that reflows the
        # screen takes several times as long as the row's alone.
        app.call_after_refresh(self._announce, gate)

    def _announce(self, gate: ev.GateInfo) -> None:
        app = self.app
        if not app._drawing:
            return
        app.main.set_gate_count(len(app.inbox.gates))
        if gate.id not in app.inbox.gates:
            return  # answered (or gone) before its toast: nothing waits
        if app.inbox.shows(gate.id):
            # Its row is in sight (and the bell rang): a toast over it would say it twice, and
            # mounting the toast, then taking it down seconds later, lays the screen out each time.
            return
        # Short and brief: the header badge and the inbox carry the details; this only says that
        # something waits and which key answers it.
        who = f"{gate.client_kind} {app.sessions_list.short_id(gate.session_id)}"
        what = f"{gate.target} {gate.operation}".rstrip()
        app.notify(f"{who} · {one_line(what, 30)}", title=f"⚑ approval needed · {app.key_name('app.jump_gate')}",
                   severity="warning", timeout=GATE_TOAST_SECONDS, markup=False)

    def resolved(self, gate: ev.GateInfo) -> None:
        app = self.app
        if gate.id in app.inbox.gates and app.adapter.answered_elsewhere(gate):
            # Several operators attached: the row leaves this inbox saying who took it.
            who = f"{gate.client_kind} {app.sessions_list.short_id(gate.session_id)}"
            app.notify(f"gate {gate.target} ({who}) {gate_outcome(gate)}", timeout=6, markup=False)
        if app.inbox.drop(gate.id):
            app.main.draw_now(app.inbox)  # the row gone at once, before the focus and the count move
        app.main.set_gate_count(len(app.inbox.gates))
        if not app.inbox.gates and app.main.focused is app.inbox:
            self.return_from_gates()  # nothing left to answer where the jump led
        details = self.details
        if details is not None and details.gate_id == gate.id and details.is_attached:
            self.details = None
            details.dismiss(None)
            app.notify(f"gate {gate_outcome(gate)}", timeout=4)

    def decided(self, msg: GatesInbox.Decision) -> None:
        self.answer(msg.gate_id, msg.decision, msg.scope, msg.stop_turn)
        self.return_from_gates()

    def jump(self) -> None:
        app = self.app
        focused = app.main.focused
        if focused is not None and not isinstance(focused, GatesInbox):
            self.return_to = focused
        app.main.show_pane("gates")
        app.inbox.highlight_oldest()
        if not app.inbox.gates:
            app.notify("no gate is pending", timeout=2)

    def return_from_gates(self) -> None:
        """After answering the gate a jump led to, the focus goes back where the operator was."""
        app = self.app
        target, self.return_to = self.return_to, None
        if target is None or not target.is_attached or not app._drawing:
            return
        if app.main.focused is app.inbox:
            app.main.return_focus(target)

    def answer(self, gate_id: str, decision: str, scope: str, stop: bool) -> None:
        app = self.app
        gate = app.inbox.gates.get(gate_id)
        error = app.adapter.resolve_gate(gate_id, decision, scope)
        if error:
            app.inbox.drop(gate_id)
            app.main.set_gate_count(len(app.inbox.gates))
            app.notify(error, severity="warning", timeout=5)
            return
        if stop and gate is not None and gate.session_id:
            app.adapter.stop_turn(gate.session_id)

    async def show_details(self, gate_id: str) -> None:
        """The gate's details screen, with the last of its session's conversation for context."""
        app = self.app
        gate = app.inbox.gates.get(gate_id)
        if gate is None:
            return
        sid = gate.session_id
        context = ""
        with contextlib.suppress(Exception):
            page = await app.adapter.load_history(sid, 8)
            lines = []
            for m in page.messages:
                if m.meta.get("command") or m.meta.get("kind") == "command":
                    continue  # the operator's own commands say nothing about what the model does
                if m.role in ("user", "assistant", "notice", "error") and m.content.strip():
                    lines.append(f"{m.role}: {one_line(m.content, 300)}")
                for tc in m.tool_calls:
                    lines.append(f"tool call: {tc.name}")
            context = "\n".join(lines[-8:])
        partial = app.live.partial_text(sid)
        if partial.strip():
            context += f"\n(streaming) {one_line(partial, 300)}"
        if not app._drawing or gate_id not in app.inbox.gates:
            return  # closing, or answered elsewhere while the context was read
        from aiops.tui.screens.modals import GateDetailsScreen  # imported when first needed

        screen = GateDetailsScreen(gate, app.sessions_list.short_id(sid), context)
        self.details = screen

        def answered(result: tuple[str, str, bool] | None) -> None:
            if self.details is screen:
                self.details = None
            if result is not None:
                self.answer(gate_id, *result)
                self.return_from_gates()

        await app.push_screen(screen, answered)
