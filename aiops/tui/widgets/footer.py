"""The key bar: what the focused pane's keys do, then the global ones, as many as fit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from textual import events
from textual.binding import ActiveBinding
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from aiops.tui.keys import KEYS

if TYPE_CHECKING:
    from textual.app import ComposeResult

# Global keys in the order the bar offers them (keys.py lists the essentials first).
_RANK = {spec.id: i for i, spec in enumerate(KEYS)}
_PALETTE_ACTIONS = ("command_palette", "app.command_palette")


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

    @staticmethod
    def _width(display: str, description: str) -> int:
        # Compact style: "key description" and one cell of margin.
        return cell_len(display) + (1 + cell_len(description) if description else 0) + 1

    def compose(self) -> ComposeResult:
        if not self._bindings_ready:
            return
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
        self._laid_out_for = width
        room = width
        if palette is not None:
            room -= self._width(self.app.get_key_display(palette.binding), palette.binding.description)
        for a in [*pane, *everywhere]:
            b = a.binding
            display = self.app.get_key_display(b)
            need = self._width(display, b.description)
            if need > room:
                continue
            room -= need
            yield FooterKey(b.key, display, b.description, b.action, disabled=not a.enabled,
                            tooltip=a.tooltip or b.description).data_bind(compact=Footer.compact)
        if palette is not None:
            b = palette.binding
            yield FooterKey(b.key, self.app.get_key_display(b), b.description, b.action,
                            classes="-command-palette", disabled=not palette.enabled,
                            tooltip=b.tooltip or b.description)

    def _active(self) -> list[ActiveBinding]:
        """The bindings that work on this footer's screen.

        On a modal screen Textual's `active_bindings` stops at the modal, yet the App's priority
        bindings above it (quit, the palette: the ones the App's `check_action` leaves enabled
        there) still fire; they are listed too, so the bar shows every key that works and no other.
        """
        screen = self.screen
        found = screen.active_bindings
        active = list(found.values())
        if not screen.is_modal:
            return active
        keys = set(found)
        for node, bindings in screen._binding_chain:
            if node is screen or screen in node.ancestors_with_self:
                continue  # the modal's own part of the chain: already in active_bindings
            for key, binding in bindings:
                if not binding.priority or key in keys:
                    continue
                state = self.app._check_action_state(binding.action, node)
                if state is not False:
                    keys.add(key)
                    active.append(ActiveBinding(node, binding, bool(state), binding.tooltip))
        return active

    def on_resize(self, event: events.Resize) -> None:
        if event.size.width != self._laid_out_for and self._bindings_ready:
            self.call_after_refresh(self.recompose)
