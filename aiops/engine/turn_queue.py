"""Each session's turns, one at a time: each turn runs as a task of its own (so a stop cancels
exactly that turn), which starts the task of the turn queued after it; and every turn ends with its
`done` however it ends — run, crashed, or dropped from the queue before it began."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from aiops.engine import events as ev
from aiops.engine.turn import Turn, TurnHost, TurnResult, TurnRunner

if TYPE_CHECKING:
    from aiops.engine.sessions import LiveSession

log = logging.getLogger(__name__)


class TurnQueue:
    def __init__(self, host: TurnHost) -> None:
        self._host = host

    def enqueue(self, live: LiveSession, turn: Turn) -> bool:
        """Queue `turn` on its session, starting a task for the session's next turn if none runs.
        True when it waits behind the turn running now."""
        live.queue.append(turn)
        if live.worker is None or live.worker.done():
            self._start(live)
            return False
        return live.current is not None

    def _start(self, live: LiveSession) -> None:
        # One task per turn, which runs the runner itself (a worker task that started a task per
        # turn cost two task hops before a turn's first step, and a shielded wait per turn). The
        # turn stays queued until the task begins, as before: a stop or a drop meanwhile finds it
        # there. (It inherits the caller's context, an admission included, closed by the time its
        # turn runs: it is not part of taking in the message.)
        live.worker = asyncio.get_running_loop().create_task(self._work(live),
                                                             name=f"aiops-turn-{live.queue[0].id}")

    async def _work(self, live: LiveSession) -> None:
        """Run the session's next queued turn as this task; then hand the session to a task for
        the turn queued after it, if any."""
        while live.queue and live.deleting is not None:
            # Queued by a submit that had the session in hand as the delete began.
            self.drop(live, live.queue[0])
        if not live.queue:
            return  # dropped before it began
        turn = live.queue.popleft()
        live.current = turn
        turn.task = asyncio.current_task()  # a stop cancels this task: the runner handles it
        try:
            result = await TurnRunner(self._host, live, turn).run()
        except asyncio.CancelledError:
            # Cancelled past the runner's own handling (cancelled again while it recorded how the
            # turn ended): its waiters must still hear that it ended, and the queue go on.
            if not turn.future.done():
                turn.future.set_result(TurnResult(turn.id, "cancelled", turn.prefix))
            self._next(live)
            raise
        except Exception as e:  # noqa: BLE001
            result = self._crashed(live, turn, e)
        if not turn.future.done():
            turn.future.set_result(result)
        self._next(live)

    def _next(self, live: LiveSession) -> None:
        live.current = None
        if live.queue:
            self._start(live)

    def _crashed(self, live: LiveSession, turn: Turn, e: Exception) -> TurnResult:
        """End a turn whose runner failed outside its own error handling (the store refusing its
        error record, say) as the runner ends any failed turn: an `error`, then the `done` every
        client waiting on it needs, and its session idle again rather than "running" for good."""
        log.error("turn %s crashed", turn.id, exc_info=e)
        error = {"code": "internal_error", "message": f"{type(e).__name__}: {e}"}
        result = TurnResult(turn.id, "error", turn.prefix, error)
        self._host.bus.publish(ev.error_event(live.id, error["code"], error["message"], turn.id))
        self._host.bus.publish(result.done_event(live.id, turn.model or live.model_key(self._host)))
        live.state = "idle"
        self._host.session_changed(live)
        return result

    def drop(self, live: LiveSession, turn: Turn) -> bool:
        """Take a turn that has not started out of its session's queue, as cancelled. Its `done`
        is published all the same: readers waiting for that turn (a proxy request, an SSE client)
        would otherwise wait for good."""
        if turn not in live.queue:
            return False
        live.queue.remove(turn)
        result = TurnResult(turn.id, "cancelled", "")
        if not turn.future.done():
            turn.future.set_result(result)
        self._host.bus.publish(result.done_event(live.id, turn.model or live.model_key(self._host)))
        return True

    def stop(self, live: LiveSession, *, clear_queue: bool = False, by: str = "stop") -> bool:
        """Cancel the session's running turn (its pending gates too, `by` saying why in their
        record); with `clear_queue`, drop its queued ones. False when nothing was stopped."""
        if clear_queue:
            for t in list(live.queue):
                self.drop(live, t)
        # The running turn; or, when none runs yet, the one its worker is about to start (just
        # submitted: a stop right after Enter must not let it run).
        turn = live.current or (live.queue[0] if live.queue else None)
        # A turn already being stopped is not stopped again: only the stop that ended it says so.
        if turn and not (turn.task and turn.task.done()) and not turn.stop_requested:
            turn.stop_requested = True
            # Gates first, as a stop (not as a side effect of the cancelled wait), so they are
            # attributed to the stop and the turn can say how many it cancelled.
            turn.cancelled_gates += self._host.cancel_turn_gates(turn.id, by=by)
            if turn.started and turn.task:
                turn.task.cancel()
            # else its runner finds stop_requested as it begins: a task cancelled before its first
            # step would end without recording anything or publishing its `done`.
            return True
        return False

    async def shutdown(self, sessions: list[LiveSession]) -> list[tuple[str, Turn]]:
        """Stop every session's running turn (waiting up to 10 s for each to record how it ended)
        and drop its queued ones, which end as cancelled (their waiters and readers are answered).
        Returns the dropped turns, by session."""
        turns = [live.current.task for live in sessions
                 if live.current is not None and live.current.task is not None]
        dropped: list[tuple[str, Turn]] = []
        for live in sessions:
            for t in list(live.queue):
                if self.drop(live, t):
                    dropped.append((live.id, t))
            if live.current and live.current.task:
                # Its gates say why they closed (not that a task was cancelled somewhere).
                self._host.cancel_turn_gates(live.current.id, by="shutdown")
                live.current.stop_requested = True
                if live.current.started:  # else its runner ends it as it begins (see stop)
                    live.current.task.cancel()
        if turns:
            await asyncio.wait(turns, timeout=10)
        return dropped
