"""Tab bars that keep every tab whole in sight at the width they get.

Textual's `Tabs` lays its tabs out at their natural width and crops the row at the bar's edge: a
side pane narrowed to 30 columns showed "Gates (0)  Prompt  Limits" and no "Log", neither to see nor
to click. Here the labels are fitted to the bar's width, in steps, each taken only when the one
before does not fit (the wide layout is the first, unchanged):

1. the labels as they are, a cell of padding either side (Textual's own look);
2. the same labels a single space apart (`-tight`: no padding, a cell of margin before each);
3. a count without its brackets: "Gates 3";
4. the longest names cut with "…" ("Prom…"), a count kept whole, no name under three cells.

A cut or compact label has the full one as its tooltip. Below the narrowest step the row is cropped
again, and Textual keeps the active tab in view: the side pane is never that narrow
(`SIDE_MIN_WIDTH`, screens/main.py), a small terminal's bar under about 26 columns is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from textual.content import Content
from textual.css.query import NoMatches
from textual.widgets import Static, Tab, Tabs

# A name is not cut shorter than this ("Pr…"), and a name this short is never cut.
MIN_NAME = 3


@dataclass(frozen=True)
class TabLabel:
    """What a tab says: a name and, for a tab that counts something, the count."""

    name: str
    count: int | None = None

    @property
    def full(self) -> str:
        return self.name if self.count is None else f"{self.name} ({self.count})"

    @property
    def suffix(self) -> str:
        """The count as the compact label shows it, after the name."""
        return "" if self.count is None else f" {self.count}"


def fit_labels(labels: Sequence[TabLabel], width: int) -> tuple[bool, list[str]]:
    """The texts that fit `labels` into a bar `width` cells wide, and whether the tabs must sit
    tight (a cell apart, not two). Past the narrowest step the narrowest texts are returned."""
    n = len(labels)
    full = [label.full for label in labels]
    cells = sum(cell_len(text) for text in full)
    if cells + 2 * n <= width:
        return False, full
    if cells + n <= width:
        return True, full
    sizes = [cell_len(label.name) for label in labels]
    room = width - n - sum(cell_len(label.suffix) for label in labels)
    while sum(sizes) > room:
        # The longest name loses a cell; of names as long, the rightmost (the first tabs, the
        # gates among them, keep their names longest).
        i = max(range(n), key=lambda j: (sizes[j], j))
        if sizes[i] <= MIN_NAME:
            break
        sizes[i] -= 1
    return True, [_cut(label.name, size) + label.suffix for label, size in zip(labels, sizes, strict=True)]


def _cut(name: str, size: int) -> str:
    return Content(name).truncate(size, ellipsis=True).plain


def relabel(tab: Tab, label: str) -> None:
    """Give `tab` a new label; one of the same width is redrawn in place.

    Textual's `Tab.label` lays the whole screen out again and slides the tab bar's underline for 0.3
    s (a frame every 17 ms): a gate round relabelled the Gates tab twice, 15-25 ms a layout frame
    here (docs/PERFORMANCE.md). A label of the same width moves nothing, so it is set without
    either. `Tab._label` is what `Tab.label` reads back (checked against Textual 8.2.8)."""
    if tab.label_text == label:
        return
    if cell_len(tab.label_text) != cell_len(label):
        tab.label = label
        return
    content = Content(label)
    tab._label = content
    Static.update(tab, content, layout=False)


class TabFit:
    """One tab bar's labels, by tab id, kept fitted to the bar's width.

    Fitted again only when the width or a label changed: the Gates count is set twice in every
    gate round, and its tab is relabelled in place (`relabel`) when its width holds."""

    def __init__(self, labels: Mapping[str, TabLabel]) -> None:
        self.labels = dict(labels)
        self._tabs: list[Tab] | None = None  # by the labels' order, found once
        self._fitted: tuple[int, tuple[TabLabel, ...]] | None = None

    def set(self, tab_id: str, label: TabLabel, bar: Tabs | None, find: Callable[[str], Tab]) -> None:
        self.labels[tab_id] = label
        if bar is not None:
            self.fit(bar, find)

    def fit(self, bar: Tabs, find: Callable[[str], Tab]) -> None:
        """Label `bar`'s tabs (`find` gives one by id) to fit its width now. A bar not laid out
        (hidden) keeps its labels: it is fitted when it has a width again (its resize)."""
        width = bar.size.width
        labels = tuple(self.labels.values())
        if width <= 0 or (width, labels) == self._fitted:
            return
        if self._tabs is None:
            try:
                self._tabs = [find(tab_id) for tab_id in self.labels]
            except NoMatches:
                return  # the bar's tabs not mounted yet: fitted at its first resize
        tight, texts = fit_labels(labels, width)
        bar.set_class(tight, "-tight")
        for tab, label, text in zip(self._tabs, labels, texts, strict=True):
            relabel(tab, text)
            tip = None if text == label.full else label.full
            if tab.tooltip != tip:
                tab.tooltip = tip
        self._fitted = (width, labels)


class FittedTabs(Tabs):
    """A `Tabs` whose labels are fitted to its width (see the module's docstring)."""

    def __init__(self, labels: Mapping[str, TabLabel], *, id: str | None = None) -> None:
        super().__init__(*(Tab(label.full, id=tab_id) for tab_id, label in labels.items()), id=id)
        self.fitted = TabFit(labels)

    def _find(self, tab_id: str) -> Tab:
        return self.query_one(f"#tabs-list > #{tab_id}", Tab)

    def set_label(self, tab_id: str, label: TabLabel) -> None:
        self.fitted.set(tab_id, label, self if self.is_mounted else None, self._find)

    def on_resize(self) -> None:
        self.fitted.fit(self, self._find)
