"""The main screen: sessions | chat + input | side pane (gates, prompt tree, rate limits, log).

Below `NARROW_WIDTH` columns (80×24 over SSH) the same widgets are shown one at a time, chosen
with a tab bar (or F6), so nothing is lost on a small terminal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.color import Color
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.geometry import Region
from textual.reactive import Reactive, reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static, TabbedContent, TabPane, Tabs

from aiops.tui.widgets.chat import ChatView
from aiops.tui.widgets.chat_input import ChatInput
from aiops.tui.widgets.footer import ConsoleFooter
from aiops.tui.widgets.gates import GatesInbox
from aiops.tui.widgets.limits import LimitsTable
from aiops.tui.widgets.log import LogView
from aiops.tui.widgets.prompt_tree import PromptPane
from aiops.tui.widgets.sessions import SessionsList
from aiops.tui.widgets.status import StatusBar
from aiops.tui.widgets.tab_fit import FittedTabs, TabFit, TabLabel

log = logging.getLogger(__name__)

NARROW_WIDTH = 100
SHORT_HEIGHT = 32
SIDE_TABS = ("gates", "prompt", "limits", "log")
VIEWS = ("chat", "sessions", *SIDE_TABS)
MIN_WIDTH, MAX_WIDTH = 16, 90
"""The least and most columns of the sessions and side panes (frames included), wherever they fit."""
SIDE_MIN_WIDTH = 20
"""The side pane's least width: its four tabs at their narrowest ("Ga… 0 Pr… Li… Log", a cell apart:
widgets/tab_fit.py) in the frame. Narrower, a tab was cut off the bar, neither seen nor clickable."""
# The panes whose frame turns $accent while the focus is in them (app.tcss draws them unfocused).
FRAMED = ("#sessions-pane", "#chat", "#side")
EDGES = ("border_top", "border_right", "border_bottom", "border_left")


def _light_frame(pane: Widget, color: Color | None) -> None:
    """Draw `pane`'s frame and title in `color` (None: as app.tcss draws them), repainting the frame.

    The rules are set, not the style properties: the frame's setter repaints the whole pane (for the
    side pane a third of the screen, ~20 ms a frame on a slow machine, twice per gate round) and
    the title colour's every descendant (colours inherit; a title's does not), the hidden tabs'
    among them, which throws away the compositor's map of all widgets. Only the frame's cells
    change, so only they are repainted."""
    styles = pane.styles
    for edge in EDGES:
        if color is None:
            styles.clear_rule(edge)
        else:
            styles.set_rule(edge, ("round", color))
    if color is None:
        styles.clear_rule("border_title_color")
        styles.clear_rule("auto_border_title_color")
    else:
        styles.set_rule("border_title_color", color)
        # (The CSS declaration sets this too: TabbedContent's own CSS has an auto colour.)
        styles.set_rule("auto_border_title_color", False)
    # The regions are the widget's, offset by its gutter (`Widget.refresh` takes content regions).
    width, height = pane.outer_size
    gutter_x, gutter_y = pane.content_offset
    pane.refresh(*(Region(x - gutter_x, y - gutter_y, w, h) for x, y, w, h in (
        (0, 0, width, 1), (0, height - 1, width, 1), (0, 0, 1, height), (width - 1, 0, 1, height))))


class SidePane(TabbedContent):
    """The side pane's tabs. A pane's widget taking focus shows its tab (as in TabbedContent) only
    while it still has focus: a focus that a quicker tab switch overtook must not switch back.

    The tab bar's labels are fitted to the pane's width (widgets/tab_fit.py): narrowed, the pane
    keeps every tab whole in sight. `fitted.labels` holds each pane's full label, by pane id."""

    def __init__(self, *, id: str, initial: str) -> None:
        super().__init__(id=id, initial=initial)
        self.fitted = TabFit({f"tab-{v}": side_label(v, 0) for v in SIDE_TABS})
        self._bar: Tabs | None = None

    def bar(self) -> Tabs | None:
        """The pane's own tab bar (None until mounted)."""
        if self._bar is None:
            self._bar = next((child for child in self.children if isinstance(child, Tabs)), None)
        return self._bar

    def set_label(self, pane_id: str, label: TabLabel) -> None:
        self.fitted.set(pane_id, label, self.bar(), self.get_tab)

    def on_resize(self) -> None:
        bar = self.bar()
        if bar is not None:
            self.fitted.fit(bar, self.get_tab)

    def _on_tab_pane_focused(self, event: TabPane.Focused) -> None:
        event.prevent_default()  # the base class handler runs only through the call below
        focused = self.screen.focused
        if focused is None or event.tab_pane not in focused.ancestors_with_self:
            event.stop()
            return
        super()._on_tab_pane_focused(event)


