"""Tab labels fitted to a tab bar's width (aiops/tui/widgets/tab_fit.py), where no Pilot is needed."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from aiops.tui.widgets.tab_fit import TabLabel, fit_labels

SIDE = [TabLabel("Gates", 0), TabLabel("Prompt"), TabLabel("Limits"), TabLabel("Log")]


def row(tight: bool, texts: list[str]) -> int:
    """The cells the tabs take: two of padding around each label, or one of margin before it."""
    return sum(cell_len(text) for text in texts) + (1 if tight else 2) * len(texts)


@pytest.mark.parametrize(("width", "tight", "texts"), [
    (40, False, ["Gates (0)", "Prompt", "Limits", "Log"]),  # the side pane as it opens
    (32, False, ["Gates (0)", "Prompt", "Limits", "Log"]),  # just room for the wide look
    (31, True, ["Gates (0)", "Prompt", "Limits", "Log"]),   # a cell apart, labels whole ...
    (28, True, ["Gates (0)", "Prompt", "Limits", "Log"]),   # ... down to a 30-column pane
    (27, True, ["Gates 0", "Prompt", "Limits", "Log"]),     # then the count loses its brackets
    (26, True, ["Gates 0", "Prompt", "Limits", "Log"]),
    (24, True, ["Gates 0", "Prom…", "Limi…", "Log"]),        # then the longest names are cut
    (20, True, ["Gat… 0", "Pro…", "Li…", "Log"]),
    (18, True, ["Ga… 0", "Pr…", "Li…", "Log"]),             # the narrowest that fits
])
def test_side_tabs_keep_every_label_in_a_narrowing_bar(width: int, tight: bool, texts: list[str]) -> None:
    assert fit_labels(SIDE, width) == (tight, texts)
    assert row(tight, texts) <= width


def test_a_count_stays_whole_and_past_the_narrowest_step_the_narrowest_labels_come_back() -> None:
    labels = [TabLabel("Gates", 12), *SIDE[1:]]
    assert fit_labels(labels, 29) == (True, ["Gates (12)", "Prompt", "Limits", "Log"])
    assert fit_labels(labels, 28) == (True, ["Gates 12", "Prompt", "Limits", "Log"])
    tight, texts = fit_labels(labels, 10)
    assert tight and texts == ["Ga… 12", "Pr…", "Li…", "Log"]  # no name under three cells


def test_the_narrow_terminals_bar_cuts_its_longest_names_first() -> None:
    views = [TabLabel("Chat"), TabLabel("Sessions"), *SIDE]
    assert fit_labels(views, 80)[1] == ["Chat", "Sessions", "Gates (0)", "Prompt", "Limits", "Log"]
    assert fit_labels(views, 40) == (True, ["Chat", "Sessions", "Gates 0", "Prompt", "Limits", "Log"])
    assert fit_labels(views, 33) == (True, ["Chat", "Sess…", "Gates 0", "Pro…", "Lim…", "Log"])
