"""Engine events on their way to the console's App: text deltas gathered for a short tick, every
other event at once.

Fifty sessions streaming at ~50 tokens/s each make ~2,500 `tok`/`thinking` events a second, and
each one posted as its own Textual message went through the App's queue (the same queue the
operator's keys wait in) and its dispatch. Here the deltas wait at most `TICK` and reach the App
as one batch; adjacent deltas of one turn are merged on the way (`merged_delta`).

Order is kept: any other event (a tool call, a gate, `done`, …) first sends the deltas gathered
so far, then itself, at once — nothing overtakes the text before it, and a gate is never held
back. Only deltas wait, and only for the tick. Plain code on the loop: no widget is touched; the
App's handlers still own every piece of state.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from aiops.engine import events as ev
from aiops.engine.events import Event

# How long a delta may wait for others. The shown session's answer is then drawn ~33 times a
# second at most, which still reads as a smooth stream; a frame of a long chat costs far more
# than the token that caused it (~1.7 ms a token drawn one frame each, docs/PERFORMANCE.md).
TICK = 0.03

Delta = ev.Tok | ev.Thinking


def merged_delta(first: Event, second: Event) -> Event | None:
    """Two adjacent text deltas of one turn as one (for replay buffers and batches); None if they
    differ."""
    if first.turn_id != second.turn_id:
        return None
    if isinstance(first, ev.Tok) and isinstance(second, ev.Tok):
        return dataclasses.replace(first, text=first.text + second.text, ts=second.ts)
    if isinstance(first, ev.Thinking) and isinstance(second, ev.Thinking):
        return dataclasses.replace(first, text=first.text + second.text, ts=second.ts)
    return None


class EventOutbox:
    """Hands events to `post_one` (one event) and `post_deltas` (a batch of deltas, in order)."""

    def __init__(self, post_one: Callable[[Event], None], post_deltas: Callable[[list[Event]], None], *,
                 tick: float = TICK) -> None:
        self._post_one = post_one
        self._post_deltas = post_deltas
        self._tick = tick
        self._deltas: list[Event] = []
        # session id -> the index of its last delta in `_deltas` (the one a new delta may extend)
        self._last: dict[str | None, int] = {}
        self._timer: asyncio.TimerHandle | None = None

    def put(self, event: Event) -> None:
        if not isinstance(event, Delta):
            self.flush()
            self._post_one(event)
            return
        at = self._last.get(event.session_id)
        # Only deltas wait here, so a session's deltas in the batch are adjacent in its own stream.
        merged = merged_delta(self._deltas[at], event) if at is not None else None
        if at is not None and merged is not None:
            self._deltas[at] = merged
        else:
            self._last[event.session_id] = len(self._deltas)
            self._deltas.append(event)
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self._tick, self.flush)
            except RuntimeError:  # no loop running (a synchronous caller): nothing to wait for
                self.flush()

    def flush(self) -> None:
        """Send the deltas gathered so far (at the tick, before any other event, at close)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._deltas:
            batch, self._deltas = self._deltas, []
            self._last.clear()
            self._post_deltas(batch)
