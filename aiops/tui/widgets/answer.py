"""The Markdown of a streamed answer: its growing last block updated in place.

Textual's `Markdown.append` parses the new text from the last block on and hands the last block its
new version (`_update_from_block`). Textual's own blocks then either set their text and ask for a
layout (paragraphs, code), or are removed and mounted again whole (headings, and lists with every
item in them). A layout reflows the whole screen — measured on a 2-core machine, 20-70 ms a frame
with a long answer on screen, ~13 of them a second at 50 tokens/s, and the operator's keys wait
behind them (docs/PERFORMANCE.md, "keys while the answer on screen streams").

Here the blocks of the answer's kinds that stream most — paragraphs, headings, code, lists — update
in place: a text block sets its text and asks for a layout only when its size changes (a word
added to a line is a repaint of that block alone); a list updates its last item in place and mounts
only the items that are new. Anything else (tables, quotes, a block that changed kind) goes the way
Textual does it. When the turn ends the answer is rendered once more from its whole text
(`AssistantMessage.finish`), so what stays on screen is Textual's own rendering in every case.

Relies on `Markdown.BLOCKS` (public) and on `MarkdownBlock._update_from_block`, `_content`,
`_blocks`, `_copy_context` and `MarkdownFence._highlighted_code` (Textual 8.2, pinned below 9).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.geometry import Region, Size
from textual.widget import Widget
from textual.widgets import Label, Markdown, Static
from textual.widgets._markdown import (
    MarkdownBlock,
    MarkdownBullet,
    MarkdownBulletList,
    MarkdownFence,
    MarkdownH1,
    MarkdownH2,
    MarkdownH3,
    MarkdownH4,
    MarkdownH5,
    MarkdownH6,
    MarkdownListItem,
    MarkdownOrderedList,
    MarkdownParagraph,
)

from aiops.tui.widgets.settled import Settled

_NO_SIZE = Size(0, 0)
log = logging.getLogger(__name__)


def _measure(widget: Widget) -> tuple[int, int] | None:
    """The widget's content width and height as the layout would compute them now; None before
    its first layout (nothing to compare with)."""
    width = widget.size.width
    if not width:
        return None
    return widget.get_content_width(widget.container_size, _NO_SIZE), \
        widget.get_content_height(widget.container_size, _NO_SIZE, width)


def _repaint_or_layout(widget: Static, update: Callable[[], None]) -> None:
    """Apply `update` (which must not ask for a layout itself) and ask for a layout only if it
    changed the widget's size; otherwise only the widget is painted again."""
    before = _measure(widget)
    update()
    if before is None or _measure(widget) != before:
        widget.refresh(layout=True)
    else:
        _forget_other_widths(widget)


def _forget_other_widths(widget: Widget) -> None:
    """The size is the same at this width only: at another (a pane hidden, the terminal resized),
    the new text may take another line. Textual keys what it measured of a widget and arranged of
    its ancestors by their layout updates, which a layout request counts and this repaint does not;
    counted here as a layout request would count them (`Widget._check_refresh`), with no layout.
    (Without it, laid out again at a width seen before, the block kept its old height: a line of
    the answer cut off until the block next grew.)"""
    for node in widget.ancestors_with_self:
        if not isinstance(node, Widget):
            break
        node._clear_arrangement_cache()
        node._layout_updates += 1
        if node is not widget and not node.styles.auto_dimensions:
            break


def _set_text(block: MarkdownBlock, new: MarkdownBlock) -> None:
    content = new._content

    def update() -> None:
        block._content = content
        Static.update(block, content, layout=False)

    _repaint_or_layout(block, update)
    block._copy_context(new)


async def patch_children(container: Widget, new_blocks: Sequence[MarkdownBlock]) -> None:
    """Bring `container`'s children (blocks mounted from an earlier parse of the same growing
    text) up to `new_blocks`: all but the last are taken as unchanged (text is only ever added
    at the end), the last is updated in place or replaced, and the rest are mounted after it."""
    old = list(container.children)
    if not old or len(new_blocks) < len(old):
        await container.remove_children()
        await container.mount_all(new_blocks)
        return
    last, first_new = old[-1], new_blocks[len(old) - 1]
    if not (isinstance(last, InPlace) and await last.patched(first_new)):
        await container.mount(first_new, after=last)
        await last.remove()
    if extra := new_blocks[len(old):]:
        await container.mount_all(extra)


