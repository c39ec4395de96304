"""The message input: multi-line, Enter sends, history, !command and @model completion."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from textual import events
from textual.geometry import Region
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widgets import TextArea

from aiops.tui.keys import BY_ID, bindings_for, display_keys, first_key, keys_of, specs_for

HISTORY_SIZE = 200


class ChatInput(TextArea):
    """Enter sends; shift+enter (or ctrl+j, or alt+enter) inserts a newline."""

    PANE = "input"
    BINDINGS = bindings_for("input")
    HELP = """\
## Input

Type a message for the selected session and press **{input.send}** to send it.

- **{input.newline}** inserts a line break (many terminals, and tmux, send shift+enter as a plain
  enter: ctrl+j works everywhere).
- **up** on the first line and **down** on the last line walk through what you sent before.
- Lines starting with `!` are commands (`!help` lists them); `@model text` sends one turn to
  another model. **{input.complete}** (or **right** at the end) completes a command or model name.
  With nothing to complete it keeps the cursor here while you have typed something (it moves to
  the next pane only from an empty input); **{app.next_pane}** always moves on.
- **{input.clear}** clears the whole draft, every line of it; **ctrl+z** brings it back.
- **{input.cancel}** cancels the running turn of this session and puts its prompt back here.
"""

    busy: reactive[bool] = reactive(False)
    """A turn of the selected session is running (esc cancels it)."""

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class CancelRequested(Message):
        pass

    def __init__(self, **kw: Any) -> None:
        super().__init__(soft_wrap=True, tab_behavior="focus", show_line_numbers=False,
                         highlight_cursor_line=False,
                         placeholder="Message, !command or @model … (F1 for help)", **kw)
        self.sent: list[str] = []
        self._hist_pos: int | None = None
        self._draft = ""
        self.commands: list[str] = []
        self.models: list[str] = []
        self.candidates: list[str] = []

    # -- drawing --

    _could_complete = False  # whether the key bar was last told there is something to complete
    _theme_css_stale = True  # the styles changed since the theme last took them (see render_lines)
    _theme_css_of: object = None  # the theme that took them

    def notify_style_update(self) -> None:
        self._theme_css_stale = True  # every change of CSS comes here: a theme, a pseudo-class, a rule
        super().notify_style_update()

    def render_lines(self, crop: Region) -> list[Strip]:
        """TextArea's, with its theme given the widget's CSS only when that changed: TextArea gives
        it before every render (six component styles, each blending the ancestors' backgrounds),
        and the input renders at every key typed: ~14 % of what a key cost the loop."""
        theme = self._theme
        if theme is not None and (self._theme_css_stale or theme is not self._theme_css_of):
            theme.apply_css(self)
            self._theme_css_stale, self._theme_css_of = False, theme
        return super(TextArea, self).render_lines(crop)

    def on_mount(self) -> None:
        self.border_title = self.title_for(getattr(self.app, "keymap_overrides", {}))

    @staticmethod
    def title_for(keymap: Mapping[str, str]) -> str:
        """The frame's reminder of the keys that matter, after the user's keymap."""
        newline = [k.strip() for k in keys_of(BY_ID["input.newline"], keymap).split(",") if k.strip()]
        # shift+enter reaches few terminals (tmux sends a plain enter): name one that works.
        portable = next((k for k in newline if not k.startswith("shift+")), newline[0] if newline else "")
        return (f"message · {display_keys(first_key('input.send', keymap))} send · {display_keys(portable)} "
                f"newline · {display_keys(first_key('input.cancel', keymap))} cancel")

    # -- keys --

    def _key_actions(self) -> dict[str, str]:
        keymap = getattr(self.app, "keymap_overrides", {})
        actions: dict[str, str] = {}
        for spec in specs_for("input"):
            for key in keys_of(spec, keymap).split(","):
                if key.strip():
                    actions[key.strip()] = spec.action
        return actions

    async def _on_key(self, event: events.Key) -> None:
        """The input's own keys, handled in this widget's queue, so in order with the characters
        typed before them; everything else goes on to TextArea."""
        action = self._key_actions().get(event.key)
        if action is None:
            # A character for TextArea to insert: on the terminal straight after it has, in a
            # frame of the input alone, rather than in the next frame of the whole screen (which
            # lays out an answer streaming in the chat: tens of ms; aiops/tui/pacing.py).
            self.call_next(self._draw_now)
            return
        if not self.check_action(action, ()):
            if action == "complete" and self.text.strip():
                # Tab on text it cannot complete: a half-typed message must not lose the cursor
                # without a word (the screen's tab moves focus on); stay, and say what moves on.
                event.stop()
                event.prevent_default()
                self.border_subtitle = self.nothing_to_complete()
            return
        event.stop()
        event.prevent_default()
        await self.run_action(action)

    def _draw_now(self) -> None:
        draw_now = getattr(self.screen, "draw_now", None)
        if draw_now is not None:
            draw_now(self)

    # -- sending --

    def action_send(self) -> None:
        text = self.text
        if not text.strip():
            return
        self.remember(text)
        self.clear()
        self.post_message(self.Submitted(text))

    def remember(self, text: str) -> None:
        if not self.sent or self.sent[-1] != text:
            self.sent.append(text)
            del self.sent[:-HISTORY_SIZE]
        self._hist_pos = None
        self._draft = ""

    def action_newline(self) -> None:
        self.insert("\n")

    def action_clear_draft(self) -> None:
        """Empty the input, every line of it: one edit, so undo brings the draft back."""
        if self.text:
            self.clear()
        self._hist_pos = None  # what is typed next is a new draft, not an edit of a sent message

    def nothing_to_complete(self) -> str:
        """The hint under the input when tab has nothing to complete (after the user's keymap)."""
        keymap = getattr(self.app, "keymap_overrides", {})
        return (f"nothing to complete · {display_keys(first_key('app.next_pane', keymap))} next pane · "
                f"{display_keys(first_key('input.clear', keymap))} clear")

    def action_cancel(self) -> None:
        self.post_message(self.CancelRequested())

    def put_back(self, text: str) -> None:
        """Restore a prompt (after a cancel), unless the user already typed something new."""
        if self.text.strip():
            return
        self.load_text(text)
        self.move_cursor(self.document.end)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return self.busy
        if action == "complete":
            return bool(self.suggestion)
        return super().check_action(action, parameters)

    def watch_busy(self) -> None:
        self.refresh_bindings()

    # -- history --

    def action_cursor_up(self, select: bool = False) -> None:
        if not select and self.cursor_at_first_line and self.sent:
            if self._hist_pos is None:
                self._draft = self.text
                self._hist_pos = len(self.sent)
            if self._hist_pos > 0:
                self._hist_pos -= 1
                self._show(self.sent[self._hist_pos])
            return
        super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        if not select and self.cursor_at_last_line and self._hist_pos is not None:
            self._hist_pos += 1
            if self._hist_pos >= len(self.sent):
                self._hist_pos = None
                self._show(self._draft)
            else:
                self._show(self.sent[self._hist_pos])
            return
        super().action_cursor_down(select)

    def _show(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    # -- completion --

    def set_completions(self, commands: list[str], models: list[str]) -> None:
        self.commands = sorted(commands)
        self.models = sorted(models)

    def update_suggestion(self) -> None:
        """Called by TextArea after every edit and cursor move: the completion under the cursor."""
        self.suggestion = ""
        self.candidates = self._candidates()
        subtitle = ""
        if self.candidates:
            word = self._word()
            self.suggestion = self.candidates[0][len(word):]
            subtitle = "  ".join(self.candidates[:8]) + (" …" if len(self.candidates) > 8 else "")
        if self.border_subtitle != subtitle:
            self.border_subtitle = subtitle
        # Only whether there is something to complete changes a binding (`check_action`): asked at
        # every key, the key bar worked out its keys again each time (every binding of the focus
        # chain, ~7 % of what a typed key costs the loop). What it was last told is kept apart from
        # `suggestion`, which TextArea shortens or clears itself before it calls here.
        if self.is_mounted and bool(self.suggestion) != self._could_complete:
            self._could_complete = bool(self.suggestion)
            self.refresh_bindings()

    def _word(self) -> str:
        row, col = self.cursor_location
        line = self.document.get_line(row)
        if col < len(line) and not line[col].isspace():
            return ""
        before = line[:col]
        if not before or before[-1].isspace():
            return ""
        word = before.split()[-1]
        # Commands start a line; a model switch starts the message.
        if word.startswith("!") and before.lstrip() == word:
            return word
        if word.startswith("@") and row == 0 and before.lstrip() == word:
            return word
        return ""

    def _candidates(self) -> list[str]:
        word = self._word()
        if not word:
            return []
        if word.startswith("!"):
            names = [f"!{c}" for c in self.commands]
        else:
            names = [f"@{m}" for m in self.models]
        return [n for n in names if n.startswith(word) and n != word]

    def action_complete(self) -> None:
        if self.suggestion:
            self.insert(self.suggestion + " ")
