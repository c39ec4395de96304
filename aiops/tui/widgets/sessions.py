"""The sessions pane: every session of every kind, grouped by kind."""

from __future__ import annotations

import time
from typing import Any

from textual.content import Content
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from aiops.tui.format import STATE_MARK, ago, one_line
from aiops.tui.keys import bindings_for
from aiops.tui.widgets.fitted import Rows
from aiops.tui.widgets.typeaway import TypesAway

# The engine's session kinds, in the order the pane groups them (unknown kinds follow).
KIND_ORDER = ("console", "cli", "api", "proxy", "slack", "swarm", "mcp")


class SessionsList(TypesAway, OptionList):
    """Sessions grouped by kind: shorthand id, title, model, state, last activity, unread.

    Picking a session hands the operator to the input; text typed here that is none of the list's
    keys goes there too, so that a message cannot open a session (`n`) or stop a turn (`x`).
    """

    PANE = "sessions"
    BINDINGS = bindings_for("sessions")
    HELP = """\
## Sessions

Every session of every client: the console, `aiops chat` (kind cli), API scripts, chat UIs through the proxy, Slack
threads, swarm peers and MCP clients, grouped by kind. Each shows its shorthand id, title, model,
state (`·` idle, `▶` running, `⚑` waiting on a gate), last activity, and `●` when it has output
you have not seen.

**{sessions.open}** shows a session in the chat pane, live, and puts the cursor in the input.
**{sessions.new}** (or **{app.new_session}** anywhere) opens a new console session;
**{sessions.stop}** cancels the highlighted session's running turn. Typing anything else here goes
to the message input.
"""

    class Picked(Message):
        def __init__(self, session_id: str) -> None:
            super().__init__()
            self.session_id = session_id

    class NewRequested(Message):
        pass

    class StopRequested(Message):
        def __init__(self, session_id: str) -> None:
            super().__init__()
            self.session_id = session_id

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.sessions: dict[str, dict[str, Any]] = {}
        self.unread: set[str] = set()
        self.selected: str | None = None
        self.hold = False  # rebuilds wait (the terminal is behind: nothing is drawn)
        self._held = False  # one waited

    def hold_rebuilds(self, hold: bool) -> None:
        """Put rebuilds off while `hold`; letting go does the one that waited."""
        self.hold = hold
        if not hold and self._held:
            self._held = False
            self.rebuild()

    def on_mount(self) -> None:
        self.set_interval(15, self.rebuild)  # the ages

    # -- data --

    def set_sessions(self, sessions: list[dict[str, Any]]) -> None:
        self.sessions = {s["client_id"]: dict(s) for s in sessions}
        self.rebuild()

    def upsert(self, session: dict[str, Any]) -> None:
        sid = session.get("client_id")
        if not sid:
            return
        merged = {**self.sessions.get(sid, {}), **session}
        merged.pop("change", None)
        self.sessions[sid] = merged
        self.rebuild()

    def drop(self, session_id: str) -> None:
        """Take a deleted session off the list. (Not `remove`: that is every widget's own removal
        from the DOM.)"""
        self.sessions.pop(session_id, None)
        self.unread.discard(session_id)
        self.rebuild()

    def touch(self, session_id: str, ts: float | None = None) -> None:
        s = self.sessions.get(session_id)
        if s is not None:
            s["updated_at"] = ts or time.time()

    def mark_unread(self, session_id: str) -> None:
        if session_id != self.selected and session_id not in self.unread:
            self.unread.add(session_id)
            self.rebuild()

    def select(self, session_id: str) -> None:
        """Mark the session shown in the chat; the cursor moves to it (a new session, a jump), so
        the list opens where the operator is."""
        self.selected = session_id
        self.unread.discard(session_id)
        self.rebuild(highlight=session_id)

    def short_id(self, session_id: str | None) -> str:
        s = self.sessions.get(session_id or "")
        return str(s["short_id"]) if s and s.get("short_id") is not None else (session_id or "?")

    # -- drawing --

    def _prompt(self, s: dict[str, Any]) -> Rows:
        sid = s["client_id"]
        state = s.get("state") or "idle"
        title = one_line(s.get("title") or "(new)", 200)
        head = f"{s.get('short_id', '?'):>4} {STATE_MARK.get(state, '·')} "
        unread = Content.styled("●", "bold $accent") if sid in self.unread else Content("")
        line1 = Content.assemble((head, "bold" if sid == self.selected else ""), title)
        meta = " · ".join(x for x in (s.get("model") or "", state) if x)
        line2 = Content.styled("     " + meta, "dim")
        # The title takes the width the pane has; the unread mark and the age keep their place.
        return Rows([(line1, unread), (line2, Content.styled(ago(s.get("updated_at")), "dim"))])

    def rebuild(self, highlight: str | None = None) -> None:
        """Redraw every row; the cursor stays on its session (or moves to `highlight`). While the
        terminal is behind (nothing is drawn) this waits for it: one rebuild per session event,
        with hundreds of sessions, was most of what the console cost the loop then."""
        if not self.is_mounted:
            return
        if self.hold:
            self._held = True
            return
        highlighted = highlight or (self.highlighted_option.id if self.highlighted_option is not None
                                    else self.selected)
        options: list[Option | None] = []
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for s in self.sessions.values():
            by_kind.setdefault(s.get("kind") or "api", []).append(s)
        kinds = [k for k in KIND_ORDER if k in by_kind] + sorted(set(by_kind) - set(KIND_ORDER))
        for kind in kinds:
            group = sorted(by_kind[kind], key=lambda s: -(s.get("updated_at") or 0))
            options.append(Option(Content.assemble((f"{kind} ({len(group)})", "bold underline")),
                                  id=f"kind:{kind}", disabled=True))
            for s in group:
                options.append(Option(self._prompt(s), id=s["client_id"]))
        with self.app.batch_update():
            self.set_options(o for o in options if o is not None)
            if highlighted is not None:
                try:
                    self.highlighted = self.get_option_index(highlighted)
                except Exception:  # noqa: BLE001 - the session is gone
                    pass

    # -- actions --

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id and not event.option.id.startswith("kind:"):
            # The App moves the focus to the input; keys typed before it gets there are text for
            # the input too, letters of this list's bindings included.
            self.typing_away = True
            self.post_message(self.Picked(event.option.id))

    def action_new(self) -> None:
        self.post_message(self.NewRequested())

    def action_stop(self) -> None:
        opt = self.highlighted_option
        if opt is not None and opt.id and not opt.id.startswith("kind:"):
            self.post_message(self.StopRequested(opt.id))
