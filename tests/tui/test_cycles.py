"""The console's frames, focus moves and edits leave no reference cycles of Textual's making
(aiops/tui/cycles.py): what a frame placed and composited, what styled a widget's component
classes and what a cleared cache held is freed by reference counting, not left for the cyclic
collector, whose every run stops the console's loop. And the five wrapped methods give what
Textual's own do."""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.cache import LRUCache
from textual.containers import VerticalScroll
from textual.dom import DOMNode
from textual.map_geometry import MapGeometry
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Input, Markdown, OptionList, Static, TextArea

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


class Marked(Widget, can_focus=True):
    """A component whose only rule is under :focus: blurred, it must have no rule at all again."""

    COMPONENT_CLASSES = {"marked--mark"}
    DEFAULT_CSS = """
    Marked { height: 1; }
    Marked:focus > .marked--mark { color: red; text-style: bold; }
    Marked.lit > .marked--mark { text-style: italic; }
    """

    def render(self) -> Text:
        return Text("mark", style=self.get_component_rich_style("marked--mark"))


class Focusing(App[None]):
    def compose(self) -> ComposeResult:
        yield OptionList(*(f"session {i}" for i in range(5)))
        yield TextArea("some text")
        yield Input("typed")
        yield Marked()


def _component_rules(widget: Widget) -> dict[str, dict[str, object]]:
    return {name: dict(styles.base.get_rules()) for name, styles in widget._component_styles.items()}


async def test_focus_moves_leave_no_virtual_nodes_for_the_collector() -> None:
    app = Focusing()
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        options, area = app.query_one(OptionList), app.query_one(TextArea)
        with saved_garbage() as garbage:
            for _ in range(10):  # a gate round: the inbox takes focus, then the input again
                options.focus()
                await pilot.pause()
                area.focus()
                await pilot.pause()
            gc.collect()
            kinds = Counter(type(o).__name__ for o in garbage)
            nodes = [o for o in garbage if type(o) is DOMNode]
    assert nodes == [], kinds.most_common(8)


async def test_component_styles_follow_focus_as_textual_styles_them() -> None:
    """At each focus move, each widget's component styles are what Textual's own method makes, and
    what the user sees follows: the list's highlighted row, the rule that exists only under focus."""
    app = Focusing()
    own = cycles.TEXTUAL["process_component_classes"]
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        options, marked = app.query_one(OptionList), app.query_one(Marked)
        widgets = [options, app.query_one(TextArea), app.query_one(Input), marked]
        seen: dict[str, set[str]] = {"row": set(), "mark": set(), "drawn": set()}
        for target in [options, marked, *widgets, options, widgets[1]]:
            target.focus()
            await pilot.pause()
            drawn = app.screen.get_style_at(*marked.region.offset)  # what the terminal shows
            seen["drawn"].add(f"focused {marked.has_focus}: bold {bool(drawn.bold)}")
            ours = {id(w): _component_rules(w) for w in widgets}
            for widget in widgets:  # Textual's own, from scratch, beside ours
                own(app.stylesheet, widget)
                assert _component_rules(widget) == ours[id(widget)], (target, widget)
                app.stylesheet.apply(widget)  # and ours again, from Textual's fresh styles
                assert _component_rules(widget) == ours[id(widget)], (target, widget)
            row = options.get_component_rich_style("option-list--option-highlighted")
            mark = marked._component_styles["marked--mark"].base.get_rules()
            seen["row"].add(f"{options.has_focus} {row.bgcolor}")
            seen["mark"].add(f"focused {marked.has_focus}: {'color' in mark}, {len(mark)} rules")

    # The highlighted row differs focused and blurred, and the focus-only rule comes and goes.
    assert len({r.split()[1] for r in seen["row"]}) == 2, seen["row"]
    assert {m for m in seen["mark"] if m.startswith("focused False")} == {"focused False: False, 0 rules"}
    assert any(m.startswith("focused True: True") for m in seen["mark"]), seen["mark"]
    assert seen["drawn"] == {"focused True: bold True", "focused False: bold False"}, seen["drawn"]


async def test_a_class_that_changes_only_a_component_repaints_the_widget() -> None:
    app = Focusing()
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        marked = app.query_one(Marked)
        drawn = []
        for lit in (True, False, True):
            marked.set_class(lit, "lit")  # the widget's own rules are the same either way
            await pilot.pause()
            drawn.append(bool(app.screen.get_style_at(*marked.region.offset).italic))
    assert drawn == [True, False, True]


async def test_typing_and_new_options_leave_no_cached_lines_for_the_collector() -> None:
    """An edit clears the input's cache of rendered lines, new options the list's: what those
    caches held (strips, options) is freed at once, not left linked in the cache's ring."""
    app = Focusing()
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        options, area = app.query_one(OptionList), app.query_one(TextArea)
        area.focus()
        await pilot.pause()
        with saved_garbage() as garbage:
            for i in range(10):
                await pilot.press("x")
                options.set_options([f"session {i} {j}" for j in range(5)])
                await pilot.pause()
            gc.collect()
            kinds = Counter(type(o).__name__ for o in garbage)
    assert area.text.startswith("x" * 10)
    assert options.get_option_at_index(0).prompt == "session 9 0"
    assert kinds["Strip"] == 0, kinds.most_common(8)
    assert kinds["Option"] == 0, kinds.most_common(8)


operations = st.lists(st.one_of(st.tuples(st.just("set"), st.integers(0, 6)), st.tuples(st.just("get"), st.integers(0, 6)),
                                st.tuples(st.just("discard"), st.integers(0, 6)), st.just(("clear", 0))), max_size=40)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_a_cleared_cache_works_as_a_cache_still(ops: list[tuple[str, int]]) -> None:
    """Textual's LRUCache, with `clear` unlinking its entries, against a plain model of an LRU cache
    of three entries."""
    cache: LRUCache[int, str] = LRUCache(3)
    model: dict[int, str] = {}  # insertion order = least recently used first
    for n, (op, key) in enumerate(ops):
        if op == "set":
            if key in model:  # Textual's set leaves a present key's value and place as they are
                continue
            cache.set(key, f"v{n}")
            model[key] = f"v{n}"
            if len(model) > 3:
                del model[next(iter(model))]
        elif op == "get":
            assert cache.get(key) == model.get(key)
            if key in model:
                model[key] = model.pop(key)
        elif op == "discard":
            cache.discard(key)
            model.pop(key, None)
        else:
            cache.clear()
            model.clear()
        assert sorted(cache.keys()) == sorted(model)
