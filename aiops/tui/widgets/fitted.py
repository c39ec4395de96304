"""Text laid out at the width it is drawn at.

A list entry or a block of output is built once but drawn at whatever width its pane has (a
resized pane, a narrow terminal's full-width tab), so the layout happens at render time:

- `Rows` keeps each line of a list entry as a left part, cut with "…" to fit, and a right part kept
  whole and right-aligned (an age, a countdown): nothing is cut at a width guessed earlier, and
  what matters most on a line survives a narrow pane.
- `HangingText` wraps column-aligned output (`!help`, `!model`, …) with a hanging indent, so a
  wrapped description continues under its own column instead of at the left edge.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

from textual.content import Content
from textual.visual import Visual

if TYPE_CHECKING:
    from textual.css.styles import RulesMap
    from textual.strip import Strip
    from textual.style import Style
    from textual.visual import RenderOptions

Line = tuple[Content, Content]


class Rows(Visual):
    """Lines of (left, right): left is cut to fit, right stays whole at the right edge."""

    def __init__(self, lines: Sequence[Line | Content]) -> None:
        self.lines: list[Line] = [line if isinstance(line, tuple) else (line, Content("")) for line in lines]

    @staticmethod
    def fit(left: Content, right: Content, width: int) -> Content:
        gap = 1 if right.cell_length else 0
        if right.cell_length + gap >= width:  # no room for both: the left part matters more
            return left.truncate(width, ellipsis=True)
        room = width - right.cell_length - gap
        return Content.assemble(left.truncate(room, ellipsis=True, pad=True), " " * gap, right)

    def render_strips(self, width: int, height: int | None, style: Style, options: RenderOptions) -> list[Strip]:
        if width <= 0:
            return []
        content = Content("\n").join(self.fit(left, right, width) for left, right in self.lines)
        return content.render_strips(width, height, style, options)

    def get_optimal_width(self, rules: RulesMap, container_width: int) -> int:
        return max((left.cell_length + (right.cell_length + 1 if right.cell_length else 0)
                    for left, right in self.lines), default=0)

    def get_height(self, rules: RulesMap, width: int) -> int:
        return len(self.lines)

    @property
    def plain(self) -> str:
        """The text of every line, unfitted (for tests and logs)."""
        return "\n".join(f"{left.plain} {right.plain}".rstrip() for left, right in self.lines)


_LAST_COLUMN = re.compile(r"\S {2,}(?=\S)")


def hang_wrap(line: str, width: int) -> list[str]:
    """One line of column-aligned text wrapped to `width`: the last column continues under itself,
    or, when it starts too far right to be read there, moves under the rest of the line."""
    if len(line) <= width or width < 8:
        return [line]
    indent = len(line) - len(line.lstrip(" "))
    columns = list(_LAST_COLUMN.finditer(line))
    if columns:
        hang = columns[-1].end()
        head, rest = line[:hang].rstrip(), line[hang:]
        if hang <= width * 0.6:
            pieces = textwrap.wrap(rest, width - hang, break_on_hyphens=False) or [""]
            return [line[:hang] + pieces[0], *(" " * hang + p for p in pieces[1:])]
        under = " " * (indent + 4)
        return [*hang_wrap(head, width),
                *textwrap.wrap(rest, width, initial_indent=under, subsequent_indent=under,
                               break_on_hyphens=False)]
    return textwrap.wrap(line, width, subsequent_indent=" " * (indent + 2), break_on_hyphens=False) or [line]


class HangingText(Visual):
    """Plain text whose long lines wrap under their last column (see `hang_wrap`)."""

    def __init__(self, text: str, style: str = "") -> None:
        self.text = text
        self.style = style

    def _lines(self, width: int) -> list[str]:
        return [out for line in self.text.splitlines() or [""] for out in hang_wrap(line.rstrip(), width)]

    def render_strips(self, width: int, height: int | None, style: Style, options: RenderOptions) -> list[Strip]:
        if width <= 0:
            return []
        content = Content.styled("\n".join(self._lines(width)), self.style)
        return content.render_strips(width, height, style, options)

    def get_optimal_width(self, rules: RulesMap, container_width: int) -> int:
        return max((len(line.rstrip()) for line in self.text.splitlines()), default=0)

    def get_height(self, rules: RulesMap, width: int) -> int:
        return len(self._lines(width))

    @property
    def plain(self) -> str:
        return self.text
