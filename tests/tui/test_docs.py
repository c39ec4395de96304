"""docs/CONSOLE.md documents every binding: its id and its default keys, in one table row."""

from __future__ import annotations

from pathlib import Path

from aiops.tui.app import AiopsApp
from aiops.tui.keys import KEYS
from aiops.tui.screens.modals import GateDetailsScreen, HelpScreen, PromptEditScreen

DOC = Path(__file__).resolve().parents[2] / "docs" / "CONSOLE.md"


def test_every_binding_has_an_id_a_tooltip_and_a_row_in_the_docs():
    text = DOC.read_text()
    rows = {line.split("|")[2].strip(" `"): line for line in text.splitlines()
            if line.startswith("| `") and line.count("|") >= 4}
    for spec in KEYS:
        assert spec.tooltip and spec.description, spec.id
        assert spec.id in rows, f"{spec.id} is not in docs/CONSOLE.md"
        for key in spec.keys.split(","):
            assert f"`{key}`" in rows[spec.id], f"{spec.id}: key {key} not documented"
    for screen in (GateDetailsScreen, HelpScreen, PromptEditScreen, AiopsApp):
        for binding in screen.BINDINGS:
            assert binding.id and binding.tooltip, binding
            assert f"`{binding.id}`" in text or binding.id in rows, binding.id
