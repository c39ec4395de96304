"""A frame that draws changed areas apart (aiops/tui/crops.py) leaves the terminal as a full redraw
would: a model terminal, updated only by the frames the screen sends, equals a render of the whole
screen after every change — with changes on the same line in areas apart, under a widget layered
over others, in scrolled panes whose blocks are cut off at their edges, and spread at random."""

from __future__ import annotations

import random

from textual.app import App, ComposeResult
from textual.color import Color
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.geometry import Region
from textual.widgets import Static

from aiops.tui import crops
from tests.support.terminal import Terminal, full

crops.install()

WIDTH, HEIGHT = 100, 20


class Board(App[None]):
    """Lines on one screen row in panes apart, a pane of one-line rows, two scrolled panes of
    bordered blocks (cut off at their edges: a widget rendered from a line other than its first),
    and a widget layered over the middle."""

    CSS = """
    Screen { layers: base above; }
    #status { dock: top; height: 1; }
    #keys { dock: bottom; height: 1; }
    #left { width: 30; }
    #right { width: 30; }
    #center > Static { height: 1; }
    .block { height: 5; border: round green; padding: 0 1; }
    #over { layer: above; offset: 25 5; width: 50; height: 4; background: red 60%; }
    """

    def compose(self) -> ComposeResult:
        yield Static("status", id="status")
        with Horizontal():
            with VerticalScroll(id="left"):
                yield from (Static(f"left {i}", id=f"l{i}", classes="block") for i in range(12))
            with Vertical(id="center"):
                yield from (Static(f"text {i}", id=f"c{i}") for i in range(12))
            with VerticalScroll(id="right"):
                yield from (Static(f"right {i}", id=f"r{i}", classes="block") for i in range(12))
        yield Static("layered over the others", id="over")
        yield Static("keys", id="keys")


async def test_a_model_terminal_matches_a_full_render_after_every_frame(terminal: Terminal) -> None:
    app = Board()
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        left, right = app.query_one("#left", VerticalScroll), app.query_one("#right", VerticalScroll)
        left.scroll_to(y=7, animate=False)
        right.scroll_to(y=13, animate=False)
        await pilot.pause()
        await pilot.pause()
        terminal.start(app)
        rng = random.Random(27)
        ids = ["status", "keys", "over"] + [f"{side}{i}" for side in "lcr" for i in range(12)]
        rounds = [
            ["c6", "r3"],  # one line, two areas apart, the right one partly under the layer
            ["status", "c5"],  # the top line and a line under the layer
            ["l2", "over"],
            ["status", "keys", "l3", "r4"],
        ] + [rng.sample(ids, rng.randint(2, 5)) for _ in range(80)]
        for n, changed in enumerate(rounds):
            for wid in changed:
                text = f"{wid} round {n} " + "·" * rng.randint(0, 30)
                app.query_one(f"#{wid}", Static).update(text + ("\nsecond line\nthird" if wid[0] in "lr" else ""))
            if n % 9 == 8:
                rng.choice([left, right]).scroll_to(y=rng.randint(0, 40), animate=False)
            await pilot.pause()
            await pilot.pause()
            # Checked every third round only: the full render used to check redraws every widget
            # whole, which would hide a line left dirty but undrawn from one frame to the next.
            if n < 4 or n % 3 == 0 or n == len(rounds) - 1:
                assert terminal.grid == full(app), f"round {n}: {changed}"
    assert terminal.split_frames >= 10  # the wrapped path was taken, not Textual's alone
    assert terminal.partial_frames >= len(rounds) * 3 // 4  # (a scroll is a full redraw)


def test_areas_apart_stay_apart_and_touching_ones_join() -> None:
    top, left, right = Region(0, 0, 100, 1), Region(0, 5, 20, 2), Region(70, 5, 30, 2)
    assert sorted(crops.areas([top, left, right])) == sorted([top, left, right])
    below = Region(0, 7, 20, 1)  # touches `left`
    assert sorted(crops.areas([left, right, below])) == sorted([Region(0, 5, 20, 3), right])
    # a join that reaches a third area takes it in too
    assert crops.areas([Region(0, 2, 10, 1), Region(0, 0, 10, 1), Region(0, 1, 50, 1)]) == [Region(0, 0, 50, 3)]


def test_areas_are_drawn_apart_only_when_they_leave_their_box_mostly_unchanged() -> None:
    top, row = Region(0, 0, 120, 1), Region(0, 20, 30, 2)
    assert sorted(crops.apart([top, row])) == sorted([top, row])  # a line and a row: the box is the screen
    chat, status = Region(30, 2, 60, 36), Region(0, 0, 120, 1)
    assert crops.apart([chat, status]) == []  # the chat fills most of the box: one crop
    assert crops.apart([row]) == []