class InPlace(Settled):
    """A block that can take a newer parse of itself without being mounted again. A plain mixin,
    first in a block's bases: Textual finds a widget's CSS type names (and so its default CSS)
    along the first DOMNode base of each class only."""

    async def patched(self, new: MarkdownBlock) -> bool:
        """Take `new`'s content; False when it cannot (then the caller replaces it)."""
        raise NotImplementedError

    async def _update_from_block(self, block: MarkdownBlock) -> None:
        if not await self.patched(block):
            await super()._update_from_block(block)  # type: ignore[misc]  # the block class after the mixin


class TextBlock(InPlace):
    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False,
                recompose: bool = False) -> Any:
        """A layout asked for before the block is mounted is dropped: mounting it lays its parent
        out, which sizes the block from the text it holds then. Kept, the request went out on the
        block's first idle after its mount, and each paragraph or heading a streamed answer mounted
        (its text is set while it is built) laid the screen out a second time: 25-110 ms a frame
        on a 2-core machine. (A block with children of its own, a list, needs its request: they
        are mounted while it is.)"""
        if layout and not self.is_mounted:  # type: ignore[attr-defined]
            layout = False
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)  # type: ignore[misc]

    async def patched(self, new: MarkdownBlock) -> bool:
        if type(new) is not type(self):
            return False
        assert isinstance(self, MarkdownBlock)
        _set_text(self, new)
        return True


class AnswerParagraph(TextBlock, MarkdownParagraph):
    pass


class AnswerH1(TextBlock, MarkdownH1):
    pass


class AnswerH2(TextBlock, MarkdownH2):
    pass


class AnswerH3(TextBlock, MarkdownH3):
    pass


class AnswerH4(TextBlock, MarkdownH4):
    pass


class AnswerH5(TextBlock, MarkdownH5):
    pass


class AnswerH6(TextBlock, MarkdownH6):
    pass


class _CodeLabel(Settled, Label):
    pass


class AnswerFence(InPlace, MarkdownFence):
    def compose(self) -> ComposeResult:
        yield _CodeLabel(self._highlighted_code, id="code-content", expand=True)

    async def patched(self, new: MarkdownBlock) -> bool:  # type: ignore[override]
        if not isinstance(new, MarkdownFence) or new.lexer != self.lexer:
            return False
        labels = self.query("#code-content").results(Label)
        label = next(labels, None)
        if label is None:
            return False
        self._copy_context(new)
        self._content = new._highlighted_code
        _repaint_or_layout(label, lambda: label.update(new._highlighted_code, layout=False))
        return True


def _items(block: MarkdownBlock) -> list[MarkdownListItem]:
    return [b for b in block._blocks if isinstance(b, MarkdownListItem)]


class _Row(Settled, Horizontal):
    pass


class _Body(Settled, Vertical):
    pass


class _Bullet(Settled, MarkdownBullet):
    pass


def _rows(items: Iterable[MarkdownListItem], symbols: Iterable[str]) -> list[Widget]:
    """A list's rows as Textual's lists compose them, of widgets that settle."""
    rows: list[Widget] = []
    for item, symbol in zip(items, symbols, strict=True):
        bullet = _Bullet()
        bullet.symbol = symbol
        rows.append(_Row(bullet, _Body(*item._blocks)))
    return rows


class _InPlaceList(InPlace):
    """A list: its rows are `Horizontal(bullet, Vertical(*item blocks))`, as Textual composes them."""

    def _symbols(self, items: Sequence[MarkdownListItem]) -> list[str]:
        """Each item's bullet, as Textual's list of this kind draws it."""
        raise NotImplementedError

    async def patched(self, new: MarkdownBlock) -> bool:
        if type(new) is not type(self):
            return False
        assert isinstance(self, MarkdownBlock)
        rows, items = list(self.children), _items(new)
        if not rows or len(items) < len(rows):
            return False
        symbols = self._symbols(items)
        bullets = [row.children[0] if row.children else None for row in rows]
        if [getattr(b, "symbol", None) for b in bullets] != symbols[:len(rows)]:
            return False  # a numbered list that widened its numbers: drawn again whole
        body = rows[-1].children[-1]
        await patch_children(body, items[len(rows) - 1]._blocks)
        if len(items) > len(rows):
            await self.mount_all(_rows(items[len(rows):], symbols[len(rows):]))
        self._copy_context(new)
        return True

    def compose(self) -> ComposeResult:
        assert isinstance(self, MarkdownBlock)
        items = _items(self)
        yield from _rows(items, self._symbols(items))
        self._blocks.clear()


