"""The prompt-tree pane: the system prompt's sections, their errors, and a reader."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.widgets import Static, Tree

from aiops.tui.keys import bindings_for

if TYPE_CHECKING:
    from textual.app import ComposeResult

    from aiops.prompts.tree import PromptTree, Section

INACTIVE = "⊘"  # a section left out of the prompt: a tool it requires is not registered


class PromptPane(Vertical):
    """Sections as a tree (containers and leaves); errors marked; select to read; `e` edits."""

    PANE = "prompt"
    BINDINGS = bindings_for("prompt")
    HELP = """\
## Prompt tree

The system prompt of the selected session's model, as the tree of section files it is assembled
from: containers (▸) hold other sections, leaves hold text. Loops, duplicates, missing files and
malformed lines are marked `✗` where they occur; the offending entry is left out of the prompt.
A section that declares `[REQUIRES tool, …]` is left out too while one of those tools is not
registered (its plugin disabled or unavailable): it is drawn dimmed and marked `⊘ needs tool`
(inactive), and the reader says so.

Move through the tree to read a section below it. **e** edits the selected leaf in a text editor;
saving writes it atomically through the prompt-tree engine and records the diff in the audit log.
**r** re-reads the files.
"""

    class EditRequested(Message):
        def __init__(self, folder: Path, section: str, body: str) -> None:
            super().__init__()
            self.folder = folder
            self.section = section
            self.body = body

    class ReloadRequested(Message):
        pass

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.folder: Path | None = None
        self.tree_data: PromptTree | None = None
        self.model_key: str | None = None
        self.tools: frozenset[str] | None = None  # the registered tools; None: not known (yet)
        self.selected: Section | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="prompt-folder", classes="pane-note")
        tree: Tree[Any] = Tree("system prompt", id="prompt-sections")
        tree.show_root = True
        yield tree
        with VerticalScroll(id="prompt-reader"):
            yield Static("Select a section to read it.", id="prompt-body", markup=False)

    def show(self, model_key: str | None, folder: Path | None, tree: PromptTree | None,
             tools: Collection[str] | None = None) -> None:
        """Draw `tree`; with `tools` (the registered tool names) sections that need another tool are
        marked inactive, as they are left out of the prompt."""
        self.model_key = model_key
        self.folder = folder
        self.tree_data = tree
        self.tools = None if tools is None else frozenset(tools)
        note = self.query_one("#prompt-folder", Static)
        view: Tree[Any] = self.query_one("#prompt-sections", Tree)
        keep = self.selected.name if self.selected is not None else None
        view.clear()
        self.selected = None
        if folder is None:
            note.update(f"model {model_key}: no system prompt (system_prompt_folder = \"none\")")
            return
        if tree is None:
            note.update(Content(f"{folder} does not exist"))
            return
        errors = len(tree.errors)
        note.update(Content.assemble(f"{model_key} · {folder}",
                                     (f"  ✗ {errors} error{'s' if errors != 1 else ''}", "bold red")
                                     if errors else ""))
        inactive = len(tree.sections) - len(tree.active(self.tools))
        view.root.label = Text.assemble(("system prompt", "bold"), f" ({len(tree.sections)} sections",
                                        f", {inactive} inactive)" if inactive else ")")
        view.root.data = None
        nodes: dict[str, Any] = {}
        for s in tree.sections:
            parent = nodes.get(s.parent or "", view.root)
            missing = tree.missing_tools(s, self.tools)
            if missing:
                # Dimmed as a whole, the reason right after the name and short: a nested row in
                # the side pane has about 30 columns, and the description may not fit at all.
                label = Text.assemble(f"{s.index}. ", s.name, ("  ▸" if s.is_container else ""),
                                      (f" {INACTIVE} needs {', '.join(missing)}", "italic"),
                                      (f"  {s.description}" if s.description else ""), style="dim")
            else:
                label = Text.assemble((f"{s.index}. ", "dim"), (s.name, "bold" if s.is_container else ""),
                                      ("  ▸" if s.is_container else ""),
                                      (f"  {s.description}" if s.description else "", "dim"))
            if s.is_container:
                node = parent.add(label, data=s, expand=True)
            else:
                node = parent.add_leaf(label, data=s)
            nodes[s.name] = node
        for e in tree.errors:
            parent_name = e.chain[-2] if len(e.chain) >= 2 else ""
            parent = nodes.get(parent_name, view.root)
            parent.add_leaf(Text.assemble(("✗ ", "bold red"), (f"{e.name} ({e.kind})", "red")), data=e)
        view.root.expand()
        if keep in nodes:
            node = nodes[keep]
            self._read(node.data)
            # Node lines exist once the tree has been laid out again.
            view.call_after_refresh(view.move_cursor, node)

    @on(Tree.NodeHighlighted, "#prompt-sections")
    def _highlighted(self, event: Tree.NodeHighlighted[Any]) -> None:
        self._read(event.node.data)

    def _read(self, data: Any) -> None:
        from aiops.prompts.tree import PromptError, Section

        body = self.query_one("#prompt-body", Static)
        if isinstance(data, Section):
            self.selected = data
            text = data.body or "(empty)"
            if data.is_container:
                text += f"\n\n[contains: {', '.join(data.children) or 'nothing yet'}]"
            head = f"{data.name}: {data.description}\n" if data.description else ""
            condition = self._condition(data)
            if head or condition:
                head += f"{condition}{'─' * 20}\n"
            body.update(Content(head + text))
        elif isinstance(data, PromptError):
            self.selected = None
            body.update(Content(f"✗ {data.kind}\n{data.message}\n\nchain: {' > '.join(data.chain)}"))
        else:
            self.selected = None
            body.update(Content(self.tree_data.main if self.tree_data else ""))

    def _condition(self, section: Section) -> str:
        """What a section's `[REQUIRES ...]` means now, as a line for the reader ("" without one)."""
        missing = () if self.tree_data is None else self.tree_data.missing_tools(section, self.tools)
        if missing:
            return (f"inactive: needs {', '.join(missing)} (not registered); "
                    "left out of the prompt\n")
        if section.requires and self.tools is not None:
            return f"requires {', '.join(section.requires)} (registered)\n"
        return ""

    def action_edit(self) -> None:
        s = self.selected
        if s is None or self.folder is None:
            self.notify("select a section to edit", timeout=3)
            return
        if s.is_container:
            self.notify(f"{s.name} is a container; edit one of its sections", severity="warning", timeout=4)
            return
        self.post_message(self.EditRequested(self.folder, s.name, s.body))

    def action_reload(self) -> None:
        self.post_message(self.ReloadRequested())
