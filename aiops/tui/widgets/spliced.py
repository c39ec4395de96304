"""`SplicedOptionList`: an OptionList whose options can be replaced in place, without the whole
list measured and drawn again, nor the screen laid out again for its new height."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, cast

from rich.segment import Segment
from rich.style import Style as RichStyle
from textual.geometry import Size
from textual.reactive import Reactive
from textual.strip import Strip
from textual.widgets import OptionList

if TYPE_CHECKING:
    from textual.css.styles import RulesMap
    from textual.widgets.option_list import Option


class SplicedOptionList(OptionList):
    """`splice_options(new)` does what `set_options(new)` does, for a list whose options are kept
    as objects across changes (the same `Option` for the same thing): only the options from the
    first that differs to the last are replaced, OptionList's lines are shifted rather than
    measured again, and the drawings of options that only moved are kept (given their new index).
    The line at the top of the view stays there (unless its option goes), so options coming or
    going above or below do not move what the operator is looking at; the cursor stays on its
    option. OptionList's private lists and caches, checked against Textual 8.2.8."""

    # Widget declares `virtual_size` a layout reactive: every option that came or went laid the
    # whole screen out again for the list's new height. Only the scrollbars depend on it, and those
    # are layout reactives of their own, set by `_scroll_update` when it changes (as in GatesInbox).
    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)

    def splice_options(self, new: list[Option], redraw: Collection[str] = ()) -> bool:
        """Show `new`, drawing again the options whose ids are in `redraw` (they show something
        new); False, and nothing done, while the list is not shown (it has no width) or has not
        measured its options yet: `set_options` then."""
        cache = self._line_cache
        old = self._options
        if not self.scrollable_content_region or not cache.lines or cache.lines[-1][0] != len(old) - 1:
            return False
        lo, end = 0, min(len(old), len(new))
        while lo < end and old[lo] is new[lo]:
            lo += 1
        same = 0  # options alike at the end
        while same < end - lo and old[-1 - same] is new[-1 - same]:
            same += 1
        old_hi, new_hi = len(old) - same, len(new) - same  # [lo, hi) replaced
        lines = cache.lines
        first = cache.index_to_line[lo] if lo < len(old) else len(lines)
        after = cache.index_to_line[old_hi] if old_hi < len(old) else len(lines)
        width = self.scrollable_content_region.width - self._get_left_gutter_width()
        padding = self.get_component_styles("option-list--option").padding.width
        rules = cast("RulesMap", self.styles)  # as OptionList measures its options
        mid: list[tuple[int, int]] = []
        heights: dict[int, int] = {}
        index_to_line: dict[int, int] = {}
        for index in range(lo, new_hi):
            option = new[index]
            index_to_line[index] = first + len(mid)
            heights[index] = height = self._get_visual(option).get_height(rules, width - padding)
            mid.extend((index, line) for line in range(height))
        shift, moved = new_hi - old_hi, first + len(mid) - after
        highlighted = self.highlighted_option
        top = self.scroll_offset.y
        anchor = (old[lines[top][0]], lines[top][1]) if top < len(lines) else None
        scrollbar = self.show_vertical_scrollbar
        self._options = new
        self._option_to_index = {option: i for i, option in enumerate(new)}
        for option in old[lo:old_hi]:
            if option.id is not None and self._id_to_option.get(option.id) is option:
                del self._id_to_option[option.id]
        self._id_to_option.update((option.id, option) for option in new[lo:new_hi] if option.id is not None)
        cache.lines = lines[:first] + mid + [(i + shift, line) for i, line in lines[after:]]
        cache.heights = {i: h for i, h in cache.heights.items() if i < lo} | heights | {
            i + shift: h for i, h in cache.heights.items() if i >= old_hi}
        cache.index_to_line = {i: y for i, y in cache.index_to_line.items() if i < lo} | index_to_line | {
            i + shift: y + moved for i, y in cache.index_to_line.items() if i >= old_hi}
        # Every option's drawing carries its index (for the mouse): those that moved are given
        # theirs anew rather than drawn again (a session's row drawn from its data costs ~0.4 ms).
        drawings = self._option_render_cache
        for key in list(drawings.keys()):
            at = self._option_to_index.get(key[0])
            if at is None or key[0].id in redraw:  # gone, or showing something new
                drawings.discard(key)
            elif at >= lo and (strips := drawings.get(key)) is not None:
                # After the segments' own styles, so that the new index wins over the old one.
                meta = RichStyle.from_meta({"option": at})
                drawings.discard(key)  # (`set` leaves a key it holds as it is)
                drawings[key] = [Strip(Segment.apply_style(strip, post_style=meta), strip.cell_length)
                                 for strip in strips]
        self._update_lines()  # the list's new height (a repaint: `virtual_size`), the scrollbar's
        if self.show_vertical_scrollbar != scrollbar:
            # The options' width changes with it, and drawings are kept whatever their width.
            drawings.clear()
        at = self._option_to_index.get(anchor[0]) if anchor is not None else None
        view = cache.index_to_line[at] + anchor[1] if at is not None and anchor is not None else (
            top + moved if first < top else top)
        if view != top:
            self.scroll_to(y=view, animate=False, immediate=True)
        self.highlighted = self._option_to_index.get(highlighted) if highlighted is not None else None
        self.refresh()
        return True
