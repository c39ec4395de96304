"""Two habits of Textual 8 that leave reference cycles at every frame, broken where they form.

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

`install()` wraps the three so that what they return is the same and nothing refers to itself:
the map is handed back as a copy and the closure's own emptied, the strip returned without being
cached in itself. tests/tui/test_cycles.py checks that a frame leaves no such garbage (so a Textual
upgrade that changes these methods shows there) and that the screen is drawn as before. Textual
stays pinned `<9` in pyproject.toml.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from rich.style import Style
from textual._compositor import Compositor
from textual.strip import Strip

# Textual's own methods, as they were before `install` (tests compare against them).
TEXTUAL: dict[str, Any] = {}


@functools.cache  # once a process
def install() -> None:
    """Idempotent; the console calls it before its first frame."""

    arrange_root = TEXTUAL["arrange_root"] = Compositor._arrange_root
    divide = TEXTUAL["divide"] = Strip.divide
    crop_extend = TEXTUAL["crop_extend"] = Strip.crop_extend

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

    Compositor._arrange_root = _arrange_root  # type: ignore[method-assign]
    Strip.divide = _divide  # type: ignore[method-assign]
    Strip.crop_extend = _crop_extend  # type: ignore[method-assign]
