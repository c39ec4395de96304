"""Every key binding of the console, in one registry.

Each binding has a stable id (what `[console] keymap` in aiops.toml overrides), default keys, the
action it runs, a short description for the footer and a tooltip. Panes build their `BINDINGS`
from here, F1 help and the command palette read the same list, and docs/CONSOLE.md documents it,
so none of them can drift from what the keys really do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from textual.binding import Binding, BindingType

# Panes, in the order the palette lists them after the focused one.
PANES: dict[str, str] = {
    "global": "Everywhere",
    "input": "Input",
    "chat": "Chat",
    "sessions": "Sessions",
    "gates": "Gates inbox",
    "prompt": "Prompt tree",
    "limits": "Rate limits",
    "log": "Log",
}


@dataclass(frozen=True, slots=True)
class KeySpec:
    id: str
    keys: str  # comma-separated, Textual key names
    action: str
    description: str  # short: palette title
    tooltip: str  # one sentence: footer tooltip, palette help, F1 help
    pane: str
    show: bool = True  # in the footer
    priority: bool = False
    palette: bool = True  # offered in the command palette
    label: str = ""  # the footer's word for it when shorter than the description

    def binding(self) -> Binding:
        return Binding(self.keys, self.action, self.label or self.description, show=self.show,
                       priority=self.priority, tooltip=self.tooltip, id=self.id)


KEYS: tuple[KeySpec, ...] = (
    # -- everywhere --
    # The footer shows the focused pane's keys, then these in this order, as many as fit.
    KeySpec("app.focus_input", "i", "focus_input", "Type",
            "Put the cursor in the message input", "global"),
    KeySpec("app.jump_gate", "ctrl+g", "jump_gate", "Oldest gate",
            "Jump to the oldest pending gate in the inbox; answering it brings you back", "global",
            priority=True, label="Gate"),
    KeySpec("app.help", "f1", "help", "Help", "Explain the focused pane and list its keys", "global",
            priority=True),
    KeySpec("app.new_session", "ctrl+n", "new_session", "New session",
            "Open a new console session (or stay on the one shown, while it is still empty) and put "
            "the cursor in the input", "global", priority=True,
            label="New"),
    KeySpec("app.quit", "ctrl+q", "quit", "Quit",
            "Quit aiops: running turns are cancelled and recorded, the server stops", "global",
            priority=True),
    # The footer shows the palette key at its right edge by itself.
    KeySpec("app.palette", "ctrl+p", "command_palette", "Palette",
            "Open the command palette; the focused pane's actions come first", "global", priority=True,
            palette=False, show=False),
    KeySpec("app.toggle_sessions", "f2", "toggle_sessions", "Sessions",
            "Show or hide the sessions pane", "global", show=False, priority=True),
    KeySpec("app.toggle_side", "f3", "toggle_side", "Side",
            "Show or hide the side pane (gates, prompt tree, rate limits, log)", "global", show=False,
            priority=True),
    KeySpec("app.next_side_tab", "f5", "next_side_tab", "Next tab",
            "Cycle the side pane: gates, prompt tree, rate limits, log", "global", show=False,
            priority=True),
    KeySpec("app.next_pane", "f6", "next_pane", "Next pane",
            "Move to the next of sessions, input, transcript and side pane (F5 picks the side tab; on "
            "narrow terminals: show the next pane)", "global", show=False,
            priority=True),
    KeySpec("app.previous_pane", "shift+f6", "previous_pane", "Previous pane",
            "Move to the previous of sessions, input, transcript and side pane", "global", show=False,
            priority=True),
    KeySpec("app.narrower", "alt+left", "resize(-4)", "Narrower",
            "Make the focused side pane narrower (the sessions pane while typing)", "global", show=False,
            priority=True),
    KeySpec("app.wider", "alt+right", "resize(4)", "Wider",
            "Make the focused side pane wider (the sessions pane while typing)", "global", show=False,
            priority=True),
    # Not in the footer: the banner names this key itself, while it is there.
    KeySpec("app.hide_guidance", "f4", "hide_guidance", "Model warning",
            "Hide the model warning above the chat, or show it again (F1 shows it whole)", "global",
            show=False, priority=True),
    # -- the input --
    # The input handles its own keys in order with the characters typed before them (a priority
    # binding would run before earlier keystrokes reached the text); see ChatInput._on_key.
    KeySpec("input.send", "enter", "send", "Send",
            "Send the message (lines starting with ! are commands, @model picks a model for one turn)",
            "input"),
    KeySpec("input.newline", "shift+enter,ctrl+j,alt+enter", "newline", "Newline",
            "Insert a line break; ctrl+j works in every terminal, shift+enter where the terminal sends it",
            "input", show=False),
    KeySpec("input.cancel", "escape", "cancel", "Cancel turn",
            "Cancel the running turn of this session and put its prompt back in the input", "input",
            label="Cancel"),
    KeySpec("input.complete", "tab", "complete", "Complete",
            "Complete the !command or @model under the cursor (with nothing to complete, tab stays in "
            "a non-empty input; F6 moves on)", "input", show=False),
    KeySpec("input.clear", "ctrl+l", "clear_draft", "Clear draft",
            "Clear the whole draft, every line of it (ctrl+z brings it back)", "input", show=False),
    # -- the chat --
    KeySpec("chat.earlier", "e", "load_earlier", "Earlier",
            "Load earlier messages of this session", "chat"),
    KeySpec("chat.details", "t", "toggle_details", "Details",
            "Expand or collapse every thinking and tool-call block", "chat"),
    KeySpec("chat.bottom", "end", "bottom", "Bottom",
            "Scroll to the newest message and follow the conversation again", "chat"),
    # -- sessions --
    KeySpec("sessions.open", "enter", "select", "Open",
            "Show the highlighted session in the chat pane", "sessions"),
    KeySpec("sessions.new", "n", "new", "New", "Open a new console session", "sessions"),
    KeySpec("sessions.stop", "x", "stop", "Stop turn",
            "Cancel the running turn of the highlighted session", "sessions", label="Stop"),
    # -- gates --
    KeySpec("gates.approve", "a", "approve", "Approve",
            "Approve the highlighted gate once", "gates"),
    KeySpec("gates.approve_session", "s", "approve_session", "Approve session",
            "Approve it and let the same tool, operation, tables (and SQL statement kinds) through for the "
            "rest of the session",
            "gates", label="Session"),
    KeySpec("gates.deny", "d", "deny", "Deny",
            "Deny the highlighted gate; the model is told it was not allowed", "gates"),
    KeySpec("gates.deny_stop", "x", "deny_stop", "Deny+stop",
            "Deny the highlighted gate and cancel the turn that asked", "gates"),
    KeySpec("gates.details", "enter", "details", "Details",
            "Open the gate: full arguments, SQL highlighted, what the session was doing", "gates",
            label="Open"),
    # -- prompt tree --
    KeySpec("prompt.edit", "e", "edit", "Edit",
            "Edit the selected section and save it through the prompt-tree engine", "prompt"),
    KeySpec("prompt.reload", "r", "reload", "Reload", "Re-read the prompt files from disk", "prompt"),
    # -- rate limits --
    KeySpec("limits.enable", "e", "enable", "Re-enable",
            "Re-enable the highlighted tool type for its session (auto-disabled after exceeding)",
            "limits"),
    KeySpec("limits.refresh", "r", "refresh", "Refresh", "Read the usage again", "limits",
            show=False),
    # -- log --
    KeySpec("log.clear", "c", "clear", "Clear", "Clear the log view (the log file keeps everything)",
            "log"),
)

BY_ID: dict[str, KeySpec] = {k.id: k for k in KEYS}


def bindings_for(pane: str) -> list[BindingType]:
    # Typed as Textual's BINDINGS are, so a widget's BINDINGS = bindings_for(...) overrides them.
    return [k.binding() for k in KEYS if k.pane == pane]


def specs_for(pane: str) -> list[KeySpec]:
    return [k for k in KEYS if k.pane == pane]


def unknown_ids(keymap: Mapping[str, str]) -> list[str]:
    return sorted(set(keymap) - set(BY_ID))


def keys_of(spec: KeySpec, keymap: Mapping[str, str]) -> str:
    """The keys in effect for a binding after the user's keymap."""
    return keymap.get(spec.id, spec.keys)