class Framed(App[None]):
    """A framed pane of rows beside another, as the console's panes."""

    CSS = """
    #pane { width: 40; border: round green; }
    #pane > Static { height: 1; }
    #other { width: 1fr; }
    """

    def compose(self) -> ComposeResult:
        with Horizontal():
            with Vertical(id="pane"):
                yield from (Static(f"row {i}", id=f"p{i}") for i in range(10))
            yield Static("beside\n" * 10, id="other")


async def test_a_frame_repainted_renders_none_of_the_widgets_inside_it(terminal: Terminal) -> None:
    """The four edges of a pane's frame (a focus move lights it) touch, so they make one area the
    size of the pane: the rows inside it are not drawn, so they are not rendered either."""
    app = Framed()
    async with app.run_test(size=(80, 14)) as pilot:
        for _ in range(3):  # (the rows' first paint comes a frame after the layout)
            await pilot.pause()
        terminal.start(app)
        pane = app.query_one("#pane")
        rendered: list[str] = []
        for widget in [*pane.children, app.query_one("#other")]:
            def counting(crop: Region, widget: Static = widget, render=widget.render_lines) -> list:  # type: ignore[no-untyped-def]
                rendered.append(widget.id or "")
                return render(crop)
            widget.render_lines = counting  # type: ignore[method-assign]  # observed, not changed
        for edge in ("border_top", "border_right", "border_bottom", "border_left"):
            pane.styles.set_rule(edge, ("round", Color.parse("red")))
        width, height = pane.outer_size
        pane.refresh(*(Region(x - 1, y - 1, w, h) for x, y, w, h in (
            (0, 0, width, 1), (0, height - 1, width, 1), (0, 0, 1, height), (width - 1, 0, 1, height))))
        await pilot.pause()
        await pilot.pause()
        assert rendered == []  # (before the full render below, which renders every widget)
        assert terminal.grid == full(app)
        assert terminal.grid[0][0][1].color.triplet == Color.parse("red").rich_color.triplet  # drawn


async def test_the_model_terminal_gives_wide_characters_two_cells(terminal: Terminal) -> None:
    """Wide characters (the command palette's 🔎, CJK text) take two cells on a terminal: the model
    terminal follows, so a frame that draws them is checked like any other."""
    app = Board()
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        await pilot.pause()
        await pilot.pause()
        terminal.start(app)
        for n, text in enumerate(["🔎 search", "日本語のテキスト", "plain again", "混在 mixed 🔎 text"]):
            app.query_one("#c3", Static).update(text)
            app.query_one("#status", Static).update(f"status {n} 🔎")
            await pilot.pause()
            await pilot.pause()
            assert terminal.grid == full(app), text
            assert all(len(row) == WIDTH for row in terminal.grid), text


class Stacked(App[None]):
    """A framed column holding a container of tall blocks with a blank line between them, as the
    chat holds a message and the message its Markdown's blocks."""

    CSS = """
    #column { width: 50; border: round green; padding: 0 1; }
    #inner { height: auto; }
    #inner > Static { height: 6; margin: 0 0 1 0; background: blue; }
    #other { width: 1fr; }
    """

    def compose(self) -> ComposeResult:
        with Horizontal():
            with VerticalScroll(id="column"), Vertical(id="inner"):
                yield from (Static(f"block {i}", id=f"b{i}") for i in range(8))
            yield Static("beside", id="other")


async def test_a_container_renders_only_the_lines_where_it_shows_between_its_children(
        terminal: Terminal) -> None:
    """A layout frame draws every line of the column. The container inside it shows only on the
    blank line between two blocks: it renders those lines, not the blocks' lines behind them (it
    rendered all of them, every layout of a streamed answer)."""
    app = Stacked()
    async with app.run_test(size=(80, 30)) as pilot:
        await pilot.pause()
        await pilot.pause()
        terminal.start(app)
        inner = app.query_one("#inner", Vertical)
        asked: list[int] = []  # screen lines
        render_lines = inner.render_lines

        def counting(crop: Region) -> list:  # type: ignore[type-arg]
            asked.extend(y + inner.region.y for y in crop.line_range)
            return render_lines(crop)

        inner.render_lines = counting  # type: ignore[method-assign]  # observed, not changed
        for step in range(3):
            app.query_one("#b1", Static).styles.height = 7 + step  # a layout: every line redrawn
            await pilot.pause()
            await pilot.pause()
            framed = len(asked)
            assert terminal.grid == full(app), f"step {step}"
            del asked[framed:]  # (the full render renders every widget whole)
            blank = {b.region.bottom for b in app.query("#inner > Static")} & set(
                app.query_one("#column").content_region.line_range)
            # Each blank line, and within a run about it, a few lines from the widget's cache.
            assert blank <= set(asked), (step, sorted(blank), asked)
            assert len(asked) <= 5 * len(blank), (step, sorted(blank), asked)
            asked.clear()
