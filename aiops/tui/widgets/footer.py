"""The key bar: what the focused pane's keys do, then the global ones, as many as fit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual import events
from textual.actions import parse
from textual.binding import ActiveBinding, Binding
from textual.widget import Widget

from aiops.tui.keys import KEYS, keys_of

if TYPE_CHECKING:
    from textual.screen import Screen

# Global keys in the order the bar offers them (keys.py lists the essentials first).
_RANK = {spec.id: i for i, spec in enumerate(KEYS)}
_PALETTE_ACTIONS = ("command_palette", "app.command_palette")
# A key as the bar shows it: key, display, description, action, disabled, tooltip, is the palette's.
_Key = tuple[str, str, str, str, bool, str, bool]


class ConsoleFooter(Widget, can_focus=False):
    """The key bar, drawn as one line. Every screen has its own (the main screen and each modal),
    and shows the keys that work there.

    It looks and clicks as Textual's compact Footer does, with an order and a width budget: the
    focused pane's keys come first, the global ones follow in the registry's order, a key that
    does not fit is left out whole (F1 and the palette list everything), and the palette key sits
    at the right edge once, under whatever key the keymap gives it. (Textual lists keys in binding
    order, which a keymap override changes, and lets the bar run off the right edge, cutting a
    label mid-word.)

    One widget, not a widget per key as Textual's Footer has: a focus move gives the bar other
    keys, and keys of other widths laid the whole screen out again (10-15 ms a frame, two focus
    moves per gate round, docs/PERFORMANCE.md). Drawn as one line, new keys are a repaint of it.
    """

    ALLOW_SELECT = False
    COMPONENT_CLASSES = {
        "console-footer--key", "console-footer--description", "console-footer--item",
        "console-footer--hover", "console-footer--separator",
    }
    # The colours and spacing of Textual's compact Footer and FooterKey (Textual 8.2.8).
    DEFAULT_CSS = """
    ConsoleFooter {
        dock: bottom;
        height: 1;
        color: $footer-foreground;
        background: $footer-background;
        .console-footer--item { background: $footer-item-background; }
        .console-footer--key {
            color: $footer-key-foreground;
            background: $footer-key-background;
            text-style: bold;
        }
        .console-footer--description {
            color: $footer-description-foreground;
            background: $footer-description-background;
        }
        .console-footer--hover { background: $block-hover-background; }
        .console-footer--separator { color: $foreground 20%; }
    }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        # The screen has told us its bindings once: before that there is nothing true to show.
        self._bindings_known = False
        self._shown: list[_Key] | None = None  # the keys shown
        self._spans: list[tuple[int, int, _Key]] = []  # where each key is drawn: [start, end) columns
        self._placed_for = -1  # the width `_spans` was worked out for
        self._hover: int | None = None  # the key under the mouse, by its place in `_spans`
        self._mouse_x: int | None = None  # where the mouse is over the bar (None: elsewhere)

    @staticmethod
    def _width(display: str, description: str) -> int:
        # Compact style: "key description" and one cell of margin.
        return cell_len(display) + (1 + cell_len(description) if description else 0) + 1

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self.bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def bindings_changed(self, screen: Screen) -> None:
        self._bindings_known = True
        # Screens ask on every change that might matter (the input asks at each keypress, for its
        # completion key): the same keys in the same state have nothing to redraw.
        if self._shown is not None and self.is_attached and screen is self.screen \
                and self._plan() == self._shown:
            return
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen:
            # As Textual's Footer does: the bindings are read once the change has settled.
            self.call_after_refresh(self._show_keys)

    def _plan(self) -> list[_Key]:
        """The keys the bar shows now: the focused pane's, then the global ones that fit, then
        the palette's at the right edge."""
        active = self._active()
        palette: ActiveBinding | None = next(
            (a for a in active if a.binding.action in _PALETTE_ACTIONS), None)
        pane: list[ActiveBinding] = []
        everywhere: list[ActiveBinding] = []
        actions: set[str] = set()
        for a in active:
            if not a.binding.show or a.binding.action in actions or a is palette:
                continue
            actions.add(a.binding.action)
            (everywhere if a.node is self.app else pane).append(a)
        everywhere.sort(key=lambda a: _RANK.get(a.binding.id or "", len(_RANK)))
        width = self.size.width or self.app.size.width
        room = width
        if palette is not None:
            room -= self._width(self.app.get_key_display(palette.binding), palette.binding.description)
        plan: list[_Key] = []
        for a in [*pane, *everywhere]:
            b = a.binding
            display = self.app.get_key_display(b)
            need = self._width(display, b.description)
            if need > room:
                continue
            room -= need
            plan.append((b.key, display, b.description, b.action, not a.enabled, a.tooltip or b.description, False))
        if palette is not None:
            b = palette.binding
            plan.append((b.key, self.app.get_key_display(b), b.description, b.action, not palette.enabled,
                         b.tooltip or b.description, True))
        return plan

    def _show_keys(self) -> None:
        if not self.is_attached or not self._bindings_known:
            return
        plan = self._plan()
        if plan == self._shown:
            return
        self._shown = plan
        self._place_keys()
        self.refresh()

    def _place_keys(self) -> None:
        """Where each key goes: the pane's and the global ones from the left, one cell apart, the
        palette's at the right edge after a thin bar (part of its key, as its border was) with the
        cell of margin every key has; the bar may take the last key's margin (`_plan` leaves room
        for the rest). The key under a still mouse is then the one drawn there now."""
        spans: list[tuple[int, int, _Key]] = []
        x = 0
        for k in self._shown or []:
            need = self._width(k[1], k[2]) - 1
            if k[6]:
                at = max(0, self.size.width - need - 2)
                spans.append((at, at + 1 + need, k))
            else:
                spans.append((x, x + need, k))
                x += need + 1
        self._spans, self._placed_for = spans, self.size.width
        self._set_hover(self._key_at(self._mouse_x) if self._mouse_x is not None else None, force=True)

    def render(self) -> Text:
        if self._placed_for != self.size.width:
            self._place_keys()
        key_style = self.get_component_rich_style("console-footer--key")
        description_style = self.get_component_rich_style("console-footer--description")
        item_style = self.get_component_rich_style("console-footer--item")
        # Hovered, a key takes the hover background, as FooterKey's `:hover` gives it (its text
        # keeps its colours).
        hover = Style(bgcolor=self.get_component_rich_style("console-footer--hover").bgcolor)
        dim = Style(dim=True)
        line = Text(no_wrap=True, overflow="crop", end="")
        for i, (start, _, k) in enumerate(self._spans):
            _, display, description, _, disabled, _, is_palette = k
            text = Text.assemble(("▏", self.get_component_rich_style("console-footer--separator"))
                                 if is_palette else "", (display, key_style),
                                 (" " + description, description_style) if description else "")
            text.stylize_before(item_style + (dim if disabled else Style()))
            if i == self._hover:
                text.stylize(hover)
            line.truncate(start, pad=True)
            line.append_text(text)
        return line

    def _key_at(self, x: int) -> int | None:
        return next((i for i, (start, end, _) in enumerate(self._spans) if start <= x < end), None)

    def _set_hover(self, index: int | None, force: bool = False) -> None:
        if index == self._hover and not force:
            return
        if index != self._hover:
            self.refresh()
        self._hover = index
        self.tooltip = (self._spans[index][2][5] or None) if index is not None else None
        # A hand over a key, as FooterKey's `:hover` gives it (terminals with pointer shapes, OSC
        # 22). One widget draws every key, so the shape follows the key under the mouse, not a
        # pseudo-class. The screen reads it before this widget sees the move: setting it (to
        # "default" too: clearing the rule would not) asks the screen to read it again, and the
        # terminal hears only a change.
        self.styles.pointer = "pointer" if index is not None else "default"

    def on_mouse_move(self, event: events.MouseMove) -> None:
        self._mouse_x = event.x
        self._set_hover(self._key_at(event.x))

    def on_leave(self, event: events.Leave) -> None:
        self._mouse_x = None
        self._set_hover(None)

    def on_mouse_down(self, event: events.MouseDown) -> None:
        index = self._key_at(event.x)
        if index is None:
            return
        key, _, _, _, disabled, _, _ = self._spans[index][2]
        if disabled:
            self.app.bell()
        else:
            self.app.simulate_key(key)

    def _active(self) -> list[ActiveBinding]:
        """The bindings that work on this footer's screen.

        On a modal screen Textual's `active_bindings` stops at the modal, yet the App's priority
        bindings (quit, the palette: the ones the App's `check_action` leaves enabled there) still
        fire; they are listed too, from the key registry under the user's keymap, so the bar shows
        every key that works and no other.
        """
        screen = self.screen
        found = screen.active_bindings
        active = list(found.values())
        if not screen.is_modal:
            return active
        app = self.app
        keymap: Mapping[str, str] = getattr(app, "keymap_overrides", {})
        keys = set(found)
        for spec in KEYS:
            if spec.pane != "global" or not spec.priority:
                continue
            _, name, params = parse(spec.action)
            state = app.check_action(name, params)
            if state is False:
                continue
            base = spec.binding()
            for key in (k.strip() for k in keys_of(spec, keymap).split(",")):
                if key and key not in keys:
                    keys.add(key)
                    binding = Binding(key, base.action, base.description, show=base.show,
                                      priority=True, tooltip=base.tooltip, id=base.id)
                    active.append(ActiveBinding(app, binding, bool(state), binding.tooltip))
        return active

    def on_resize(self, event: events.Resize) -> None:
        # Fewer or more keys fit; the palette's key moves with the right edge (a repaint).
        if self._bindings_known:
            self.call_after_refresh(self._show_keys)
