"""A frame draws each changed area of the screen apart, not the box around all of them.

Textual's partial frame (`Compositor.render_partial_update`) crops to the bounding box of every
region changed since the last frame, and renders every widget that box overlaps, each over its whole
height. One changed line at the top (the status bar's count of running turns) and one at the left
(a session's row) make that box the whole screen: the chat's every visible block, the inbox, the
side pane, the input and the key bar are rendered again for two lines of change. With fifty
sessions streaming that is most frames; with a gate round, most of its six to eight frames
(docs/PERFORMANCE.md, "2026-11-28, 08:40-09:35 UTC").

`install()` wraps it. Each widget renders only the lines that are drawn, only those where a changed
span reaches into it, and, in a container, only those where something of it shows: widgets are
rendered front to back, and a line whose every cut in a container is already taken by a widget in
front (its children) is not rendered for it (a streamed answer's layout rendered the chat's message
and its Markdown whole behind their blocks, ~60 lines a layout, ~10 % of its time). A pane's frame
repainted (a focus move lights it) is four thin regions that make one area the pane's size, and the
widgets inside it, which none of them touches, are not rendered at all. And when the changed regions
fall in areas apart (no two touching) that leave most of their bounding box unchanged, each area is
rendered as a crop of its own and the pieces are put together, a cut of a line taken only from the
area it lies in (there, every widget that overlaps it was rendered, so what is in front is in
front). What reaches the terminal is the same spans as before; one area, or areas that fill their
box, are rendered in one crop around all, as Textual's own path (with the narrower rendering).
tests/tui/test_crops.py keeps a model terminal updated by these frames and checks it against
Textual's own full render of the screen, with a widget layered over others and scrolled panes whose
blocks are cut off at their edges.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.strip import Strip

TEXTUAL: dict[str, Any] = {}


def areas(regions: Iterable[Region]) -> list[Region]:
    """The regions gathered into boxes that neither overlap nor touch one another."""
    boxes: list[Region] = []
    for region in regions:
        box = region
        while True:
            grown = box.grow((1, 1, 1, 1))
            near = next((b for b in boxes if grown.overlaps(b)), None)
            if near is None:
                break
            boxes.remove(near)
            box = box.union(near)
        boxes.append(box)
    return boxes


def apart(regions: Iterable[Region]) -> list[Region]:
    """The areas to render apart: `areas(regions)` when there are several and they leave most of
    their bounding box unchanged; else none (one crop around all is as cheap)."""
    boxes = areas(regions)
    if len(boxes) < 2 or 2 * sum(box.area for box in boxes) >= Region.from_union(boxes).area:
        return []
    return boxes


def _runs(lines: Sequence[int], gap: int = 4) -> list[tuple[int, int]]:
    """Sorted lines as (first, end) runs, a run going on over gaps of up to `gap` lines: the
    lines between come from the widget's cache or are rendered, cheaper than Textual's fixed cost
    of one more call."""
    runs: list[tuple[int, int]] = []
    for y in lines:
        if runs and y - runs[-1][1] < gap:
            runs[-1] = (runs[-1][0], y + 1)
        else:
            runs.append((y, y + 1))
    return runs


@functools.cache  # once a process
def install() -> None:
    """Idempotent; the console calls it before its first frame."""
    TEXTUAL["render_partial_update"] = Compositor.render_partial_update
    TEXTUAL["_render_chops"] = Compositor._render_chops

    def _render_chops(
        self: Compositor, crop: Region, is_rendered_line: Callable[[int], bool],
        spans: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    ) -> Sequence[Mapping[int, Strip]]:
        # Textual's, but each widget renders only the lines that will be drawn, not its whole
        # visible height (its other lines stay as they are in its cache, or dirty there); and, given
        # the spans that will be drawn (x from, x to, per line), only the lines where one of them
        # reaches into it: a pane's frame repainted is four thin regions around its widgets, whose
        # cells in between are not drawn.
        cuts = self.cuts
        chops: list[dict[int, Strip | None]] = [dict.fromkeys(cut_set[:-1]) for cut_set in cuts]
        lines = [y for y in crop.line_range if is_rendered_line(y)]
        if not lines:
            return cast("Sequence[Mapping[int, Strip]]", chops)
        crop_overlaps = crop.overlaps
        for widget, (region, clip) in self.visible_widgets.items():
            if not crop_overlaps(clip):
                continue
            x, top, width, height = region.intersection(clip)
            if not (width and height):
                continue
            first_cut, last_cut = x, x + width
            drawn = [y for y in lines if top <= y < top + height]
            if spans is not None:
                drawn = [y for y in drawn if any(x1 < last_cut and x2 > first_cut for x1, x2 in spans[y])]
            if widget.children:
                # Front to back: a line whose every cut in this container's span is taken by a
                # widget in front (its children) shows nothing of it. Only containers, and the
                # first cut first (a framed pane's shows on every line): the look is the cost of
                # every frame, which a key's frame did not make back.
                drawn = [y for y in drawn if chops[y].get(first_cut) is None
                         or any(chops[y][cut] is None for cut in cuts[y] if first_cut < cut < last_cut)]
            for lo, hi in _runs(drawn):
                strips = widget.render_lines(Region(x - region.x, lo - region.y, width, hi - lo))
                for y, strip in zip(range(lo, hi), strips, strict=False):
                    if is_rendered_line(y):
                        chops_line = chops[y]
                        final_cuts = [cut for cut in cuts[y] if last_cut >= cut >= first_cut]
                        pieces = strip.divide([cut - x for cut in final_cuts[1:]])
                        for cut, piece in zip(final_cuts, pieces, strict=False):  # the last cut is its end
                            if chops_line.get(cut) is None:
                                chops_line[cut] = piece
        return cast("Sequence[Mapping[int, Strip]]", chops)  # as Textual's: None where nothing was drawn

    def render_partial_update(self: Compositor) -> ChopsUpdate | None:
        if not self._dirty_regions:
            return None
        screen = self.size.region
        regions = self._dirty_regions.copy()
        self._dirty_regions.clear()
        spans = list(self._regions_to_spans(regions))
        by_line: dict[int, list[tuple[int, int]]] = {}
        for y, x1, x2 in spans:
            by_line.setdefault(y, []).append((x1, x2))
        cuts = self.cuts
        chop_ends = [cut_set[1:] for cut_set in cuts]
        boxes = apart(regions)
        if not boxes:  # one crop around all, as Textual's own (with the narrower rendering)
            crop = Region.from_union(list(regions)).intersection(screen)
            return ChopsUpdate(_render_chops(self, crop, by_line.__contains__, by_line), spans, chop_ends)
        chops: list[dict[int, Strip | None]] = [dict.fromkeys(cut_set[:-1]) for cut_set in cuts]
        for box in boxes:
            crop = box.intersection(screen)
            if not crop:
                continue
            left, right = crop.x, crop.right
            # The lines with a change inside this area (not those whose changes lie in another).
            lines = {y for y, x1, x2 in spans if crop.y <= y < crop.bottom and x1 < right and x2 > left}
            part = _render_chops(self, crop, lines.__contains__, by_line)
            for y in lines:
                line = chops[y]
                for (cut, strip), end in zip(part[y].items(), chop_ends[y], strict=True):
                    # Only the cuts this crop overlaps: beyond it, a widget in front of this one
                    # may not have been rendered in this crop.
                    if strip is not None and cut < right and end > left:
                        line[cut] = strip
        return ChopsUpdate(chops, spans, chop_ends)

    Compositor.render_partial_update = render_partial_update  # type: ignore[method-assign]
    Compositor._render_chops = _render_chops  # type: ignore[method-assign]

