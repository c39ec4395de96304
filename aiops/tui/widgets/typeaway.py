"""Letters typed into a list whose letter keys act were meant for the message input.

The gates inbox and the sessions list answer single letters (approve, deny, new session, stop). A
message typed while one of them has the focus would fire those; instead, a printable key that is
none of the list's bindings goes to the input, and the App moves the focus there with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.message import Message

if TYPE_CHECKING:
    from textual import events
    from textual.widget import Widget


class TypedAway(Message):
    """A printable key that is no key of the pane it was typed in: the operator meant to type a
    message. The App inserts `character` in the input and focuses it."""

    def __init__(self, character: str) -> None:
        super().__init__()
        self.character = character


class TypesAway:
    """Mixin for a focusable widget (first among its bases): printable keys that are not its
    bindings become `TypedAway`.

    `typing_away` True sends every printable key (bindings included) to the input, for a pane that
    has handed the operator over to the input and may still get the next keys typed there: one
    terminal read (common over SSH) delivers several keys, all queued for this pane before the App
    has moved the focus for the first. It holds until the pane is focused or blurred again.
    """

    typing_away = False

    def on_key(self, event: events.Key) -> None:
        if not event.is_printable or not event.character:
            return
        widget = cast("Widget", self)
        if not self.typing_away and event.key in widget.screen.active_bindings:
            return
        event.stop()
        event.prevent_default()  # no binding of this pane runs for it
        # The keys already queued behind this one are text too, letters of this pane's bindings
        # included (`a` approving a gate, `n` opening a session in the middle of a word).
        self.typing_away = True
        widget.post_message(TypedAway(event.character))

    def on_focus(self) -> None:
        # Focused again, the operator is back in this pane: its letter keys act again.
        self.typing_away = False

    def on_blur(self) -> None:
        self.typing_away = False
