"""A model terminal for console tests: kept up to date only by the frames a Textual screen sends,
so a test can check what the operator's terminal shows against a full render of the screen, and
see how much each frame drew."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.segment import ControlType
from rich.style import Style
from textual._compositor import ChopsUpdate, Compositor
from textual.app import App
from textual.strip import Strip

from aiops.tui import crops

Cell = tuple[str, Style | None]
UNDRAWN: Cell = ("\x00", None)  # a changed cell no chop of the frame drew


def _put(row: list[Cell], x: int, ch: str, style: Style | None) -> int:
    """`ch` written at column `x` of `row` as a terminal does: a wide character (CJK, most emoji)
    takes two cells, the second of them empty. The column after it."""
    width = cell_len(ch)
    for i, cell in enumerate([(ch, style), ("", style)][:width]):
        if x + i < len(row):
            row[x + i] = cell
        else:
            row.append(cell)
    return x + width


def cells(strips: Iterable[Strip]) -> list[list[Cell]]:
    grid = []
    for strip in strips:
        row: list[Cell] = []
        for segment in strip:
            for ch in segment.text:
                _put(row, len(row), ch, segment.style)
        grid.append(row)
    return grid


def full(app: App[Any]) -> list[list[Cell]]:
    """The whole screen as Textual's own renderer draws it (not aiops/tui/crops.py's)."""
    compositor = app.screen._compositor
    chops = crops.TEXTUAL["_render_chops"](compositor, compositor.size.region, lambda y: True)
    return cells(Strip.join(chop.values()) for chop in chops[: compositor.size.height])


class Terminal:
    """What a terminal shows, kept up to date by the updates the screen's compositor sends."""

    def __init__(self) -> None:
        self.grid: list[list[Cell]] = []
        self.partial_frames = 0
        self.split_frames = 0
        self.drawn_lines: list[int] = []  # per partial frame: how many lines it wrote to
        self.undrawn: list[tuple[int, int]] = []  # (line, cut) a frame's span covered but no chop drew
        self._console = Console(width=200, height=100, force_terminal=True, color_system="truecolor")

    def start(self, app: App[Any]) -> None:
        self.grid = full(app)

    def apply(self, compositor: Compositor, update: Any) -> None:
        if not isinstance(update, ChopsUpdate):  # a full redraw
            self.grid = cells(compositor.render_strips())
            return
        self.partial_frames += 1
        self.drawn_lines.append(len({y for y, _, _ in update.spans}))
        # A cell a span covers that no chop draws keeps what the terminal showed before: a frame
        # that rendered too little. Marked, so the grid differs from a full render even where the
        # old cell happened to be right, and kept for the fixture to report.
        for y, x1, x2 in update.spans:
            for (cut, strip), end in zip(update.chops[y].items(), update.chop_ends[y], strict=False):
                if strip is None and cut < x2 and end > x1:
                    self.undrawn.append((y, cut))
                    for cx in range(max(cut, x1), min(end, x2)):
                        self.grid[y][cx] = UNDRAWN
        x = y = 0
        for segment in update.__rich_console__(self._console, self._console.options):
            if segment.control:
                for control in segment.control:
                    if control[0] == ControlType.CURSOR_MOVE_TO:
                        x, y = control[1], control[2]
                continue
            if segment.text == "\n":
                continue
            for ch in segment.text:
                x = _put(self.grid[y], x, ch, segment.style)


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[Terminal]:
    """Every update the compositor sends from `Terminal.start` on, applied to a `Terminal`."""
    crops.install()
    term = Terminal()
    render_update = Compositor.render_update

    def watched(self: Compositor, *args: Any, **kwargs: Any) -> Any:
        if crops.apart(self._dirty_regions):
            term.split_frames += 1
        update = render_update(self, *args, **kwargs)
        if update is not None and term.grid:
            term.apply(self, update)
        return update

    monkeypatch.setattr(Compositor, "render_update", watched)
    yield term
    assert not term.undrawn, f"frames left changed cells undrawn (line, cut): {term.undrawn[:10]}"