class AnswerBulletList(_InPlaceList, MarkdownBulletList):
    def _symbols(self, items: Sequence[MarkdownListItem]) -> list[str]:
        return [item.bullet for item in items]


class AnswerOrderedList(_InPlaceList, MarkdownOrderedList):
    def _symbols(self, items: Sequence[MarkdownListItem]) -> list[str]:
        # As MarkdownOrderedList.compose numbers them.
        try:
            start = int(items[0].bullet) if items else 1
        except ValueError:
            start = 1
        width = max((len(f"{n}. ") for n in range(start, start + len(items))), default=0)
        return [f"{n}. ".rjust(width + 1) for n in range(start, start + len(items))]


class AnswerMarkdown(Settled, Markdown):
    """Markdown whose streamed growth redraws as little as it can (see the module's docstring)."""

    BLOCKS = {
        **Markdown.BLOCKS,
        "paragraph_open": AnswerParagraph,
        "h1": AnswerH1, "h2": AnswerH2, "h3": AnswerH3, "h4": AnswerH4, "h5": AnswerH5, "h6": AnswerH6,
        "fence": AnswerFence,
        "code_block": AnswerFence,
        "bullet_list_open": AnswerBulletList,
        "ordered_list_open": AnswerOrderedList,
    }


# The languages an operator's answers mostly put code in. The first fence in each loads its Pygments
# lexer and compiles its rules: 2-70 ms of the loop on a 2-core machine (mysql 67, python 34, json
# 25, javascript 22, toml 18, sql 17), in the middle of a streamed answer, while the operator types.
WARM_LANGUAGES = ("python", "sql", "mysql", "bash", "json", "yaml", "toml", "javascript")


def warm() -> None:
    """Load what drawing the first answer and its first fences would load (markdown-it, the lexers
    of `WARM_LANGUAGES`). For a thread, once the console is up (services.py): on the loop it held
    the keys typed meanwhile."""
    from markdown_it import MarkdownIt
    from textual.highlight import highlight

    MarkdownIt("gfm-like").parse("# a\n\n- b\n\n`c`")
    for language in WARM_LANGUAGES:
        try:
            highlight("x = 1", language=language)
        except Exception:  # noqa: BLE001 - a lexer Pygments lacks is loaded (or not) when used
            log.debug("could not warm the %s lexer", language, exc_info=True)


class AnswerStream:
    """Text for an `AnswerMarkdown`, appended at most once per `gap()` seconds (what came in
    meanwhile goes in one append). The same interface as Textual's `MarkdownStream`.

    One append at a time, each finished before the next begins: `Markdown.append` reads where
    the last parse ended when it is called, not when it gets the widget's lock, so two at once
    would parse the same lines twice. An append that fails is logged and the stream goes on; the
    turn's end renders the whole text again anyway (`AssistantMessage.finish`)."""

    def __init__(self, markdown: Markdown, gap: Callable[[], float]) -> None:
        self._markdown = markdown
        self._gap = gap
        self._pending: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._appending: asyncio.Future[None] | None = None  # the append under way, if any
        self._stopped = False

    async def write(self, text: str) -> None:
        if self._stopped:
            raise RuntimeError("the answer's stream has stopped")
        if not text:
            return
        self._pending.append(text)
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def _append_pending(self) -> None:
        text = "".join(self._pending)
        self._pending.clear()
        self._appending = asyncio.ensure_future(self._append(text))
        # Shielded: a stop() mid-append waits for it rather than cut a mount in half.
        await asyncio.shield(self._appending)

    async def _append(self, text: str) -> None:
        try:
            await self._markdown.append(text)
        except Exception:  # noqa: BLE001 - drawn whole at the turn's end; the console goes on
            log.exception("drawing the streamed answer failed; it is drawn whole when the turn ends")

    async def _run(self) -> None:
        try:
            while self._pending:
                if not self._markdown.is_attached:  # the answer left the screen
                    self._pending.clear()
                    break
                await self._append_pending()
                await asyncio.sleep(self._gap())
        finally:
            self._task = None

    async def stop(self) -> None:
        """Append what is still pending, after any append under way, and end the stream."""
        self._stopped = True
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._appending is not None:
            await self._appending
        if self._pending:
            await self._append_pending()
