"""The command palette: every console action, the focused pane's first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.markup import escape

from aiops.tui.keys import KEYS, PANES, display_keys, keys_of

if TYPE_CHECKING:
    from textual.widget import Widget

# Palette-only actions (no key): (pane, title, help, app action)
EXTRA: tuple[tuple[str, str, str, str], ...] = (
    ("global", "Show gates inbox", "Show the gates inbox in the side pane", "show_pane('gates')"),
    ("global", "Show prompt tree", "Show the system-prompt tree in the side pane", "show_pane('prompt')"),
    ("global", "Show rate limits", "Show rate-limit usage in the side pane", "show_pane('limits')"),
    ("global", "Show log", "Show the log viewer in the side pane", "show_pane('log')"),
    ("global", "Show sessions", "Show the sessions pane", "show_pane('sessions')"),
    ("global", "Check models again", "Probe every enabled model and update the header warning",
     "check_models"),
)


@dataclass(frozen=True)
class PaletteEntry:
    pane: str
    title: str
    help: str
    run: Callable[[], Any]


def palette_help(tooltip: str, keys: str | None = None) -> str:
    """An entry's help line: its tooltip, then the keys in effect for it, if any, in brackets.
    Textual reads a hit's help as markup, where `[i]`, `[f1]`, `[enter]` or `[s]` are style tags
    (and vanished): escaped, every entry shows its keys the same way."""
    text = f"{tooltip}  [{display_keys(keys)}]" if keys else tooltip
    return escape(text)


def focused_pane(widget: Widget | None) -> str:
    node: Any = widget
    while node is not None:
        pane = getattr(node, "PANE", None)
        if isinstance(pane, str):
            return pane
        node = node.parent
    return "global"


class ConsoleCommands(Provider):
    """The console's only palette provider, so that its order is the order shown."""

    def _entries(self) -> list[PaletteEntry]:
        app: Any = self.app
        keymap = getattr(app, "keymap_overrides", {})
        focused = focused_pane(self.focused)
        entries: list[PaletteEntry] = []
        for k in KEYS:
            if not k.palette:
                continue
            target = app.pane_target(k.pane)
            if target is None:
                continue
            title = f"{PANES[k.pane]}: {k.description}" if k.pane != "global" else k.description
            entries.append(PaletteEntry(k.pane, title, palette_help(k.tooltip, keys_of(k, keymap)),
                                        partial(app.run_palette_action, k.action, target)))
        for pane, title, help_text, action in EXTRA:
            entries.append(PaletteEntry(pane, title, palette_help(help_text),
                                        partial(app.run_palette_action, action, app)))
        order = [focused, *(p for p in PANES if p != focused)]
        entries.sort(key=lambda e: order.index(e.pane) if e.pane in order else len(order))
        # Textual's own (theme, keys panel, screenshot, …) come last.
        for cmd in app.get_system_commands(self.screen):
            if cmd.title not in ("Quit",):
                entries.append(PaletteEntry("textual", cmd.title, cmd.help, cmd.callback))
        return entries

    async def discover(self) -> Hits:
        for e in self._entries():
            yield DiscoveryHit(e.title, e.run, help=e.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        focused = focused_pane(self.focused)
        for e in self._entries():
            score = matcher.match(e.title)
            if score > 0:
                # Actions of the focused pane rank above equally good matches elsewhere.
                yield Hit(score + (0.5 if e.pane == focused else 0), matcher.highlight(e.title), e.run,
                          help=e.help)
