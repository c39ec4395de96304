"""The key bar: what the focused pane's keys do, then the global ones, as many as fit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from textual import events
from textual.actions import parse
from textual.binding import ActiveBinding, Binding
from textual.widgets import Footer

# Private: Textual has no public module for the key widget its Footer draws and styles (checked
# against Textual 8.2.8); drawing our own would lose the Footer's look and click handling.
from textual.widgets._footer import FooterKey

from aiops.tui.keys import KEYS, keys_of

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.screen import Screen

# Global keys in the order the bar offers them (keys.py lists the essentials first).
_RANK = {spec.id: i for i, spec in enumerate(KEYS)}
_PALETTE_ACTIONS = ("command_palette", "app.command_palette")
# A key as the bar shows it: key, display, description, action, disabled, tooltip, is the palette's.
_Key = tuple[str, str, str, str, bool, str, bool]


class ConsoleFooter(Footer):
    """Textual's Footer, with an order and a width budget. Every screen has its own (the main screen
    and each modal), and shows the keys that work there.

    Textual lists keys in binding order, which a keymap override changes (a rebound key moves to
    the end of its map), and lets the bar run off the right edge, cutting a label mid-word. Here the
    focused pane's keys come first, the global ones follow in the registry's order, a key that does
    not fit is left out whole (F1 and the palette list everything), and the palette key sits at the
    right edge once, under whatever key the keymap gives it.
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(compact=True, **kw)
        self._laid_out_for = 0
        # The screen has told us its bindings once: before that there is nothing true to show.
        self._bindings_known = False
        self._shown: list[_Key] | None = None  # the keys shown last
        # The key widgets on the bar (shown or hidden) in order, kept here rather than queried: the
        # palette's is a child too, and is docked to the right.
        self._keys: list[FooterKey] = []
        self._palette_key: FooterKey | None = None

    @staticmethod
    def _width(display: str, description: str) -> int:
        # Compact style: "key description" and one cell of margin.
        return cell_len(display) + (1 + cell_len(description) if description else 0) + 1

    def bindings_changed(self, screen: Screen) -> None:
        self._bindings_known = True
        # Screens ask on every change that might matter (the input asks at each keypress, for its
        # completion key); recomposing mounts and styles a dozen keys each time, which was most of
        # what a keypress cost the loop. The same keys in the same state: nothing to redo.
        if self._shown is not None and self.is_attached and screen is self.screen \
                and self._plan() == self._shown:
            return
        # As Textual's Footer does, but updating the keys in place instead of recomposing: a focus
        # move between panes would otherwise remove and mount every key (and restyle and reflow
        # them), twice per gate round, garbage the console's collector then pauses to free.
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen:
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

    def compose(self) -> ComposeResult:
        # Only a recompose gets here with keys to show (the bar starts empty and _show_keys fills it).
        self._keys, self._palette_key = [], None
        if not self._bindings_known:
            return
        self._laid_out_for = self.size.width or self.app.size.width
        self._shown = plan = self._plan()
        for k in plan:
            widget = self._new_key(k)
            if k[6]:
                self._palette_key = widget
            else:
                self._keys.append(widget)
            yield widget

    @staticmethod
    def _new_key(k: _Key) -> FooterKey:
        key, display, description, action, disabled, tooltip, is_palette = k
        if is_palette:
            return FooterKey(key, display, description, action, classes="-command-palette",
                             disabled=disabled, tooltip=tooltip)
        return FooterKey(key, display, description, action, disabled=disabled,
                         tooltip=tooltip).data_bind(compact=Footer.compact)

    @classmethod
    def _set_key(cls, widget: FooterKey, k: _Key) -> None:
        """Make a shown key show another: its text, action, state and tooltip."""
        key, display, description, action, disabled, tooltip, _ = k
        resized = cls._width(display, description) != cls._width(widget.key_display, widget.description)
        drawn = (display, description) != (widget.key_display, widget.description)
        widget.key, widget.action = key, action
        widget.key_display, widget.description = display, description
        # FooterKey keeps its state in `_disabled` (read on a click) and the class (its look).
        widget._disabled = disabled
        widget.set_class(disabled, "-disabled")
        if (widget.tooltip or "") != tooltip:
            widget.tooltip = tooltip or None
        if drawn:
            # The width is cached per container width, so a new label must drop it; only a key
            # whose width changes makes the bar lay out again.
            widget.clear_cached_dimensions()
            widget.refresh(layout=resized)

    def _show_keys(self) -> None:
        """Show the planned keys on the widgets already there, mounting only the ones missing."""
        if not self.is_attached or not self._bindings_known:
            return
        self._laid_out_for = self.size.width or self.app.size.width
        plan = self._plan()
        if plan == self._shown:
            return
        self._shown = plan
        keys = [k for k in plan if not k[6]]
        palette = next((k for k in plan if k[6]), None)
        for widget, k in zip(self._keys, keys, strict=False):
            self._set_key(widget, k)
            widget.display = True
        # Keys a pane does not need are hidden, not removed: the next pane with more keys shows
        # them again, so moving between panes makes no widgets after each count was seen once.
        for widget in self._keys[len(keys):]:
            widget.display = False
        if len(keys) > len(self._keys):
            new = [self._new_key(k) for k in keys[len(self._keys):]]
            if self._keys:
                self.mount_all(new, after=self._keys[-1])
            elif self._palette_key is not None:
                self.mount_all(new, before=self._palette_key)
            else:
                self.mount_all(new)
            self._keys.extend(new)
        if palette is None and self._palette_key is not None:
            self._palette_key.remove()
            self._palette_key = None
        elif palette is not None and self._palette_key is None:
            self._palette_key = self._new_key(palette)
            self.mount(self._palette_key)
        elif palette is not None and self._palette_key is not None:
            self._set_key(self._palette_key, palette)

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
        if event.size.width != self._laid_out_for and self._bindings_known:
            self.call_after_refresh(self._show_keys)
