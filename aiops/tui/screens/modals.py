"""Modal screens: F1 help, gate details, prompt-section editor.

Each has its own key bar: a footer belongs to one screen and shows that screen's bindings, so the
main screen's bar (under the modal) would offer keys that do nothing while the modal is open.
"""

from __future__ import annotations

from collections.abc import Mapping

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.highlight import highlight
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Markdown, Static, TextArea

from aiops.engine.events import GateInfo
from aiops.tui.format import pretty_json, sql_of, time_left
from aiops.tui.keys import PANES, KeySpec, display_keys, keys_of, specs_for
from aiops.tui.widgets.footer import ConsoleFooter
from aiops.tui.widgets.gates import session_grant_text


class HelpScreen(ModalScreen[None]):
    """Help for one pane: what it shows and the keys that work there (after the user's keymap)."""

    BINDINGS = [
        Binding("escape,f1,q", "dismiss", "Close", tooltip="Close the help", id="help.close"),
    ]

    def __init__(self, pane: str, help_markdown: str, keymap: Mapping[str, str]) -> None:
        super().__init__(classes="modal")
        self.pane = pane
        self.help_markdown = help_markdown
        self.keymap = keymap

    def _table(self, specs: list[KeySpec]) -> str:
        rows = ["| keys | what it does |", "|---|---|"]
        for k in specs:
            rows.append(f"| `{display_keys(keys_of(k, self.keymap))}` | {k.tooltip} |")
        return "\n".join(rows)

    def compose(self) -> ComposeResult:
        text = self.help_markdown.strip() + "\n\n### Keys here\n\n" + self._table(specs_for(self.pane))
        if self.pane != "global":
            text += "\n\n### Keys everywhere\n\n" + self._table(specs_for("global"))
        text += ("\n\nKeys can be changed in `aiops.toml` under `[console.keymap]` "
                 "(binding id = \"keys\"); docs/CONSOLE.md lists every id.")
        with Vertical(id="dialog"):
            yield Label(f"Help · {PANES.get(self.pane, self.pane)}", classes="dialog-title")
            with VerticalScroll():
                yield Markdown(text)
            yield Label("esc closes", classes="dialog-hint")
        yield ConsoleFooter()


class GateDetailsScreen(ModalScreen[tuple[str, str, bool] | None]):
    """One gate in full; answers it with the inbox's keys. Returns (decision, scope, stop)."""

    BINDINGS = [
        Binding("a", "answer('approve','once',False)", "Approve", tooltip="Approve once",
                id="gate_details.approve"),
        Binding("s", "answer('approve','session',False)", "Approve session",
                tooltip="Approve for the rest of the session", id="gate_details.approve_session"),
        Binding("d", "answer('deny','once',False)", "Deny", tooltip="Deny", id="gate_details.deny"),
        Binding("x", "answer('deny','once',True)", "Deny+stop", tooltip="Deny and cancel the turn",
                id="gate_details.deny_stop"),
        Binding("escape", "close", "Close", tooltip="Close without answering", id="gate_details.close"),
    ]

    def __init__(self, gate: GateInfo, session_label: str, context: str) -> None:
        super().__init__(classes="modal")
        self.gate = gate
        self.session_label = session_label
        self.context = context

    @property
    def gate_id(self) -> str:
        return self.gate.id

    def compose(self) -> ComposeResult:
        g = self.gate
        head = f"{g.client_kind} session {self.session_label} · {g.target} {g.operation} · {g.tool_type}"
        args = dict(g.args)
        sql = sql_of(args)
        with Vertical(id="dialog"):
            yield Label(Content.assemble(("⚑ gate ", "bold"), self.gate_id), classes="dialog-title")
            yield Static(Content(head))
            if g.target != g.tool:  # an MCP tool: the head names it as gates.toml does
                yield Static(Content(f"the model calls it {g.tool}"), id="gate-model-name")
            if g.tables:
                yield Static(Content("tables: " + ", ".join(g.tables)))
            key = self._label("approve_session", "").strip()
            yield Static(Content(f"{key} (for session): {session_grant_text(g)}"), id="gate-session-grant")
            yield Static(self._time_left(), id="gate-time-left")
            with VerticalScroll(id="gate-body"):
                # Textual's highlighter uses theme variables: the colours follow the theme.
                if sql is not None:
                    yield Static(highlight(sql, language="sql"), id="gate-sql", classes="code")
                rest = {k: v for k, v in args.items() if v is not sql} if sql is not None else args
                if rest or sql is None:  # the SQL is not shown twice
                    yield Static(highlight(pretty_json(rest), language="json"), id="gate-args", classes="code")
                yield Label("what the session was doing", classes="dialog-subtitle")
                yield Static(Content(self.context or "(no messages yet)"), id="gate-context")
            with Horizontal(classes="dialog-buttons"):
                yield Button(self._label("approve", "Approve"), id="b-approve", variant="success", compact=True)
                yield Button(self._label("approve_session", "For session"), id="b-session", variant="primary",
                             compact=True)
                yield Button(self._label("deny", "Deny"), id="b-deny", variant="error", compact=True)
                yield Button(self._label("deny_stop", "Deny+stop"), id="b-stop", variant="error", compact=True)
        yield ConsoleFooter()

    def _label(self, name: str, text: str) -> str:
        """A button's text with the key that does the same (after the user's keymap)."""
        binding_id = f"gate_details.{name}"
        default = next(b.key for b in self.BINDINGS if isinstance(b, Binding) and b.id == binding_id)
        keymap: Mapping[str, str] = getattr(self.app, "keymap_overrides", {})
        key = keymap.get(binding_id, default).split(",")[0].strip()
        return f"{key} {text}"

    def _time_left(self) -> Content:
        expires = self.gate.expires_at
        left = time_left(expires)
        if expires is None:
            return Content.assemble("time left: ", (left, "bold"), " (waits until answered)")
        return Content.assemble("time left: ", (left, "bold $warning"))

    def on_mount(self) -> None:
        if self.gate.expires_at is not None:
            self.set_interval(1, self._tick)

    def _tick(self) -> None:
        self.query_one("#gate-time-left", Static).update(self._time_left())

    def on_button_pressed(self, event: Button.Pressed) -> None:
        answers = {"b-approve": ("approve", "once", False), "b-session": ("approve", "session", False),
                   "b-deny": ("deny", "once", False), "b-stop": ("deny", "once", True)}
        if event.button.id in answers:
            self.dismiss(answers[event.button.id])

    def action_answer(self, decision: str, scope: str, stop: bool) -> None:
        self.dismiss((decision, scope, stop))

    def action_close(self) -> None:
        self.dismiss(None)


class PromptEditScreen(ModalScreen[str | None]):
    """Edit one leaf section's text; ctrl+s returns it for saving, esc discards."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save", tooltip="Save the section (atomic write, audited)",
                id="prompt_edit.save", priority=True),
        Binding("escape", "discard", "Discard", tooltip="Close without saving", id="prompt_edit.discard"),
    ]

    def __init__(self, section: str, body: str) -> None:
        super().__init__(classes="modal")
        self.section = section
        self.body = body

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="wide"):
            yield Label(Content.assemble(("edit section ", "bold"), self.section), classes="dialog-title")
            yield TextArea(self.body, id="prompt-editor", soft_wrap=True, tab_behavior="indent")
            yield Label("ctrl+s saves · esc discards", classes="dialog-hint")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        self.query_one("#prompt-editor", TextArea).focus()

    def action_save(self) -> None:
        self.dismiss(self.query_one("#prompt-editor", TextArea).text)

    def action_discard(self) -> None:
        self.dismiss(None)
