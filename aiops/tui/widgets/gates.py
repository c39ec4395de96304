"""The gates inbox: every pending approval from every session, oldest first."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from pygments.token import Token
from textual.content import Content
from textual.geometry import Offset, Region, Size
from textual.highlight import HighlightTheme, highlight
from textual.message import Message
from textual.reactive import Reactive
from textual.widgets import OptionList
from textual.widgets.option_list import Option, OptionDoesNotExist

from aiops.engine.events import GateInfo
from aiops.gates.broker import summary_detail
from aiops.tui.format import one_line, sql_of, time_left
from aiops.tui.keys import BY_ID, bindings_for, keys_of
from aiops.tui.widgets.fitted import Rows
from aiops.tui.widgets.typeaway import TypesAway

ARM_SECONDS = 1.0  # how long a gate that moved under the cursor by itself ignores the answer keys
URGENT_SECONDS = 30  # the countdown turns red below this


class RowSQL(HighlightTheme):
    """SQL in a row: keywords, literals and operators stand out; names keep the row's own colour,
    which stays readable on the highlighted row (the default theme draws names in the primary
    colour, the highlight's own)."""

    STYLES = {**HighlightTheme.STYLES, Token.Name: "", Token.Name.Builtin: "bold", Token.Name.Variable: ""}


class GatesInbox(TypesAway, OptionList):
    """Pending gates; keys answer the highlighted one. Other text typed here goes to the input (with
    the focus) rather than let a later letter answer a gate."""

    PANE = "gates"
    BINDINGS = bindings_for("gates")

    # A gate added or answered changes the inbox's virtual height, and Widget declares
    # `virtual_size` a layout reactive: each change reflowed the whole screen (every widget
    # arranged again, the compositor's cuts for every line recomputed; 5-10 ms of the frame that
    # draws a new gate's row) although the inbox's own size is fixed by its pane and nothing
    # else moves. A repaint is enough; a scrollbar that appears or goes still reflows (those are
    # layout reactives of their own, set by `_scroll_update` when the virtual size changes).
    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)
    HELP = """\
## Gates inbox

Every tool call the policy says to **ask** about waits here, from every client (console, API,
chat UIs, Slack, swarm, MCP), oldest first: client kind and session, tool and operation (an MCP
server's tool on a line of its own, named as gates.toml names it: `mcp:SERVER:TOOL`), tables
for database calls, a one-line summary (SQL highlighted) and the time left before it times out
(`∞`: it waits).

- **{gates.approve}** approve once · **{gates.approve_session}** approve for the session: each gate's
  last line ({gates.approve_session} →) says what that lets through until restart (the same tool, operation, tables and, for
  SQL, the same statement kinds: an INSERT approved so is no licence to DELETE) · **{gates.deny}** deny ·
  **{gates.deny_stop}** deny and cancel the turn that asked
- **{gates.details}** opens the gate: full arguments (SQL highlighted) and what the session was doing.

A new gate rings the bell, shows a notification and the count in the header; **{app.jump_gate}**
jumps here from anywhere, and answering the gate you jumped to puts you back where you were. A gate
answered elsewhere (API, MCP, timeout) leaves the inbox at once.

The answer keys only act on a gate you have had a moment to see: a gate that has just moved under
the cursor (a new one, or the next after an answer) waits a second, and typing anything else here
goes to the message input.
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

    def __init__(self, short_id: Callable[[str | None], str] | None = None, *,
                 clock: Callable[[], float] = time.monotonic, **kw: Any) -> None:
        """`clock` (seconds, monotonic) times the ARM_SECONDS pause; a test passes one it advances."""
        super().__init__(**kw)
        self.gates: dict[str, GateInfo] = {}
        self._short_id = short_id or (lambda sid: sid or "?")
        self._clock = clock
        # When a gate last moved under the cursor by itself (arrived, or slid up after an answer)
        # while the inbox had focus: its answer keys wait ARM_SECONDS from then. None: not since
        # the operator last chose the gate under the cursor.
        self._moved_at: float | None = None
        self._rebuilding = False

    def on_mount(self) -> None:
        self.set_interval(1, self._tick)
        self.rebuild()

    # -- data --

    def ordered(self) -> list[GateInfo]:
        return sorted(self.gates.values(), key=lambda g: g.created_at)

    def set_gates(self, gates: Iterable[GateInfo]) -> None:
        self.gates = {g.id: g for g in gates}
        self.rebuild()

    def add(self, gate: GateInfo) -> None:
        self.gates[gate.id] = gate
        self.rebuild()

    def drop(self, gate_id: str) -> bool:
        """Take an answered (or vanished) gate out of the inbox; False if it was not in it.
        (Not `remove`: that is every widget's own removal from the DOM.)"""
        if self.gates.pop(gate_id, None) is None:
            return False
        self.rebuild()
        return True

    # -- drawing --

    def _prompt(self, g: GateInfo) -> Rows:
        who = f"{g.client_kind or '?'} {self._short_id(g.session_id)}"
        # A tool that gates.toml names otherwise than the model does (an MCP server's, which the
        # model calls `SERVER__TOOL`) gets a line of its own with the rule's name, `mcp:SERVER:TOOL`:
        # server and tool, long as they may be, are what the operator decides on.
        named = g.target != g.tool
        what = f"{(g.tool_type if named else g.tool) or '?'} {g.operation}".rstrip()
        head = Content.assemble(("⚑ ", "$warning"), (who, "bold"), " · ", what)
        lines: list[tuple[Content, Content]] = [(head, self._time_left(g))]
        if named:
            lines.append((Content.assemble("  ", ("tool ", "dim"), (g.target, "bold")), Content("")))
        if g.tables:
            lines.append((Content.assemble("  ", ("tables ", "dim"), (", ".join(g.tables), "bold")),
                          Content("")))
        sql = sql_of(dict(g.args))
        body: Content | None
        if sql is not None:
            body = Content.assemble("  ", highlight(" ".join(sql.split()), language="sql", theme=RowSQL))
        else:
            detail = summary_detail(g.summary, g.tool, g.operation, g.tables, g.target)
            body = Content.styled("  " + one_line(detail, 400), "dim") if detail else None
        if body is not None:
            lines.append((body, Content("")))
        lines.append((Content.styled(f"  {self._session_key()} → {session_grant_brief(g)}", "dim"), Content("")))
        return Rows(lines)

    def _session_key(self) -> str:
        """The key that approves for the session, after the user's keymap."""
        keymap: dict[str, str] = getattr(self.app, "keymap_overrides", {}) or {}
        return keys_of(BY_ID["gates.approve_session"], keymap).split(",")[0].strip()

    @staticmethod
    def _time_left(g: GateInfo) -> Content:
        expires = g.expires_at
        left = time_left(expires)
        urgent = expires is not None and expires - time.time() < URGENT_SECONDS
        return Content.styled(left, "bold $error" if urgent else "$text-muted")

    def rebuild(self) -> None:
        if not self.is_mounted:
            return
        current = self.highlighted_option.id if self.highlighted_option is not None else None
        index = self.highlighted or 0
        gates = self.ordered()
        before = self._shown()
        self._rebuilding = True
        try:
            self._set_gate_options(gates, current, index)
        finally:
            self._rebuilding = False
        now = self.highlighted_option.id if gates and self.highlighted_option is not None else None
        if now is not None and now != current and self.has_focus:
            self._moved_at = self._clock()
        title = f"Gates ({len(gates)})" if gates else "Gates"
        if self.border_title != title:  # setting it paints every line again, even the same title
            self.border_title = title
        self._repaint_changed(*before)

    def shows(self, gate_id: str) -> bool:
        """Whether the gate's row was on the terminal in the last frame: the inbox on the screen
        shown (its tab active, its pane not hidden, no modal over it), the row's first line within
        its view, and no toast over the row."""
        if self.app.screen is not self.screen or not self.is_on_screen:
            return False
        try:
            index = self.get_option_index(gate_id)
            y = self._index_to_line[index]
        except (KeyError, OptionDoesNotExist):
            return False
        top, area = round(self.scroll_offset.y), self.scrollable_content_region
        if not top <= y < top + area.height:
            return False
        # Toasts still up sit over the side pane's bottom right: a row under one is not in sight.
        row = Region(area.x, area.y + y - top, area.width, self._heights.get(index, 1))
        return not any(toast.region.overlaps(row) for toast in self.screen.query("Toast"))

    def _set_gate_options(self, gates: list[GateInfo], current: str | None, index: int) -> None:
        with self.app.batch_update():
            if gates:
                self.set_options(Option(self._prompt(g), id=g.id) for g in gates)
            else:
                self.set_options([Option(Content.styled("No gate is waiting.", "dim italic"), disabled=True)])
            if gates:
                ids = [g.id for g in gates]
                self.highlighted = ids.index(current) if current in ids else min(index, len(ids) - 1)

    def _shown(self) -> tuple[list[tuple[str | None, str]], int, int | None, Offset, set[Region]]:
        """What the rows on screen are: each option's id and text, the line count, the highlighted
        option, the scroll position and the repaints already asked for (OptionList's line cache and
        Widget's repaint regions, checked against Textual 8.2.8)."""
        rows = [(o.id, _plain(o.prompt)) for o in self.options]
        return rows, len(self._lines), self.highlighted, self.scroll_offset, set(self._repaint_regions)

    def _repaint_changed(self, rows: list[tuple[str | None, str]], line_count: int, highlighted: int | None,
                         scroll: Offset, asked: set[Region]) -> None:
        """Paint again only the lines whose rows changed, not the whole inbox.

        `set_options` (and the highlight, and the title) ask for every line of the inbox to be
        painted again, and the frame that draws a new gate's row (`MainScreen.draw_now`) then
        rendered the inbox's whole region with every pane under it: ~7 ms on a 2-core machine for a
        row of four lines (docs/PERFORMANCE.md). The rows before the first one that changed keep
        their place and text; so do the blank lines after the longer of the old and new lists. Where
        that is not known — the list scrolled, no line cache yet, a border (its title is the count)
        — everything is painted, as Textual does."""
        if (self.scroll_offset != scroll or not self._lines or self._layout_required
                or any(edge[0] not in ("", "none", "hidden") for edge in self.styles.border)):
            return
        now = [(o.id, _plain(o.prompt)) for o in self.options]
        same = next((i for i, (a, b) in enumerate(zip(rows, now, strict=False)) if a != b), min(len(rows), len(now)))
        lines = self._index_to_line
        first = lines.get(same, len(self._lines)) if same < len(now) else len(self._lines)
        last = max(line_count, len(self._lines))
        spans = [(first, last - first)] if last > first else []
        if highlighted != self.highlighted:
            for index in (highlighted, self.highlighted):
                if index is not None and index < same:  # its row kept its place; the highlight moved
                    spans.append((lines[index], self._heights[index]))
        self._repaint_regions.clear()
        self._repaint_regions.update(asked)  # what was asked before this rebuild still stands
        for y, count in spans:
            self.refresh_lines(y, count)

    def _tick(self) -> None:
        if any(g.expires_at for g in self.gates.values()):
            for g in self.ordered():
                if g.expires_at:
                    try:
                        self.replace_option_prompt(g.id, self._prompt(g))
                    except Exception:  # noqa: BLE001 - removed meanwhile
                        pass

    def highlight_oldest(self) -> None:
        if self.option_count:
            self.highlighted = 0
        self._moved_at = None  # the operator asked for this gate: it is theirs to answer

    # -- actions --

    def _current(self) -> str | None:
        opt = self.highlighted_option
        return opt.id if opt is not None and opt.id in self.gates else None

    def _decide(self, decision: str, scope: str = "once", stop: bool = False) -> None:
        gid = self._current()
        if gid is None:
            self.notify("no gate is pending", timeout=2)
            return
        if self._moved_at is not None and self._clock() - self._moved_at < ARM_SECONDS:
            # A keystroke meant for something else must not answer a gate nobody has looked at.
            self.notify("a gate just moved under the cursor: look, then press again", severity="warning",
                        timeout=3)
            return
        self.post_message(self.Decision(gid, decision, scope, stop))

    def watch_highlighted(self, highlighted: int | None) -> None:
        super().watch_highlighted(highlighted)
        # The operator moved the cursor (keys, mouse): the gate under it is one they chose.
        if self.has_focus and not self._rebuilding:
            self._moved_at = None

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


def session_grant_text(gate: GateInfo) -> str:
    """What approving `gate` for the session allows, from the gate object's `session_grant`."""
    grant = gate.session_grant
    if grant:
        return f"{grant} (until restart)"
    # Why, in the terms of the call: a database call is described by its tables, and one that is
    # not (none named, or it acts beyond them) could be anything; any other tool's calls differ by
    # their arguments (QA: "tables" said nothing about a system-prompt edit).
    why = ("it is not described by its tables alone" if gate.tool_type == "db"
           else "what it does depends on its arguments")
    return f"approves this call only ({why}, so no later call is covered)"


def session_grant_brief(gate: GateInfo) -> str:
    """The same, short enough for an inbox row, what matters first: "only INSERT on exactly t",
    "write_note write calls", "this call only"."""
    grant = gate.session_grant
    if not grant:
        return "this call only"
    grant = grant.removesuffix(" pass without asking")
    _, run, kinds = grant.partition(" that run ")
    if run:
        return kinds
    return grant.removeprefix("later ").replace(" calls of this session", " calls")


def _plain(prompt: Any) -> str:
    plain = getattr(prompt, "plain", None)
    return plain if isinstance(plain, str) else str(prompt)
