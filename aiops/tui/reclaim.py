"""What a chat held, freed once another session is shown.

Textual's widgets hold one another in cycles (a parent its children and each child its parent, a
widget's styles their node, its message queue its pump), so a chat taken off the screen is freed
only by a full run of Python's cyclic collector. The console runs that rarely, on purpose
(`gc_policy`: a high young threshold, the start-up heap frozen; aiops/tui/cycles.py keeps frames
from leaving cycles at all), and a long answer's chat is ~1,700 widgets. A QA pass in tmux found
the console's RSS growing by 45-50 MB at every switch to such a session and away, to 786 MB.

So the console counts the widgets it takes off with a chat, and once they pass `THRESHOLD` it runs
one full collection, once no key has been pressed for `QUIET`: while the operator reads the
session they went to, not while they go from one session to the next or type. It is not short:
~0.3-0.8 s for a long answer's chat on a 2-core machine (the collector walks the ~150,000 objects
such a chat leaves in cycles, and the rest of the heap it has not frozen). Left to itself the
collector would pay the same later, for every chat left since, in one go, at whatever moment its
thresholds came round; or, in a console left mostly idle, not at all.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from textual.app import App
    from textual.timer import Timer

log = logging.getLogger(__name__)

# Widgets taken off before a collection: a long answer's chat, or a few hundred short ones.
THRESHOLD = 1_000
QUIET = 2.0  # seconds without a key before the collection runs


class Reclaim:
    """Counts the widgets removed with a chat and collects once enough are waiting and the
    operator has left the keys alone for a while (`since_key`: seconds since the last one)."""

    def __init__(self, app: App[Any], since_key: Callable[[], float]) -> None:
        self.app = app
        self.since_key = since_key
        self.pending = 0  # widgets removed since the last collection
        self.collections = 0
        self._timer: Timer | None = None

    def removed(self, count: int) -> None:
        self.pending += count
        if self.pending >= THRESHOLD and self._timer is None:
            self._timer = self.app.set_timer(QUIET, self._when_quiet, name="reclaim")

    def _when_quiet(self) -> None:
        if (wait := QUIET - self.since_key()) > 0:
            self._timer = self.app.set_timer(wait, self._when_quiet, name="reclaim")
            return
        self._timer = None
        removed, self.pending = self.pending, 0
        self.collections += 1
        start = time.perf_counter()
        found = gc.collect()
        log.debug("collected %d objects in %.0f ms, %d widgets after switching sessions", found,
                  (time.perf_counter() - start) * 1000, removed)
