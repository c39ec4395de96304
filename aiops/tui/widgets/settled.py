"""`Settled`: widgets whose virtual size changes repaint them instead of laying the screen out again."""

from __future__ import annotations

from textual.geometry import Size
from textual.reactive import Reactive


class Settled:
    """A plain mixin (first in a widget's bases) for the widgets of a streamed answer: a change of
    their virtual size repaints rather than lays out again.

    Widget declares `virtual_size` a layout reactive, so every widget whose size a layout changed
    asks for one more layout of the whole screen straight after (a paragraph that gained a line:
    the paragraph, its Markdown, the message and the chat each did). Only scrollbars depend on
    the virtual size, and those are layout reactives of their own (as in GatesInbox)."""

    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)
