"""A frame that draws changed areas apart (aiops/tui/crops.py) leaves the terminal as a full redraw
would: a model terminal, updated only by the frames the screen sends, equals a render of the whole
screen after every change — with changes on the same line in areas apart, under a widget layered
over others, and spread at random."""

from __future__ import annotations

import random

from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.geometry import Region
from textual.widgets import Static

from aiops.tui import crops
from tests.support.terminal import Terminal, full

crops.install()

WIDTH, HEIGHT = 100, 16


class Board(App[None]):
    CSS = """
    Screen { layers: base above; }
    #status { dock: top; height: 1; }
    #keys { dock: bottom; height: 1; }
    #left { width: 20; }
    #right { width: 30; }
    Static { height: 1; }
    #over { layer: above; offset: 30 5; width: 45; height: 4; background: red; }
    """

    def compose(self) -> ComposeResult:
        yield Static("status", id="status")
        with Horizontal():
            with Vertical(id="left"):
                yield from (Static(f"row {i}", id=f"l{i}") for i in range(12))
            with Vertical(id="center"):
                yield from (Static(f"text {i}", id=f"c{i}") for i in range(12))
            with Vertical(id="right"):
                yield from (Static(f"side {i}", id=f"r{i}") for i in range(12))
        yield Static("layered over the others", id="over")
        yield Static("keys", id="keys")


async def test_a_model_terminal_matches_a_full_render_after_every_frame(terminal: Terminal) -> None:
    app = Board()
    async with app.run_test(size=(WIDTH, HEIGHT)) as pilot:
        await pilot.pause()
        terminal.start(app)
        rng = random.Random(27)
        ids = ["status", "keys", "over"] + [f"{side}{i}" for side in "lcr" for i in range(12)]
        rounds = [
            ["l6", "r6"],  # one line, two areas apart, the right one partly under the layer
            ["status", "c6"],  # the top line and a line under the layer
            ["l1", "over"],
            ["status", "keys", "l3", "r9"],
        ] + [rng.sample(ids, rng.randint(2, 5)) for _ in range(40)]
        for n, changed in enumerate(rounds):
            for wid in changed:
                app.query_one(f"#{wid}", Static).update(f"{wid} changed in round {n} " + "·" * rng.randint(0, 30))
            await pilot.pause()
            await pilot.pause()
            assert terminal.grid == full(app), f"round {n}: {changed}"
    assert terminal.split_frames >= 10  # the wrapped path was taken, not Textual's alone
    assert terminal.partial_frames >= len(rounds)


def test_areas_apart_stay_apart_and_touching_ones_join() -> None:
    top, left, right = Region(0, 0, 100, 1), Region(0, 5, 20, 2), Region(70, 5, 30, 2)
    assert sorted(crops.areas([top, left, right])) == sorted([top, left, right])
    below = Region(0, 7, 20, 1)  # touches `left`
    assert sorted(crops.areas([left, right, below])) == sorted([Region(0, 5, 20, 3), right])
    # a join that reaches a third area takes it in too
    assert crops.areas([Region(0, 2, 10, 1), Region(0, 0, 10, 1), Region(0, 1, 50, 1)]) == [Region(0, 0, 50, 3)]
