"""The console's frames leave no reference cycles of Textual's making (aiops/tui/cycles.py): what a
frame placed and composited is freed by reference counting, not left for the cyclic collector,
whose every run stops the console's loop. And the three wrapped methods give what Textual's own do."""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.segment import Segment
from rich.style import Style
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.map_geometry import MapGeometry
from textual.strip import Strip
from textual.widgets import Markdown, OptionList, Static

from aiops.tui import cycles

cycles.install()

TEXT = "\n\n".join(f"## Part {i}\n\nSome *text* of part {i}, long enough to wrap at least once in a pane "
                   f"of this width, and a `code` span.\n\n- one\n- two" for i in range(6))


class Panes(App[None]):
    def compose(self) -> ComposeResult:
        with VerticalScroll(id="chat"):
            yield Markdown(TEXT)
        yield OptionList(*(f"session {i}" for i in range(50)))
        yield Static("status", id="status")


@contextlib.contextmanager
def saved_garbage() -> Iterator[list[object]]:
    """What the collector finds unreachable from here on, kept (DEBUG_SAVEALL) instead of freed."""
    gc.collect()  # what was garbage before is freed first, not kept
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def test_frames_leave_no_cycles_of_maps_or_strips() -> None:
    app = Panes()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        status = app.query_one("#status", Static)
        options = app.query_one(OptionList)
        with saved_garbage() as garbage:
            for i in range(20):  # a reflow and a repaint per round, as a streaming console has
                status.update(f"status {i}")
                options.highlighted = i
                app.screen.refresh(layout=True)
                await pilot.pause()
            gc.collect()
            kinds = Counter(type(o).__name__ for o in garbage)
            # A map of the screen waiting for the collector (its geometries are tuples of ints, which
            # the collector does not list themselves: the map that holds them is what shows).
            maps = [o for o in garbage if isinstance(o, dict) and any(isinstance(v, MapGeometry) for v in o.values())]
    assert maps == [], kinds.most_common(8)
    assert kinds["Strip"] == 0, kinds.most_common(8)


segments = st.lists(
    st.tuples(st.text(alphabet="ab c✓界", min_size=0, max_size=6), st.sampled_from([None, Style(bold=True)])),
    max_size=5,
).map(lambda parts: [Segment(text, style) for text, style in parts])


@settings(max_examples=200, deadline=None)
@given(segments, st.lists(st.integers(min_value=0, max_value=30), max_size=4))
def test_divide_gives_what_textual_gives(parts: list[Segment], cuts: list[int]) -> None:
    strip = Strip(parts)
    cuts = sorted(cuts)
    expected = cycles.TEXTUAL["divide"](Strip(parts), cuts)
    assert list(strip.divide(cuts)) == list(expected)
    full = strip.divide([strip.cell_length])  # the case Textual cached in the strip itself
    assert list(full) == [strip]


@settings(max_examples=200, deadline=None)
@given(segments, st.integers(min_value=-3, max_value=30), st.integers(min_value=0, max_value=30))
def test_crop_extend_gives_what_textual_gives(parts: list[Segment], start: int, end: int) -> None:
    style = Style(italic=True)
    got = Strip(parts).crop_extend(start, end, style)
    expected = cycles.TEXTUAL["crop_extend"](Strip(parts), start, end, style)
    assert got == expected
    assert got.cell_length == expected.cell_length


def test_a_strip_cut_or_cropped_to_itself_does_not_keep_itself() -> None:
    strip = Strip([Segment("a line", Style(bold=True))])
    with saved_garbage() as garbage:
        assert strip.crop_extend(0, strip.cell_length, None) is strip
        assert list(strip.divide([strip.cell_length])) == [strip]
        del strip
        gc.collect()
        assert [o for o in garbage if isinstance(o, Strip)] == []
