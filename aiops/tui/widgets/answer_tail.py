"""A long answer of a session's history, drawn from its end: the blocks the reader sees when the
session opens (the chat shows its bottom) first, the rest as the reader scrolls up to it.

Textual's `Markdown` builds and mounts a widget for every block of its text, and every layout of
the screen then places them all. A 40 KB answer is ~300 blocks, ~1,100 widgets: opening its session
took ~2 s until the chat showed it, most of it styling and mounting those widgets and laying them
out (docs/PERFORMANCE.md, "2026-11-29 … a long answer's session opens"). Here the text is parsed
once, its top-level blocks are kept as markdown-it tokens, and only the last ones, about
`tail_lines` lines of source, are made widgets and mounted. Above them `HeldBlocks` stands for the
rest, as tall as their lines of source (they take at least as many on screen), so the scrollbar
and a page key see about the answer's length. When it is drawn (it came into sight) the next part
of what it holds is mounted beside it, twice the last part's lines each time:
- its end in sight (the reader came up to it): the part from its end, and the view moved down by
  what the answer grew in the same layout (`ChatView.keep_place_above`), so the lines in sight
  stay put;
- its start in sight (the reader came down to it), or the view on its way to the top (home): the
  part from its start, the view left where it is.

The blocks are Textual's (`AnswerMarkdown.BLOCKS`) built from the same tokens, so once mounted the
answer looks as it would have. The answer's own stream (a live turn) is `AnswerMarkdown`, not this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any

from textual.await_complete import AwaitComplete
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

from aiops.tui.widgets.answer import AnswerMarkdown

if TYPE_CHECKING:
    from markdown_it.token import Token


def top_level(tokens: Sequence[Token]) -> list[list[Token]]:
    """markdown-it's tokens in groups of one top-level block each (an opening token to its closing
    one, or a block token of its own: a fence, a rule)."""
    groups: list[list[Token]] = []
    group: list[Token] = []
    depth = 0
    for token in tokens:
        group.append(token)
        depth += token.nesting
        if depth == 0:
            groups.append(group)
            group = []
    if group:
        groups.append(group)
    return groups


class HeldBlocks(Static):
    """Stands for the blocks not mounted yet (a `⋯` and their lines of source); drawn, it has the next
    of them mounted."""

    DEFAULT_CSS = "HeldBlocks { color: $text-muted; }"

    def __init__(self, markdown: TailFirstMarkdown, lines: int) -> None:
        super().__init__("⋯", classes="held-blocks")
        self.styles.height = max(lines, 1)
        self._markdown = markdown

    def render_lines(self, crop: Region) -> list[Strip]:
        self._markdown.unhold_soon()
        return super().render_lines(crop)


class TailFirstMarkdown(AnswerMarkdown):
    """Markdown whose first update mounts only its last `tail_lines` lines of source (see the
    module's docstring); any later update draws the whole text, as Textual's does."""

    def __init__(self, markdown: str, *, tail_lines: int, classes: str | None = None) -> None:
        super().__init__(markdown, classes=classes)
        self._tail_lines: int | None = max(tail_lines, 0)
        self._chunk = max(tail_lines, 40)
        self._held: list[list[Token]] = []  # top-level blocks not mounted, in order
        self._held_size: list[int] = []  # their lines of source
        self._placeholder: HeldBlocks | None = None
        self._growing = False

    @property
    def held(self) -> int:
        """How many of the answer's top-level blocks are not mounted yet."""
        return len(self._held)

    def update(self, markdown: str) -> AwaitComplete:
        tail = self._tail_lines
        if tail is None:
            self._held, self._held_size = [], []
            placeholder, self._placeholder = self._placeholder, None
            update = super().update(markdown)
            if placeholder is None:
                return update

            async def whole() -> None:
                await placeholder.remove()
                await update

            return AwaitComplete(whole())
        self._tail_lines = None
        self._theme = self.app.theme
        self._markdown = markdown
        self._table_of_contents = None

        async def first() -> None:
            from markdown_it import MarkdownIt

            async with self.lock:
                # In a thread, as Textual's `update` parses.
                tokens = await asyncio.get_running_loop().run_in_executor(
                    None, MarkdownIt("gfm-like").parse, markdown)
                groups = top_level(tokens)
                lines = markdown.splitlines()
                sizes = [_size(group, lines) for group in groups]
                start, total = len(groups), 0
                while start > 0 and total < tail:
                    start -= 1
                    total += sizes[start]
                self._held, self._held_size = groups[:start], sizes[:start]
                widgets: list[Widget] = list(self._blocks_of(groups[start:]))
                if self._held:
                    self._placeholder = HeldBlocks(self, sum(self._held_size))
                    widgets.insert(0, self._placeholder)
                if widgets:
                    await self.mount_all(widgets)
                self._last_parsed_line = len(lines) - (1 if lines and lines[-1] else 0)

        return AwaitComplete(first())

    def _blocks_of(self, groups: Iterable[list[Token]]) -> Iterable[Any]:
        return self._parse_markdown(list(chain.from_iterable(groups)))

    def unhold_soon(self) -> None:
        """The held blocks came into sight: mount the next part of them (once at a time)."""
        if self._held and not self._growing:
            self._growing = True
            self.call_later(self._unhold)

    def _scroller(self) -> tuple[Any, Widget] | None:
        """The view the answer scrolls in, and its child that holds the answer."""
        child: Widget = self
        for node in self.ancestors:
            if hasattr(node, "keep_place_above"):
                return node, child
            if not isinstance(node, Widget):
                break
            child = node
        return None

    def _take(self, *, from_end: bool) -> list[list[Token]]:
        n, total = 0, 0
        sizes = self._held_size if not from_end else self._held_size[::-1]
        for size in sizes:
            if total >= self._chunk:
                break
            n += 1
            total += size
        self._chunk *= 2
        if from_end:
            taken = self._held[len(self._held) - n:]
            del self._held[len(self._held) - n:], self._held_size[len(self._held_size) - n:]
        else:
            taken = self._held[:n]
            del self._held[:n], self._held_size[:n]
        return taken

    async def _unhold(self) -> None:
        try:
            placeholder = self._placeholder
            if not self._held or placeholder is None or not placeholder.is_attached:
                return
            found = self._scroller()
            from_end = False
            if found is not None and found[0].scroll_target_y > 0:
                # Which edge of it is in sight: the reader came up to its end, or down to its start
                # (on its way to the top, home, the start).
                area, region = found[0].scrollable_content_region, placeholder.region
                top_in_sight, end_in_sight = region.y >= area.y, region.bottom <= area.bottom
                if end_in_sight and top_in_sight:
                    from_end = region.y + region.height / 2 < area.y + area.height / 2
                else:
                    from_end = not top_in_sight
            blocks = list(self._blocks_of(self._take(from_end=from_end)))
            async with self.lock:
                with self.app.batch_update():
                    if from_end:
                        assert found is not None
                        found[0].keep_place_above(found[1])
                        await self.mount_all(blocks, after=placeholder)
                    else:
                        await self.mount_all(blocks, before=placeholder)
                    if self._held:
                        placeholder.styles.height = sum(self._held_size)
                    else:
                        self._placeholder = None
                        await placeholder.remove()
        finally:
            self._growing = False


def _size(group: list[Token], lines: list[str]) -> int:
    first = group[0]
    if first.map is None:
        return 1
    start, end = first.map
    # Its lines that draw something and a margin: it takes at least as many on screen.
    return 1 + sum(1 for line in lines[start:end] if line.strip())
