"""`Settled`: the widgets of a streamed answer, whose growth costs a frame as little as it can."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from textual.geometry import Size
from textual.reactive import Reactive


class Settled:
    """A plain mixin (first in a widget's bases) for the widgets of a streamed answer.

    **A change of their virtual size repaints rather than lays out again.** Widget declares
    `virtual_size` a layout reactive, so every widget whose size a layout changed asks for one more
    layout of the whole screen straight after (a paragraph that gained a line: the paragraph, its
    Markdown, the message and the chat each did). Only scrollbars depend on the virtual size, and
    those are layout reactives of their own (as in GatesInbox).

    **Their box model is kept while the container's width is.** Textual keeps a widget's box model
    for one container *size*, height included. An answer's blocks sit in its Markdown, whose height
    grows with every line streamed, so at each draw every block of the answer missed: its box model,
    and under it every list's rows and their paragraphs, were worked out again — the whole answer at
    every frame, 0.2 ms a widget on a 2-core machine (a 60-block answer: two thirds of a 60 ms
    layout). A widget whose height is its content's (auto, with no height relative to its container
    anywhere below it, and any min or max height in cells) has a box model that does not depend on
    the container's height, so it is kept across heights; everything else it depends on is in the
    key, as in Textual's own (the widget's layout updates and its styles' version among them)."""

    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)

    _settled_box: tuple[tuple[Any, ...], Any] | None = None

    def _get_box_model(self, container: Size, viewport: Size, width_fraction: Fraction,
                       height_fraction: Fraction, constrain_width: bool = False, greedy: bool = True) -> Any:
        widget: Any = self
        key = (container.width, viewport, width_fraction, constrain_width, greedy, widget._layout_updates,
               widget.styles._cache_key)
        if self._settled_box is not None and self._settled_box[0] == key:
            return self._settled_box[1]
        model = super()._get_box_model(  # type: ignore[misc]  # the widget class after the mixin
            container, viewport, width_fraction, height_fraction, constrain_width, greedy)
        self._settled_box = (key, model) if _height_is_content(widget) else None
        return model


def _height_is_content(widget: Any) -> bool:
    styles = widget.styles
    height = styles.height
    if height is None or not height.is_auto:
        return False
    for limit in (styles.min_height, styles.max_height):
        if limit is not None and not limit.is_cells:
            return False
    return not widget._has_relative_children_height
