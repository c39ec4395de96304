"""How often the answer on screen is drawn, and why the operator's keys come first.

Each draw of a growing answer that adds a line lays the whole screen out again (Textual has no
partial layout): 20-100 ms a frame on a 2-core machine with a long answer on screen. Drawn as
often as text came in (every 30 ms batch of the outbox), the frames took most of the loop, and a
key typed meanwhile waited behind one or two of them (keypress → screen p50 ~80 ms, p99 ~170 ms;
docs/PERFORMANCE.md). So the answer on screen is drawn at most every `DRAW_GAP` — ten times a
second still reads as a stream — and, while the operator types (a key in the last
`TYPING_WINDOW`), at most every `TYPING_GAP`, so keys find the loop free. What comes in between
waits in the answer's stream and goes in with the next draw: nothing is dropped, and the last
text is drawn when the turn ends (`AssistantMessage.finish`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

DRAW_GAP = 0.1
TYPING_GAP = 0.5
TYPING_WINDOW = 0.6


class AnswerPacing:
    """The console's pace for drawing answers: `key()` when the operator presses one, `gap()` for
    how long an answer's stream waits before its next draw."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._typed_at = -math.inf

    def key(self) -> None:
        self._typed_at = self._clock()

    def since_key(self) -> float:
        """Seconds since the operator last pressed a key."""
        return self._clock() - self._typed_at

    def typing(self) -> bool:
        return self._clock() - self._typed_at < TYPING_WINDOW

    def gap(self) -> float:
        return TYPING_GAP if self.typing() else DRAW_GAP
