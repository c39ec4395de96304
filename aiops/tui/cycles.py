"""Four habits of Textual 8 that leave reference cycles at every frame, focus move or typed key,
broken where they form.

Reference counting frees an object the moment its last reference goes; only objects in a cycle
wait for Python's cyclic collector, which runs when the count of live container objects has grown
by `gc_policy.YOUNG_THRESHOLD` (50,000) and then walks every one of them, stopping the loop.
Measured in the console on 10,000 stored sessions with 50 sessions streaming (a `gc.callbacks`
probe, docs/PERFORMANCE.md), ~20,000 objects a second ended in cycles, so a young collection came
every ~1.5 s and held the loop 40-90 ms (one in ten a 140-290 ms older collection): the tail of
every keypress and gate figure. Sampled with `gc.DEBUG_SAVEALL`, nine tenths of that garbage came
from two places:

- **`Compositor._arrange_root`** places widgets with a nested function that calls itself, so the
  function, its closure cells and everything they hold form a cycle: the whole map of the screen
  (a `MapGeometry` with its regions, sizes and order tuples per widget) outlives the frame that
  made it. Half of all the garbage.
- **`Strip.divide` and `Strip.crop_extend`** keep their result in the strip's own cache, and when
  the result is the strip itself (a cut at its full width, a crop to its own size, the usual case
  when a line is composited), the strip holds itself: it and its seven caches, its segments and
  their styles wait for the collector. Most of the rest.

With those two gone, what was left (`LOOP_PROBE_GARBAGE`, 2026-11-29) came from two more:

- **`Stylesheet._process_component_classes`** styles a widget's component classes (an input's
  cursor, a list's highlighted row) through a new virtual `DOMNode` per class, each time the
  widget is styled again: at every focus move, for the widget that gains focus and the one that
  loses it. The node's styles replace the last ones, and the last node, ~50 objects in cycles (its
  node list, styles, signals, caches), waits for the collector: ~250 nodes every 5 s in a console
  answering gates, most of what filled each young collection (30,000 objects, 40-70 ms). Reusing
  the nodes changes one thing no caller relies on: a component's `RenderStyles`, and one from
  `get_component_styles` (whose node is the virtual one), follows later restyles instead of staying
  a snapshot; every use in Textual and aiops reads them at once.
- **`LRUCache.clear`** (an input's rendered lines at every edit, a list's rendered options when they
  change, a widget's box models) empties the cache's index but leaves its entries linked in a ring,
  each link holding the next and the one before: every entry, with the strips and options it holds,
  waits for the collector. Most of what was left after that.

`install()` wraps the five methods so that what they give is the same and nothing is left for the
collector: the map is handed back as a copy and the closure's own emptied, the strip returned
without being cached in itself, a widget's virtual nodes made once and styled again in place, and a
cleared cache's ring unlinked. tests/tui/test_cycles.py checks that a frame, a focus move, a typed
key and new options leave no such garbage (so a Textual upgrade that changes these methods shows
there), that the screen is drawn as before, that the component styles are Textual's own at every
step, and that a cleared cache still works as one. Textual stays pinned `<9` in pyproject.toml.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from rich.style import Style
from textual._compositor import Compositor
from textual.cache import LRUCache
from textual.css.stylesheet import Stylesheet
from textual.dom import DOMNode
from textual.strip import Strip

# Textual's own methods, as they were before `install` (tests compare against them).
TEXTUAL: dict[str, Any] = {}


@functools.cache  # once a process
def install() -> None:
    """Idempotent; the console calls it before its first frame."""

    arrange_root = TEXTUAL["arrange_root"] = Compositor._arrange_root
    divide = TEXTUAL["divide"] = Strip.divide
    crop_extend = TEXTUAL["crop_extend"] = Strip.crop_extend
    TEXTUAL["process_component_classes"] = Stylesheet._process_component_classes
    lru_clear = TEXTUAL["lru_clear"] = LRUCache.clear

    def _arrange_root(self: Compositor, root: Any, size: Any, visible_only: bool = True) -> Any:
        placed, widgets = arrange_root(self, root, size, visible_only)
        # The closure keeps `placed` and `widgets` alive in its cycle: hand back copies and empty
        # the originals, so what the frame placed is freed when the next map replaces it.
        kept_map, kept_widgets = dict(placed), set(widgets)
        placed.clear()
        widgets.clear()
        return kept_map, kept_widgets

    def _divide(self: Strip, cuts: Iterable[int]) -> Sequence[Strip]:
        cell_length = self.cell_length
        cuts = [cut for cut in cuts if cut <= cell_length]
        if len(cuts) == 1 and cuts[0] == cell_length:
            return [self]  # what Textual returns here, without keeping [self] in self's cache
        return divide(self, cuts)

    def _crop_extend(self: Strip, start: int, end: int, style: Style | None) -> Strip:
        if start <= 0 and end == self.cell_length:
            return self  # Textual's extend then crop return self here, and would cache it in self
        return crop_extend(self, start, end, style)

    def _process_component_classes(self: Stylesheet, node: DOMNode) -> None:
        # Textual's own, but with one virtual node per component class for the widget's life.
        components = node._get_component_classes()
        if not components:
            return
        virtual: dict[str, DOMNode] = node.__dict__.setdefault("_aiops_component_nodes", {})
        styled = node._component_styles  # emptied by Textual when the widget is unmounted
        changed = False
        for component in sorted(components):
            virtual_node = virtual.get(component)
            if virtual_node is None:
                virtual_node = virtual[component] = DOMNode(classes=component)
                virtual_node._attach(node)
            base = virtual_node.styles.base
            before = base.get_rules()
            # `apply` sets no rule when none matches: start from none, as a new node would (and
            # count it as an update, for what Styles caches by its count).
            base.reset()
            self.apply(virtual_node, animate=False)
            if styled.get(component) is not virtual_node.styles or base.get_rules() != before:
                changed = True
            styled[component] = virtual_node.styles
        if changed:
            node.refresh()

    def _lru_clear(self: LRUCache[Any, Any]) -> None:
        for link in self._cache.values():  # [previous, next, key, value]: nothing holds another now
            link.clear()
        lru_clear(self)

    Compositor._arrange_root = _arrange_root  # type: ignore[method-assign]
    Strip.divide = _divide  # type: ignore[method-assign]
    Strip.crop_extend = _crop_extend  # type: ignore[method-assign]
    Stylesheet._process_component_classes = _process_component_classes  # type: ignore[method-assign]
    LRUCache.clear = _lru_clear  # type: ignore[method-assign]