def side_label(view: str, gates: int) -> TabLabel:
    """A view's tab label. The Gates tab always carries the count, "(0)" included, so that a gate
    coming or going keeps the label's width (see `tab_fit.relabel`)."""
    return TabLabel("Gates", gates) if view == "gates" else TabLabel(view.capitalize())


class MainScreen(Screen[None]):
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_WIDTH, "-wide")]
    # A short terminal (80×24) keeps the model warning to three lines (app.tcss).
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT_HEIGHT, "-tall")]

    view: reactive[str] = reactive("chat")
    """On a narrow terminal: the one pane shown."""

    # Screen declares `focused` a repaint reactive: every focus move asked for the whole screen
    # to be rendered again (120×40: 13-30 ms a frame), though what a move changes on screen is
    # drawn by the widgets it concerns (the pseudo-classes they restyle, the panes' frames, the
    # key bar), each asking for its own repaint.
    focused: Reactive[Widget | None] = Reactive(None, repaint=False)

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        # The widths the operator chose (alt+left / alt+right). A terminal too narrow for them beside
        # the chat's least width draws the panes narrower (`fitted_widths`) and keeps these.
        self.sessions_width = 28
        self.side_width = 42
        self.narrow = False
        self._limit_said: tuple[str, float] | None = None  # the last "as wide as it goes", and when
        self._focus_target: Widget | None = None

    def compose(self) -> ComposeResult:
        sessions = SessionsList(clock=self.clock, id="sessions")
        chat = ChatView(id="chat")
        # Titles are set here, not on mount: the App may already have named the session by then.
        chat.border_title = "Chat"
        yield StatusBar(id="status")
        yield FittedTabs({f"v-{v}": side_label(v, 0) for v in VIEWS}, id="narrow-tabs")
        with Horizontal(id="main"):
            with Vertical(id="sessions-pane") as pane:
                pane.border_title = "Sessions"
                yield sessions
            with Vertical(id="center"):
                yield Static("", id="guidance")
                yield chat
                yield ChatInput(id="input")
            with SidePane(id="side", initial="tab-gates"):
                with TabPane(side_label("gates", 0).full, id="tab-gates"):
                    yield GatesInbox(sessions.short_id, clock=self.clock, id="gates")
                with TabPane("Prompt", id="tab-prompt"):
                    yield PromptPane(id="prompt")
                with TabPane("Limits", id="tab-limits"):
                    yield LimitsTable(sessions.short_id, id="limits")
                with TabPane("Log", id="tab-log"):
                    yield LogView(id="log")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        self._apply_layout(self.size.width)
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._frame_focus(self.focused))
        self.query_one(ChatInput).focus()

    # -- the focused pane's frame --

    def watch_focused(self, focused: Widget | None) -> None:
        self._frame_focus(focused)

    def _frame_focus(self, focused: Widget | None) -> None:
        """The frame of the pane holding the focus in $accent, the others as app.tcss draws them.

        Inline styles, not a `:focus-within` rule: a pseudo-class (or a class) change restyles the
        node's every descendant, and for the side pane and the chat that was tens of milliseconds
        per focus move (a jump to a gate and the return from it make two). An inline rule
        changes the frame alone."""
        if not self.is_mounted:
            return
        variables = self.app.theme_variables or self.app.get_css_variables()
        accent = Color.parse(variables["accent"])
        for selector in FRAMED:
            try:
                pane = self.query_one(selector)
            except NoMatches:
                continue
            color = accent if focused is not None and pane in focused.ancestors_with_self else None
            if pane.styles.inline.get_rule("border_title_color", None) != color:
                _light_frame(pane, color)

    def on_resize(self, event: Any) -> None:
        self._apply_layout(event.size.width)

    # -- layout --

    def _apply_layout(self, width: int) -> None:
        narrow = 0 < width < NARROW_WIDTH
        was = self.narrow
        self.narrow = narrow
        sessions = self.query_one("#sessions-pane")
        side = self.query_one("#side")
        if narrow:
            sessions.styles.width = None
            side.styles.width = None
            if not was:
                self.view = self._view_of(self.focused)
            self._apply_view()
        else:
            self._fit_panes(width)
            self._title_side()

    def _fit_panes(self, width: int | None = None) -> None:
        """Give the side panes the widths they are drawn at (not on a narrow terminal)."""
        if self.narrow:
            return
        shown_sessions, shown_side = self.fitted_widths(self.size.width if width is None else width)
        # A hidden pane keeps the width it had: its frame is not drawn, and it is fitted again when shown.
        if shown_sessions is not None:
            self.query_one("#sessions-pane").styles.width = shown_sessions
        if shown_side is not None:
            self.query_one("#side").styles.width = shown_side

    def chat_min_width(self) -> int:
        """The chat column's least width: app.tcss's `#center { min-width }`."""
        least = self.query_one("#center").styles.min_width
        return int(least.value) if least is not None and least.is_cells else 0

    def fitted_widths(self, width: int) -> tuple[int | None, int | None]:
        """The widths the sessions and side panes are drawn at beside the chat on a terminal `width`
        columns wide (None: the pane is hidden).

        The operator's widths where they fit; where they do not (a terminal narrowed since they were
        chosen, a hidden pane shown again), the wider pane gives way first, down to the other's
        width, then both alike: the chat keeps its least width and no pane is pushed off screen."""
        chosen = [None if self.has_class("-no-sessions") else self.sessions_width,
                  None if self.has_class("-no-side") else self.side_width]
        room = width - self.chat_min_width()
        shown = [w for w in chosen if w is not None]
        if width > 0 and sum(shown) > room:  # (no width yet: not laid out)
            # The largest cap that fits: min(w, cap) summed over the shown panes is the room.
            cap = room
            if len(shown) == 2:
                least = min(shown)
                cap = room - least if 2 * least <= room else room // 2
            fitted = [None if w is None else max(floor, min(w, cap))
                      for w, floor in zip(chosen, (MIN_WIDTH, SIDE_MIN_WIDTH), strict=True)]
            if len(shown) == 2 and 2 * min(shown) > room and room % 2:
                # An odd room: the column left over goes to the pane chosen wider.
                wider = 0 if (chosen[0] or 0) >= (chosen[1] or 0) else 1
                fitted[wider] = (fitted[wider] or 0) + 1
            chosen = fitted
        return chosen[0], chosen[1]

    def _apply_view(self) -> None:
        v = self.view
        self.set_class(v == "chat", "view-chat")
        self.set_class(v == "sessions", "view-sessions")
        self.set_class(v in SIDE_TABS, "view-side")
        tabs = self.query_one("#narrow-tabs", Tabs)
        if tabs.active != f"v-{v}":
            tabs.active = f"v-{v}"
        if v in SIDE_TABS:
            self.query_one("#side", TabbedContent).active = f"tab-{v}"
        self._title_side()

    def _title_side(self) -> None:
        """The side pane is framed like the others; when narrow its own tab bar is hidden (the
        screen's tab bar picks the pane), so the frame names what it shows."""
        side = self.query_one("#side", SidePane)
        if not self.narrow:
            side.border_title = None
            return
        # The full label: the tab bar's own may be one fitted to a narrower pane.
        label = side.fitted.labels.get(side.active) if side.active else None
        side.border_title = label.full if label is not None else None

    def watch_view(self) -> None:
        if self.is_mounted:
            self._apply_view()

    @on(Tabs.TabActivated, "#narrow-tabs")
    def _narrow_tab(self, event: Tabs.TabActivated) -> None:
        event.stop()
        if event.tab is None or event.tab.id is None:
            return
        view = event.tab.id.removeprefix("v-")
        if view != self.view:
            self.view = view
            self.focus_pane(view)

    def pane_widget(self, name: str) -> Widget:
        return {
            "chat": lambda: self.query_one(ChatInput),
            "input": lambda: self.query_one(ChatInput),
            "transcript": lambda: self.query_one(ChatView),
            "sessions": lambda: self.query_one(SessionsList),
            "gates": lambda: self.query_one(GatesInbox),
            "prompt": lambda: self.query_one("#prompt-sections"),
            "limits": lambda: self.query_one(LimitsTable),
            "log": lambda: self.query_one(LogView),
        }[name]()

    def _view_of(self, widget: Widget | None) -> str:
        node: Any = widget
        while node is not None and node is not self:
            pane = getattr(node, "PANE", None)
            if pane in VIEWS:
                return pane
            if pane == "input":
                return "chat"
            node = node.parent
        return "chat"

    def show_pane(self, name: str, *, focus: bool = True) -> None:
        """Make a pane visible (un-hide it, pick its tab, or switch to it when narrow)."""
        view = "chat" if name == "input" else name
        if view == "sessions":
            self.remove_class("-no-sessions")
            self._fit_panes()
        elif view in SIDE_TABS:
            self.remove_class("-no-side")
            self._fit_panes()
            self.query_one("#side", TabbedContent).active = f"tab-{view}"
        if self.narrow:
            self.view = view
        if focus:
            self.focus_pane(view)

    def return_focus(self, widget: Widget) -> None:
        """Put the focus back on `widget` now (before the next key is handled), showing its pane."""
        self._focus_target = widget  # a focus still pending from before is overtaken
        if self.narrow:
            self.view = self._view_of(widget)
        self.set_focus(widget)

    def focus_pane(self, name: str) -> None:
        """Focus a pane once it is displayed; a later request wins over one still pending."""
        widget = self.pane_widget(name)
        self._focus_target = widget
        if widget.focusable and all(node.display for node in widget.ancestors_with_self
                                    if isinstance(node, Widget)):
            # Shown already: focused now, so that a key typed next lands there. (Waiting for the
            # next refresh let it reach the pane left behind whenever nothing else was redrawn.)
            self.set_focus(widget)
            return

        def focus() -> None:
            if self._focus_target is widget:
                widget.focus()

        self.call_after_refresh(focus)

    def toggle(self, what: str) -> None:
        cls = "-no-sessions" if what == "sessions" else "-no-side"
        if self.narrow:
            self.show_pane("sessions" if what == "sessions" else self.side_tab())
            return
        hidden = not self.has_class(cls)
        self.set_class(hidden, cls)
        self._fit_panes()  # shown again: the panes share what the chat leaves (a hidden one took it all)
        if hidden:
            focused = self.focused
            if focused is not None and self._view_of(focused) != "chat":
                self.query_one(ChatInput).focus()
        else:
            self.focus_pane("sessions" if what == "sessions" else self.side_tab())

    def side_tab(self) -> str:
        active = self.query_one("#side", TabbedContent).active or "tab-gates"
        return active.removeprefix("tab-")

    def cycle_side_tab(self) -> None:
        current = self.side_tab()
        nxt = SIDE_TABS[(SIDE_TABS.index(current) + 1) % len(SIDE_TABS)] if current in SIDE_TABS else "gates"
        self.show_pane(nxt)

    def cycle_pane(self, step: int) -> None:
        if self.narrow:
            order = list(VIEWS)
            current = self.view
        else:
            # The transcript is a stop of its own after the input, so its keys (expand, think,
            # end) are reached from the keyboard, not only by Tab or the mouse.
            order = [p for p in ("sessions", "chat", "transcript", "side") if not (
                (p == "sessions" and self.has_class("-no-sessions")) or (p == "side" and self.has_class("-no-side")))]
            current = self._view_of(self.focused)
            current = "side" if current in SIDE_TABS else current
            if current == "chat" and self.focused is not None and not isinstance(self.focused, ChatInput):
                current = "transcript"
        if current not in order:
            current = order[0]
        nxt = order[(order.index(current) + step) % len(order)]
        if nxt == "transcript":
            self.focus_pane("transcript")
            return
        self.show_pane(self.side_tab() if nxt == "side" else nxt)

    def resize_pane(self, delta: int) -> None:
        """Widen (delta > 0) or narrow the focused side pane (the sessions pane while typing), as far
        as its least width, `MAX_WIDTH` and the chat's least width beside the other pane let it; a key
        that can go no further says so."""
        if self.narrow:
            self._say_limit(f"one pane at a time under {NARROW_WIDTH} columns: no pane to resize")
            return
        target = "side" if self._view_of(self.focused) in SIDE_TABS else "sessions"
        name = "side pane" if target == "side" else "sessions pane"
        width = self.size.width
        sessions, side = self.fitted_widths(width)
        current, other = (side, sessions) if target == "side" else (sessions, side)
        if current is None:  # the sessions pane hidden while typing
            self._say_limit(f"the {name} is hidden")
            return
        # From the widths drawn, not the ones chosen: a pane the terminal holds narrower than chosen
        # narrows at the first key, and the room it gives goes to the chat, not to the other pane.
        chat = self.chat_min_width()
        least = SIDE_MIN_WIDTH if target == "side" else MIN_WIDTH
        most = min(MAX_WIDTH, width - chat - (other or 0))
        new = max(least, min(most, current + delta))
        if delta > 0 and new <= current:
            self._say_limit(f"the {name} is as wide as it goes ({MAX_WIDTH} columns)" if most >= MAX_WIDTH
                            else f"the {name} is as wide as it goes: the chat keeps {chat} columns")
            return
        if delta < 0 and new >= current:
            self._say_limit(f"the {name} is as narrow as it goes ({least} columns)")
            return
        # What is drawn becomes the choice, the other pane's too (held narrower, it would take back
        # the room given up here); a key that had no effect above forgot nothing.
        if target == "side":
            self.side_width = new
            if sessions is not None:
                self.sessions_width = sessions
        else:
            self.sessions_width = new
            if side is not None:
                self.side_width = side
        self._fit_panes(width)

    def _say_limit(self, message: str) -> None:
        """A toast for a resize key that had no effect, as other keys with none say (two seconds);
        once while it shows, not a stack of them for a held key."""
        now = self.clock()
        if self._limit_said is not None and self._limit_said[0] == message and now - self._limit_said[1] < 2:
            return
        self._limit_said = (message, now)
        self.notify(message, timeout=2)

    def draw_now(self, widget: Widget) -> bool:
        """Put `widget`'s pending repaint on the terminal now, alone, instead of in the next frame.

        For a new gate's row (issue 27: on screen within 20 ms of the model's tool call). The
        next frame waits for the screen's 60 Hz update timer (up to 17 ms when a frame has just
        been drawn) and draws every widget changed meanwhile: Textual crops a frame to the
        bounding box of all its changes, so a status bar count at the top, a scrollbar at the left
        or the key bar at the bottom drawn in the same frame made it a render of every widget on
        screen (5-12 ms here, the input's TextArea and the chat's messages included). Drawn now,
        the frame is the inbox's region alone (~2 ms); the other changes stay queued for the next
        frame, which no longer has the widget's region to draw (they are put back in the screen's
        queue: Textual's own refresh empties it).

        Textual has no public call for this: it uses the compositor the way the screen's own
        update does (`update_widgets`, then `_compositor_refresh`, checked against Textual 8.2.8,
        pinned <9 in pyproject.toml). It draws nothing, and returns False, where a frame of
        Textual's own must come first: this screen is not the one shown, the terminal is behind
        (the app holds a batch), the widget waits for a layout of its own (a scrollbar came or
        went), or it is not on screen (another side tab, a hidden pane). A layout pending
        elsewhere does not stop it (it was pending at one gate in four: the sessions list's new
        order, the key bar, a toast); should that layout move the widget after all, the next
        frame redraws both its old and its new place.
        """
        app = self.app
        try:
            compositor = self._compositor
            if (not self.is_current or app._batch_count or widget._layout_required
                    or widget not in compositor.visible_widgets):
                return False
            # `_compositor_refresh` forgets every widget queued for the next frame: those other
            # than this one go back in the queue, or a repaint-only change made meanwhile (a word
            # added to the answer on screen, a count) would never reach the terminal.
            pending = self._dirty_widgets - {widget}
            compositor.update_widgets({widget})
            self._compositor_refresh()
            if pending:
                self._dirty_widgets |= pending
                self._update_timer.resume()
        except AttributeError:  # a Textual whose internals moved: its own next frame draws it
            log.debug("draw_now: Textual's compositor is not what it was", exc_info=True)
            return False
        return True

    def set_gate_count(self, count: int) -> None:
        label = side_label("gates", count)
        self.query_one(StatusBar).gates = count
        side = self.query_one("#side", SidePane)
        try:
            side.get_tab("tab-gates")
        except NoMatches:
            # A warm start can bring the engine up before the tabbed pane has mounted its tabs
            # (the console crashed there): label them once they are.
            self.call_after_refresh(self.set_gate_count, count)
            return
        side.set_label("tab-gates", label)
        self.query_one("#narrow-tabs", FittedTabs).set_label("v-gates", label)
        if self.narrow:
            self._title_side()