_SHORT = {"escape": "esc"}


def display_keys(keys: str) -> str:
    return " / ".join(_SHORT.get(k.strip(), k.strip()) for k in keys.split(",") if k.strip())


def first_key(binding_id: str, keymap: Mapping[str, str]) -> str:
    """The first key in effect for a binding (what prose and hints name)."""
    keys = keys_of(BY_ID[binding_id], keymap)
    return next((k.strip() for k in keys.split(",") if k.strip()), keys)


_PLACEHOLDER = re.compile(r"\{([a-z_]+\.[a-z_]+)\}")


def render_help(text: str, keymap: Mapping[str, str]) -> str:
    """Help text with each `{binding.id}` replaced by the keys in effect for it, so that help never
    names a key the user's keymap moved."""

    def key(m: re.Match[str]) -> str:
        spec = BY_ID.get(m.group(1))
        return display_keys(keys_of(spec, keymap)) if spec is not None else m.group(0)

    return _PLACEHOLDER.sub(key, text)


def pane_help(widget: object, default: str) -> str:
    """The help text F1 shows: that of the pane holding `widget` (the nearest ancestor with a PANE
    and a HELP), else `default` (the console's overview)."""
    node: Any = widget
    while node is not None:
        if isinstance(getattr(node, "PANE", None), str) and getattr(node, "HELP", None):
            return str(node.HELP)
        node = node.parent
    return default
