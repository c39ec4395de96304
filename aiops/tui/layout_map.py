"""A layout's map of every widget, kept for the lookups that follow it.

Textual's compositor keeps two maps: the visible widgets, and every widget (`full_map`, built on
demand when a widget off screen is looked up). `Compositor.reflow`, the layout of the screen, builds
the full map itself, but leaves the flag that says it is stale as it found it; and
`update_widgets`, at the start of each layout, sets that flag whenever a widget to repaint is not
visible — a block just mounted, a block scrolled away. Then the first lookup of an off-screen widget
in that layout (the widgets whose size changed ask for their own region as they are marked to
repaint) arranged the whole screen a second time: in a streamed answer's layouts, more than half of
them, ~4 ms of a 15-20 ms layout of a 60-block answer on a 2-core machine, ~10 ms at the tail
(docs/PERFORMANCE.md, issue 27).

`install()` wraps `reflow` so that the map it built is the full map until Textual flags it stale
again: a scroll's `reflow_visible`, or the next layout's `update_widgets`. Between a layout and the
next, a widget mounted or removed meanwhile is looked up in the last layout's map, as Textual
already does whenever its flag happens to be clear (a new widget's region is empty until then).
"""

from __future__ import annotations

import functools
from typing import Any

from textual._compositor import Compositor

TEXTUAL: dict[str, Any] = {}


@functools.cache  # once a process
def install() -> None:
    """Idempotent; the console calls it before its first frame."""
    reflow = TEXTUAL["reflow"] = Compositor.reflow

    def _reflow(self: Compositor, parent: Any, size: Any) -> Any:
        result = reflow(self, parent, size)
        # `reflow` arranged every widget (`visible_only=False`) and made that `_full_map`.
        self._full_map_invalidated = False
        return result

    Compositor.reflow = _reflow  # type: ignore[method-assign]
