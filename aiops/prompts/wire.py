"""A prompt tree as JSON and back: how the attached console gets the tree the engine's host reads.

The snapshot (`PromptTree`) is frozen dataclasses of strings, numbers and paths; the wire form is
their fields, paths as text, and `tree_from_wire` rebuilds the same snapshot on the other side, so
the prompt pane draws a remote tree with the code that draws a local one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiops.prompts.tree import PromptError, PromptTree, Section


def tree_to_wire(tree: PromptTree) -> dict[str, Any]:
    return {
        "folder": str(tree.folder),
        "main": tree.main,
        "sections": [{
            "name": s.name, "description": s.description, "depth": s.depth, "index": s.index,
            "kind": s.kind, "path": str(s.path), "heading": s.heading, "body": s.body, "parent": s.parent,
            "children": list(s.children), "requires": list(s.requires),
        } for s in tree.sections],
        "errors": [{"kind": e.kind, "name": e.name, "chain": list(e.chain), "message": e.message}
                   for e in tree.errors],
    }


def tree_from_wire(data: dict[str, Any]) -> PromptTree:
    sections = tuple(Section(
        name=s["name"], description=s["description"], depth=int(s["depth"]), index=int(s["index"]),
        kind=s["kind"], path=Path(s["path"]), heading=s.get("heading"), body=s["body"], parent=s.get("parent"),
        children=tuple(s.get("children") or ()), requires=tuple(s.get("requires") or ()),
    ) for s in data.get("sections") or ())
    errors = tuple(PromptError(kind=e["kind"], name=e["name"], chain=tuple(e.get("chain") or ()),
                               message=e["message"]) for e in data.get("errors") or ())
    return PromptTree(folder=Path(data["folder"]), main=str(data.get("main", "")), sections=sections,
                      errors=errors)
